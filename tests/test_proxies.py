"""Zero-cost proxies order networks as their definitions predict, and work as evaluators."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

import einspace as es
from einspace.evaluators.base import Task, run_task
from einspace.evaluators.datasets import load_dataset
from einspace.evaluators.proxies import grad_norm_score, naswot_score, synflow_score

DIGITS = es.input_state((1, 8, 8))


def _dense(d: int) -> str:
    """One fully connected layer of width d over the whole 8x8 image, then a leaky ReLU."""
    return f"(S (M (R1 im2col(k=8, s=8, p=0)) (M (C linear(d={d}))) (R2 col2im)) (M (C leaky_relu)))"


def _conv(d: int) -> str:
    """A 3x3 convolution to d channels, then a leaky ReLU."""
    return f"(S (M (R1 im2col(k=3, s=1, p=1)) (M (C linear(d={d}))) (R2 col2im)) (M (C leaky_relu)))"


def _network(text: str, seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return es.compile_network(es.parse_tree(text), DIGITS, classes=10)


@pytest.fixture(scope="module")
def batch() -> tuple[torch.Tensor, torch.Tensor]:
    data = load_dataset("digits")
    return torch.from_numpy(data.train_x[:64]), torch.from_numpy(data.train_y[:64])


@pytest.mark.parametrize("seed", range(3))
def test_naswot_prefers_networks_that_tell_inputs_apart(batch, seed: int) -> None:
    """More rectifier units give more distinct activation patterns, so a larger log-determinant;
    16 units cannot give 64 inputs independent patterns (singular kernel, -inf)."""
    x, _ = batch
    scores = [naswot_score(_network(_dense(d), seed), x) for d in (16, 128, 256, 1024)]
    assert scores[0] == -math.inf
    assert scores[1] < scores[2] < scores[3]


def test_naswot_of_a_network_that_collapses_its_inputs(batch) -> None:
    """A network that zeroes its input gives every example the same pattern: -inf, the minimum."""
    x, _ = batch
    collapse = nn.Sequential(nn.Linear(64, 1024), nn.LeakyReLU())
    with torch.no_grad():
        collapse[0].weight.zero_()
    keep = nn.Sequential(nn.Linear(64, 1024), nn.LeakyReLU())
    flat = x.flatten(1)
    assert naswot_score(collapse, flat) == -math.inf < naswot_score(keep, flat)


@pytest.mark.parametrize("seed", range(3))
def test_synflow_and_grad_norm_grow_with_width(batch, seed: int) -> None:
    narrow, wide = _conv(16), _conv(64)
    assert synflow_score(_network(narrow, seed), (1, 8, 8)) < synflow_score(_network(wide, seed), (1, 8, 8))
    assert grad_norm_score(_network(narrow, seed), *batch) < grad_norm_score(_network(wide, seed), *batch)


def test_synflow_is_data_free_and_exact_for_a_linear_chain() -> None:
    """For out = W2 (W1 x) with positive weights and x = 1, each parameter's term θ·∂R/∂θ sums
    to R per layer (Euler's theorem for the homogeneous map): synflow = 2·R without biases."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4, bias=False), nn.Linear(4, 2, bias=False))
    with torch.no_grad():
        r = model[1].weight.abs().sum(0) @ model[0].weight.abs().sum(1)
    assert synflow_score(model, (3,)) == pytest.approx(2 * float(r))


@pytest.mark.parametrize("proxy", ["naswot", "synflow", "grad_norm"])
def test_proxies_as_evaluators_are_deterministic(proxy: str) -> None:
    task = Task(_dense(256), "einspace", (1, 8, 8), proxy, {"dataset": "digits"}, random_seed=3)
    first, again = run_task(task), run_task(task)
    assert first.ok, first.error
    assert math.isfinite(first.fitness) and first.fitness == again.fitness
    assert first.metrics[proxy] > 0


def test_proxy_failures_are_results() -> None:
    singular = run_task(Task(_dense(16), "einspace", (1, 8, 8), "naswot", {}, random_seed=0))
    assert not singular.ok and "share an activation pattern" in singular.error
    linear_only = "(S (M (C linear(d=16))) (M (C norm)))"
    no_rectifier = run_task(Task(linear_only, "einspace", (1, 8, 8), "naswot", {}, random_seed=0))
    assert not no_rectifier.ok and "rectifier" in no_rectifier.error
    budget = run_task(Task(_dense(256), "einspace", (1, 8, 8), "synflow", {"max_params": 100}))
    assert not budget.ok and "over budget" in budget.error
    data_free = run_task(Task(_dense(256), "einspace", (3, 8, 8), "synflow", {"dataset": None, "classes": 5}))
    assert data_free.ok, data_free.error


def test_run_task_checks_the_tree_once_and_hands_it_on(monkeypatch: pytest.MonkeyPatch) -> None:
    from einspace.checker import _Checker

    checks = []
    start = _Checker.__init__
    monkeypatch.setattr(_Checker, "__init__", lambda self, *args: checks.append(args) or start(self, *args))
    result = run_task(Task(_dense(256), "einspace", (3, 8, 8), "synflow", {"dataset": None, "classes": 5}))
    assert result.ok, result.error
    assert len(checks) == 1 and result.metrics["params"] == (3 * 64 + 1) * 256

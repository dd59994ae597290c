"""Budgets from analytic counts agree with instantiated networks, and name the limit a tree breaks."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import einspace as es
from einspace.errors import EinspaceError
from einspace.evaluators.budgets import (
    Budget,
    activation_bytes,
    activation_values,
    budget_violation,
    head_params,
)
from einspace.ops._modules import Clone, GroupDim

SMALL = (
    "(S (M (R1 im2col(k=3, s=1, p=1)) (M (C linear(d=16))) (R2 col2im)) (M (M (C norm)) (M (C leaky_relu))))"
)


@pytest.fixture(scope="module")
def paper():
    return es.load_grammar("einspace")


def _measured_activations(tree: es.CheckedTree) -> int:
    """Values in the outputs of every leaf module for one example, by forward hooks on the
    literal (unlowered) backbone; branching modules return views/references and are skipped."""
    backbone = es.compile_backbone(tree, lower=False)
    total = 0

    def hook(module: nn.Module, inputs: tuple, output: torch.Tensor | list[torch.Tensor]) -> None:
        nonlocal total
        outputs = output if isinstance(output, (list, tuple)) else [output]
        total += sum(o[0].numel() for o in outputs)

    for module in backbone.modules():
        if not list(module.children()) and not isinstance(module, (Clone, GroupDim, nn.Identity)):
            module.register_forward_hook(hook)
    state = tree.input[0]
    with torch.no_grad():
        backbone(torch.randn(1, *state.shape))
    return total


def test_activation_values_by_hand(paper) -> None:
    x = es.input_state((3, 8, 8))
    checked = es.check_tree(es.parse_tree(SMALL), paper, x)
    # im2col: 64 x 27; linear: 64 x 16; col2im, norm, leaky_relu: 16 x 8 x 8 each
    assert activation_values(checked) == 64 * 27 + 64 * 16 + 3 * 16 * 64
    assert activation_bytes(checked, batch_size=10) == (3 * 64 + activation_values(checked)) * 10 * 4


@pytest.mark.parametrize("seed", range(12))
def test_activation_values_match_instantiated_tensors(paper, seed: int) -> None:
    """Sampled trees (branches, repeats, routing) at a small input: analytic == measured."""
    x = es.input_state((3, 16, 16))
    limits = es.Limits(max_params=100_000, max_nodes=150)
    checked = es.check_tree(es.sample_tree(paper, x, random_seed=seed, limits=limits), paper, x)
    if activation_values(checked) > 5_000_000:
        pytest.skip("too large to run quickly")
    assert activation_values(checked) == _measured_activations(checked)


@pytest.mark.parametrize("seed", [0, 3])
def test_network_params_with_head_match_torch(paper, seed: int) -> None:
    x = es.input_state((3, 16, 16))
    tree = es.sample_tree(paper, x, random_seed=seed, limits=es.Limits(max_params=50_000, max_nodes=100))
    checked = es.check_tree(tree, paper, x)
    network = es.compile_network(checked, classes=7)
    assert checked.params + head_params(checked, 7) == sum(p.numel() for p in network.parameters())


def test_budget_violations_name_the_limit(paper) -> None:
    checked = es.check_tree(es.parse_tree(SMALL), paper, es.input_state((3, 8, 8)))
    network_params = checked.params + head_params(checked, 10)
    assert budget_violation(checked, Budget()) is None
    assert budget_violation(checked, Budget(max_params=checked.params)) is None
    assert "backbone parameters exceed the budget of 10" in budget_violation(checked, Budget(max_params=10))
    within = Budget(max_params=checked.params, classes=10)
    assert f"{network_params:,} network parameters" in budget_violation(checked, within)
    assert "FLOPs per example exceed" in budget_violation(checked, Budget(max_flops=checked.flops - 1))
    memory = activation_bytes(checked, 256) / 2**20
    assert budget_violation(checked, Budget(max_activation_mb=memory, batch_size=256)) is None
    reason = budget_violation(checked, Budget(max_activation_mb=memory * 0.99, batch_size=256))
    assert "MiB of activations for a batch of 256" in reason


@pytest.mark.parametrize(
    "values, message",
    [
        ({"max_params": -1}, "max_params must be a non-negative"),
        ({"batch_size": 0}, "batch_size must be a positive integer"),
        ({"classes": 0}, "classes must be positive"),
    ],
)
def test_bad_budgets_are_errors(values: dict, message: str) -> None:
    with pytest.raises(EinspaceError, match=message):
        Budget(**values)


def test_budget_from_settings_ignores_other_keys() -> None:
    budget = Budget.from_settings({"max_flops": 5, "epochs": 3, "max_params": None})
    assert budget == Budget(max_flops=5) and not budget.unlimited and Budget().unlimited

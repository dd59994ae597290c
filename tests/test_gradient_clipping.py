"""Gradient clipping (`max_grad_norm`, einspace.evaluators.optim.Optimizers): every step is
compared with plain SGD on gradients scaled by hand; the share of clipped steps is counted
at the boundary (a norm equal to the limit is not clipped); through the evaluator the setting
reaches training and its metric, and bad values are refused."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from einspace.errors import EinspaceError
from einspace.evaluators.base import Task, run_task
from einspace.evaluators.optim import Optimizers, build_optimizer
from einspace.evaluators.training import TrainingSettings

CONV = "(S (R1 im2col(k=3, s=1, p=1)) (M (C linear(d=16))) (R2 col2im))"


def _sgd(model: nn.Module, max_grad_norm: float | None = None) -> Optimizers:
    """Plain SGD at lr 0.5 (no momentum, decay or schedule), as training settings build it."""
    plain = TrainingSettings(
        lr=0.5, momentum=0.0, weight_decay=0.0, schedule="constant", max_grad_norm=max_grad_norm
    )
    return build_optimizer(model, steps_per_epoch=4, epochs=2, **plain.optimizer_options())


def _step(optimizers: Optimizers, model: nn.Linear, weight_grad: list[float], bias_grad: float) -> None:
    """One step with the gradients set by hand: weight (1 x 2, group `weights`) and bias (group
    `norm_bias`), so that the norm is over both groups together."""
    optimizers.zero_grad()
    model.weight.grad = torch.tensor([weight_grad])
    model.bias.grad = torch.tensor([bias_grad])
    optimizers.step()


@pytest.mark.parametrize("limit", [None, 1.0, 2.0, 13.0, 100.0])
def test_a_step_scales_all_groups_gradients_together_down_to_the_limit(limit: float | None) -> None:
    model = nn.Linear(2, 1)
    before = torch.cat([model.weight.detach().flatten(), model.bias.detach()]).clone()
    optimizers = _sgd(model, max_grad_norm=limit)
    assert {group["name"] for group in optimizers.param_groups} == {"weights", "norm_bias"}
    _step(optimizers, model, [3.0, 4.0], 12.0)  # norm 13 over both groups; 5 over the weight alone
    after = torch.cat([model.weight.detach().flatten(), model.bias.detach()])
    factor = 1.0 if limit is None else min(1.0, limit / 13.0)
    expected = before - 0.5 * factor * torch.tensor([3.0, 4.0, 12.0])
    torch.testing.assert_close(after, expected, rtol=1e-5, atol=1e-6)


def test_the_share_of_clipped_steps_counts_norms_above_the_limit_only() -> None:
    model = nn.Linear(2, 1)
    optimizers = _sgd(model, max_grad_norm=5.0)
    assert optimizers.clipped_share() is None  # no step yet
    for weight_grad in ([3.0, 4.0], [6.0, 8.0], [0.3, 0.4], [30.0, 40.0]):  # norms 5, 10, 0.5, 50
        _step(optimizers, model, weight_grad, 0.0)
    assert optimizers.clipped_share() == pytest.approx(2 / 4)  # 5 is the limit itself: not clipped
    assert _sgd(nn.Linear(2, 1)).clipped_share() is None  # no clipping asked for


def test_clipping_under_a_grad_scaler_clips_the_unscaled_gradients() -> None:
    """Under float16 the loss is scaled before backward: the limit applies to the true gradients."""
    plain, scaled = nn.Linear(2, 1), nn.Linear(2, 1)
    scaled.load_state_dict(plain.state_dict())
    x = torch.tensor([[30.0, 40.0]])
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    plain_opt, scaled_opt = _sgd(plain, max_grad_norm=1.0), _sgd(scaled, max_grad_norm=1.0)
    plain(x).sum().backward()
    plain_opt.step()
    scaler.scale(scaled(x).sum()).backward()
    scaled_opt.step(scaler)
    scaler.update()
    torch.testing.assert_close(scaled.weight, plain.weight)
    torch.testing.assert_close(scaled.bias, plain.bias)
    assert plain_opt.clipped_share() == scaled_opt.clipped_share() == 1.0


def _train(**settings: Any) -> dict[str, float]:
    base = {"dataset": "digits", "epochs": 1, "batch_size": 64, "train_subset": 256, "valid_subset": 128}
    result = run_task(Task(CONV, "einspace", (1, 8, 8), "training", {**base, **settings}, mode="im"))
    assert result.ok, result.error
    return result.metrics


def test_the_setting_reaches_training_and_reports_the_share_of_clipped_steps() -> None:
    assert "clipped_steps" not in _train()  # the paper's recipe: no clipping, nothing reported
    assert _train(max_grad_norm=1e-9)["clipped_steps"] == 1.0
    assert _train(max_grad_norm=1e9)["clipped_steps"] == 0.0
    # clipping every step to a tiny norm leaves the network near where it started
    unclipped, frozen = _train(), _train(max_grad_norm=1e-9)
    assert not math.isclose(unclipped["train_loss"], frozen["train_loss"])
    assert "clipped_steps" not in _train(epochs=0)  # the look at 0 epochs takes no step


@pytest.mark.parametrize("value", [0, -1.0, "1", True])
def test_a_bad_max_grad_norm_is_refused(value: Any) -> None:
    with pytest.raises(EinspaceError, match="setting max_grad_norm must be positive or null"):
        TrainingSettings(max_grad_norm=value)


def test_einspace_evaluate_takes_max_grad_norm(tmp_path: Path, capsys) -> None:
    from einspace.cli import main

    (tmp_path / "conv.tree").write_text(CONV + "\n")
    base = ["evaluate", str(tmp_path / "conv.tree"), "--epochs", "1", "--device", "cpu", "--json"]
    assert main([*base, "--max-grad-norm", "1e-9"]) == 0
    assert json.loads(capsys.readouterr().out.split("\n", 1)[1])["clipped_steps"] == 1.0
    assert main(base) == 0
    assert "clipped_steps" not in json.loads(capsys.readouterr().out.split("\n", 1)[1])

"""Optimiser groups (einspace.evaluators.optim): grouping, per-group settings, schedules, refusals.

Written in the mutation-testing round (scripts/mutation.py): learning rates per step are compared
with the formulas computed by hand, steps with plain torch optimisers, and every refusal with its
boundary (0 accepted, negative refused; betas 0 accepted, 1 refused; a name at the typo cutoff).
"""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
from torch import nn

from einspace.errors import EinspaceError
from einspace.evaluators.optim import (
    Optimizers,
    build_optimizer,
    check_param_groups,
    parameter_groups,
    parameter_kind,
)
from einspace.ops.trainable import mark_architecture


class Cell(nn.Module):
    """One architecture parameter (`alpha`, marked), one weight and one bias."""

    def __init__(self) -> None:
        super().__init__()
        self.alpha = nn.Parameter(torch.ones(2))
        self.weight = nn.Parameter(torch.ones(2))
        self.bias = nn.Parameter(torch.ones(2))
        mark_architecture(self, "alpha")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.weight * self.alpha + self.bias


def _build(model: nn.Module, **changes: Any) -> Optimizers:
    settings: dict[str, Any] = dict(
        lr=0.5, momentum=0.0, weight_decay=0.0, nesterov=False, schedule="constant",
        milestones=(), gamma=0.1, steps_per_epoch=4, epochs=2,
    )  # fmt: skip
    return build_optimizer(model, **{**settings, **changes})


def _lrs(optimizers: Optimizers, steps: int, kind: str) -> list[float]:
    """The learning rate of group `kind` at steps 0 .. steps-1."""
    seen = []
    for _ in range(steps):
        seen.append(optimizers.learning_rates()[kind])
        optimizers.step()
        optimizers.schedule_step()
    return seen


@pytest.mark.parametrize(
    "module, name, kind",
    [
        (nn.BatchNorm1d(2), "weight", "norm_bias"),
        (nn.BatchNorm2d(2), "weight", "norm_bias"),
        (nn.LayerNorm(2), "weight", "norm_bias"),
        (nn.GroupNorm(1, 2), "weight", "norm_bias"),
        (nn.Linear(2, 2), "bias", "norm_bias"),
        (nn.Linear(2, 2), "weight", "weights"),
        (nn.InstanceNorm2d(2, affine=True), "weight", "weights"),  # not among the norms
    ],
)
def test_parameter_kind_by_module_and_name(module: nn.Module, name: str, kind: str) -> None:
    assert parameter_kind(module, name, getattr(module, name)) == kind


def test_a_declared_group_wins_over_the_module_and_an_empty_one_does_not() -> None:
    linear = nn.Linear(2, 2)
    linear.weight.einspace_group = "slow"
    linear.bias.einspace_group = ""
    assert parameter_kind(linear, "weight", linear.weight) == "slow"
    assert parameter_kind(linear, "bias", linear.bias) == "norm_bias"
    cell = Cell()
    cell.alpha.einspace_group = "slow"  # the module's declaration comes first
    assert parameter_kind(cell, "alpha", cell.alpha) == "architecture"


def test_parameter_groups_skip_frozen_and_count_shared_parameters_once() -> None:
    first, second = nn.Linear(2, 2), nn.Linear(2, 2)
    second.weight = first.weight  # shared
    first.bias.requires_grad_(False)
    model = nn.Sequential(first, second, Cell())
    groups = parameter_groups(model)
    assert list(groups) == ["weights", "norm_bias", "architecture"]
    assert [p is q for p, q in zip(groups["weights"], [first.weight, model[2].weight], strict=True)] == [
        True, True]  # fmt: skip
    assert len(groups["norm_bias"]) == 2 and groups["norm_bias"][0] is second.bias
    assert groups["architecture"] == [model[2].alpha]


def test_group_settings_and_defaults_per_kind() -> None:
    """Architecture: Adam, lr 1e-3, no weight decay unless given; the others: the base settings."""
    model = Cell()
    plain = _build(model, weight_decay=0.01, momentum=0.8, nesterov=True)
    groups = {g["name"]: g for g in plain.param_groups}
    assert groups["architecture"]["lr"] == 1e-3 and groups["architecture"]["weight_decay"] == 0.0
    kinds = {g["name"]: type(o) for o in plain.optimizers for g in o.param_groups}
    assert kinds == {
        "weights": torch.optim.SGD,
        "norm_bias": torch.optim.SGD,
        "architecture": torch.optim.Adam,
    }
    assert groups["weights"]["lr"] == 0.5 and groups["weights"]["weight_decay"] == 0.01
    assert groups["weights"]["momentum"] == 0.8 and groups["weights"]["nesterov"] is True
    assert groups["architecture"]["betas"] == (0.9, 0.999)  # Adam's own default
    overrides = {
        "architecture": {"lr_scale": 0.1, "betas": [0.5, 0.25]},
        "weights": {"lr": 0.2, "weight_decay": 0.3, "momentum": 0.4},
        "norm_bias": {"optimizer": "adamw", "lr_scale": 3},
    }
    changed = {g["name"]: g for g in _build(model, overrides=overrides).param_groups}
    assert changed["architecture"]["lr"] == pytest.approx(0.05)  # the scale replaces the default lr
    assert changed["architecture"]["betas"] == (0.5, 0.25)
    assert changed["architecture"]["weight_decay"] == 0.0
    assert (changed["weights"]["lr"], changed["weights"]["weight_decay"], changed["weights"]["momentum"]) == (
        0.2, 0.3, 0.4)  # fmt: skip
    assert changed["norm_bias"]["lr"] == 1.5 and changed["norm_bias"]["betas"] == (0.9, 0.999)
    assert "momentum" not in changed["norm_bias"]
    arch_lr = {g["name"]: g for g in _build(model, overrides={"architecture": {"lr": 0.7}}).param_groups}
    assert arch_lr["architecture"]["lr"] == 0.7


def test_a_network_without_parameters_gets_one_placeholder_group() -> None:
    optimizers = _build(nn.ReLU())
    assert [g["name"] for g in optimizers.param_groups] == ["empty"]
    assert optimizers.learning_rates() == {"empty": 0.5}


def test_cosine_schedule_values_and_clamp_after_the_end() -> None:
    optimizers = _build(nn.Linear(1, 1, bias=False), schedule="cosine", steps_per_epoch=2, epochs=2)
    expected = [0.5 * 0.5 * (1 + math.cos(math.pi * min(s, 4) / 4)) for s in range(6)]
    assert _lrs(optimizers, 6, "weights") == pytest.approx(expected, abs=1e-12)
    assert expected[5] == 0.0  # past the end the factor stays at zero, not rising again


def test_no_steps_at_all_still_has_a_schedule() -> None:
    """epochs 0: the schedule spans one step (no division by zero)."""
    optimizers = _build(nn.Linear(1, 1, bias=False), schedule="cosine", epochs=0)
    assert _lrs(optimizers, 2, "weights") == pytest.approx([0.5, 0.0], abs=1e-12)


def test_step_schedule_cuts_at_rounded_fractions() -> None:
    optimizers = _build(
        nn.Linear(1, 1, bias=False), schedule="step", milestones=(0.3, 0.55), gamma=0.5,
        steps_per_epoch=5, epochs=1,
    )  # fmt: skip
    # cuts at round(1.5) = 2 and round(2.75) = 3: the factor drops at exactly those steps
    assert _lrs(optimizers, 5, "weights") == pytest.approx([0.5, 0.5, 0.25, 0.125, 0.125])


def test_unknown_schedule_is_refused() -> None:
    with pytest.raises(
        EinspaceError, match=r"^unknown schedule 'linear'; expected cosine, step or constant$"
    ):
        _build(nn.Linear(1, 1), schedule="linear")


def test_warmup_then_freeze_per_group() -> None:
    model = Cell()
    overrides = {"weights": {"warmup_epochs": 1}, "architecture": {"freeze_epochs": 0.5}}
    optimizers = _build(model, overrides=overrides, steps_per_epoch=4)
    assert _lrs(optimizers, 6, "weights") == pytest.approx([0.125, 0.25, 0.375, 0.5, 0.5, 0.5])
    optimizers = _build(model, overrides=overrides, steps_per_epoch=4)
    assert _lrs(optimizers, 4, "architecture") == [0.0, 0.0, 1e-3, 1e-3]  # frozen for steps 0, 1
    optimizers = _build(model, overrides=overrides, steps_per_epoch=4)
    assert _lrs(optimizers, 2, "norm_bias") == [0.5, 0.5]  # neither


def test_warmup_and_freeze_follow_the_base_schedule() -> None:
    """Each group's factor is the base schedule at the same step, times its own ramp or zero."""
    model = Cell()
    overrides = {"weights": {"warmup_epochs": 1}, "architecture": {"freeze_epochs": 1}}
    settings: dict[str, Any] = dict(overrides=overrides, schedule="cosine", steps_per_epoch=2, epochs=2)
    cosine = [0.5 * (1 + math.cos(math.pi * s / 4)) for s in range(4)]
    weights = _lrs(_build(model, **settings), 4, "weights")
    assert weights == pytest.approx([0.5 * c * min(1.0, (s + 1) / 2) for s, c in enumerate(cosine)])
    architecture = _lrs(_build(model, **settings), 4, "architecture")
    assert architecture == pytest.approx([0.0, 0.0, 1e-3 * cosine[2], 1e-3 * cosine[3]])


def test_frozen_parameters_do_not_move_and_then_do() -> None:
    model = Cell()
    optimizers = _build(model, overrides={"architecture": {"freeze_epochs": 1}}, steps_per_epoch=1)
    alpha = model.alpha.detach().clone()
    for expect_moved in (False, True):
        optimizers.zero_grad()
        model(torch.ones(2)).sum().backward()
        optimizers.step()
        optimizers.schedule_step()
        assert (not torch.equal(model.alpha.detach(), alpha)) is expect_moved


def test_steps_match_plain_torch_optimizers() -> None:
    """SGD with momentum and weight decay on the weights, Adam on the architecture parameter."""
    model, reference = Cell(), Cell()
    optimizers = _build(model, momentum=0.9, weight_decay=0.1, nesterov=True)
    sgd = torch.optim.SGD(
        [reference.weight, reference.bias], lr=0.5, momentum=0.9, weight_decay=0.1, nesterov=True
    )
    adam = torch.optim.Adam([reference.alpha], lr=1e-3, weight_decay=0.0)
    x = torch.tensor([1.0, -2.0])
    for _ in range(3):
        for net, steppers in ((model, optimizers), (reference, None)):
            loss = net(x).pow(2).sum()
            if steppers is None:
                sgd.zero_grad(), adam.zero_grad()
                loss.backward()
                sgd.step(), adam.step()
            else:
                steppers.zero_grad()
                loss.backward()
                steppers.step()
                steppers.schedule_step()
    for name, param in model.named_parameters():
        assert torch.allclose(param, dict(reference.named_parameters())[name]), name


def test_zero_grad_sets_gradients_to_none() -> None:
    model = nn.Linear(2, 1)
    optimizers = _build(model)
    model(torch.ones(2)).sum().backward()
    optimizers.zero_grad()
    assert model.weight.grad is None and model.bias.grad is None


def test_step_through_a_scaler() -> None:
    """With a GradScaler each optimiser is stepped by the scaler (which unscales the gradients)."""

    class Recording:
        def __init__(self) -> None:
            self.stepped: list[torch.optim.Optimizer] = []

        def step(self, optimizer: torch.optim.Optimizer) -> None:
            self.stepped.append(optimizer)

    model = Cell()
    optimizers = _build(model)
    before = [p.detach().clone() for p in model.parameters()]
    model(torch.ones(2)).sum().backward()
    scaler = Recording()
    optimizers.step(scaler)  # type: ignore[arg-type]
    assert scaler.stepped == optimizers.optimizers and len(scaler.stepped) == 2
    unchanged = zip(model.parameters(), before, strict=True)
    assert all(torch.equal(p, b) for p, b in unchanged)  # the scaler stepped them, the optimisers did not


def test_state_round_trip_restores_moments_and_schedule() -> None:
    model = Cell()
    settings: dict[str, Any] = dict(schedule="cosine", momentum=0.9)
    first = _build(model, **settings)
    for _ in range(3):
        first.zero_grad()
        model(torch.ones(2)).sum().backward()
        first.step()
        first.schedule_step()
    state = first.state_dict()
    assert set(state) == {"optimizers", "schedulers"} and len(state["optimizers"]) == 2
    second = _build(model, **settings)
    second.load_state_dict(state)
    assert second.learning_rates() == first.learning_rates() != _build(model, **settings).learning_rates()

    def moments(optimizers: Optimizers) -> list[torch.Tensor]:
        sgd = next(o for o in optimizers.optimizers if isinstance(o, torch.optim.SGD))
        return [s["momentum_buffer"] for s in sgd.state.values()]

    assert len(moments(second)) == 2
    assert all(torch.equal(a, b) for a, b in zip(moments(second), moments(first), strict=True))
    with pytest.raises(ValueError):
        second.load_state_dict({"optimizers": state["optimizers"][:1], "schedulers": state["schedulers"]})
    with pytest.raises(ValueError):
        second.load_state_dict({"optimizers": state["optimizers"], "schedulers": state["schedulers"][:1]})


@pytest.mark.parametrize("kind", ["weights", "norm_bias", "architecture", "my_group", "pruning"])
def test_group_names_accepted(kind: str) -> None:
    check_param_groups({kind: {"lr": 0.1}})


@pytest.mark.parametrize(
    "kind, close",
    [
        ("archtecture", "architecture"),
        ("wieghts", "weights"),
        ("norm_bais", "norm_bias"),
        ("weight", "weights"),
    ],
)
def test_misspelled_group_names_are_refused(kind: str, close: str) -> None:
    with pytest.raises(
        EinspaceError,
        match=rf"^setting param_groups\.{kind}: no parameter group is called '{kind}'; "
        rf"did you mean '{close}'\? \(built-in groups: architecture, norm_bias, weights; "
        r"a parameter's own `einspace_group` names others\)$",
    ):
        check_param_groups({kind: {}})


def test_the_typo_cutoff_is_inclusive() -> None:
    """difflib ratios against 'weights': 'weightxyz' 2*6/16 = 0.75 exactly (refused), 'weig'
    2*4/11 = 0.73 (accepted: a group of its own)."""
    check_param_groups({"weig": {}})
    with pytest.raises(EinspaceError, match="did you mean 'weights'"):
        check_param_groups({"weightxyz": {}})


@pytest.mark.parametrize(
    "options, message",
    [
        ([("lr", 0.1)], r"expected a mapping of options, got \[\('lr', 0\.1\)\]"),
        (
            {"lr": 0.1, "momentun": 0.9, "beta": 1},
            r"unknown option\(s\) beta, momentun \(known: optimizer, lr, "
            r"lr_scale, weight_decay, momentum, betas, warmup_epochs, freeze_epochs\)$",
        ),
        ({"optimizer": "lion"}, r"unknown optimizer 'lion' \(known: sgd, adam, adamw\)$"),
        ({"lr": 0.1, "lr_scale": 2}, r"give lr or lr_scale, not both$"),
        ({"lr": -1e-9}, r"lr must be a number >= 0, got -1e-09$"),
        ({"lr_scale": True}, r"lr_scale must be a number >= 0, got True$"),
        ({"weight_decay": "0.1"}, r"weight_decay must be a number >= 0, got '0.1'$"),
        ({"momentum": None}, r"momentum must be a number >= 0, got None$"),
        ({"warmup_epochs": -1}, r"warmup_epochs must be a number >= 0, got -1$"),
        ({"freeze_epochs": [1]}, r"freeze_epochs must be a number >= 0, got \[1\]$"),
        ({"betas": [0.9, 1]}, r"betas must be two numbers in \[0, 1\), got \[0\.9, 1\]$"),
        ({"betas": [-0.1, 0.9]}, r"betas must be two numbers in \[0, 1\), got \[-0\.1, 0\.9\]$"),
        ({"betas": [0.9]}, r"betas must be two numbers"),
        ({"betas": [0.9, 0.9, 0.9]}, r"betas must be two numbers"),
        ({"betas": "0.9"}, r"betas must be two numbers"),
        ({"betas": [0.9, "0.9"]}, r"betas must be two numbers"),
    ],
)
def test_group_options_refused(options: Any, message: str) -> None:
    with pytest.raises(EinspaceError, match=r"^setting param_groups\.weights: " + message):
        check_param_groups({"weights": options})
    with pytest.raises(EinspaceError, match=message):  # build_optimizer checks them too
        _build(nn.Linear(1, 1), overrides={"weights": options})


@pytest.mark.parametrize(
    "options",
    [
        {"lr": 0, "weight_decay": 0, "momentum": 0, "warmup_epochs": 0, "freeze_epochs": 0},
        {"lr_scale": 0},
        {"betas": [0, 0.999999], "optimizer": "adam", "lr": 1},
        {"betas": (0.5, 0.5), "optimizer": "adamw", "lr": 2.5},
        {"optimizer": "sgd"},
        {},
    ],
)
def test_group_options_accepted(options: dict[str, Any]) -> None:
    check_param_groups({"weights": options})

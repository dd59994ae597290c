"""Architecture parameters, auxiliary and network losses, constraints and metrics, through training."""

from __future__ import annotations

import copy
from collections.abc import Iterator, Mapping
from typing import Any

import pytest
import torch
from torch import nn

import einspace as es
from einspace.errors import EinspaceError
from einspace.evaluators.optim import build_optimizer, parameter_groups
from einspace.evaluators.training import TrainingEvaluator
from einspace.ops import Group, register_op, unregister_op
from einspace.ops.core import UnaryOperation
from einspace.ops.trainable import (
    NETWORK_LOSSES,
    architecture_metrics,
    architecture_parameters,
    auxiliary_losses,
    constrain_architecture,
    mark_architecture,
    register_network_loss,
)
from einspace.state import FeatureState


class Gate(nn.Module):
    """x · g with one learnable architecture parameter g, a penalty g² and g clamped to [0, 1]."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = nn.Parameter(torch.tensor(0.5))
        mark_architecture(self, "gate")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.gate

    def auxiliary_losses(self) -> dict[str, torch.Tensor]:
        return {"gate_penalty": self.gate**2}

    def constrain_architecture(self) -> None:
        self.gate.clamp_(0.0, 1.0)

    def architecture_metrics(self) -> dict[str, float]:
        return {"gate": self.gate.item()}


class GateOp(UnaryOperation):
    name, group = "test_gate", Group.COMPUTATION

    def module(self, state: FeatureState, args: Mapping[str, Any]) -> nn.Module:
        return Gate()

    def params(self, state: FeatureState, args: Mapping[str, Any]) -> int:
        return 1


class GateTotal:
    """A network loss: (sum of gates - target)², reporting the sum."""

    def __init__(self, network: nn.Module, checked: Any, target: float = 0.0):
        self.gates = [m.gate for m in network.modules() if isinstance(m, Gate)]
        self.target = target
        self.params = checked.params

    def loss(self) -> torch.Tensor:
        return (sum(self.gates) - self.target) ** 2

    def metrics(self) -> dict[str, float]:
        return {"total": float(sum(self.gates).detach()), "params": float(self.params)}


@pytest.fixture
def gate_op() -> Iterator[None]:
    register_op(GateOp)
    register_network_loss("test_gate_total")(GateTotal)
    yield
    unregister_op("test_gate")
    NETWORK_LOSSES.unregister("test_gate_total")


TREE = (
    "(S (M (R1 im2col(k=3, s=1, p=1)) (M (C linear(d=8))) (R2 col2im))"
    " (M (M (C test_gate)) (M (C leaky_relu))))"
)
QUICK = {
    **{"epochs": 2, "batch_size": 64, "train_subset": 256, "valid_subset": 128, "threads": 1},
    "device": "cpu",  # where a GPU is present too: the gate values compared are float32 training's
}


def _network(tree: str = TREE) -> nn.Module:
    return es.compile_network(es.parse_tree(tree), es.input_state((1, 8, 8)), classes=10)


def _gate_path(net: nn.Module) -> str:
    return next(name for name, module in net.named_modules() if isinstance(module, Gate))


def test_marks_survive_copies_and_name_the_parameters(gate_op: None) -> None:
    net = _network()
    for model in (net, copy.deepcopy(net), net.double()):
        assert [name for name, _ in architecture_parameters(model)] == [f"{_gate_path(net)}.gate"]
        assert [p.numel() for p in parameter_groups(model)["architecture"]] == [1]
    with pytest.raises(ValueError, match="no parameter 'alpha' of its own"):
        mark_architecture(Gate(), "alpha")


def test_module_hooks_are_collected(gate_op: None) -> None:
    net = _network()
    assert float(auxiliary_losses(net)["gate_penalty"].detach()) == pytest.approx(0.25)
    with torch.no_grad():
        net.get_submodule(_gate_path(net)).gate.fill_(3.0)
    constrain_architecture(net)
    assert architecture_metrics(net) == {f"arch/{_gate_path(net)}/gate": 1.0}


def _optimizers(net: nn.Module, overrides: dict) -> Any:
    return build_optimizer(
        net, lr=0.1, momentum=0.9, weight_decay=1e-3, nesterov=False, schedule="constant",
        milestones=(), gamma=0.1, steps_per_epoch=2, epochs=3, overrides=overrides,
    )  # fmt: skip


def test_architecture_parameters_get_their_own_optimiser(gate_op: None) -> None:
    net = _network()
    default = _optimizers(net, {})
    kinds = {type(o).__name__: [g["name"] for g in o.param_groups] for o in default.optimizers}
    assert kinds == {"SGD": ["weights", "norm_bias"], "Adam": ["architecture"]}
    assert default.learning_rates() == {"weights": 0.1, "norm_bias": 0.1, "architecture": 1e-3}
    frozen = _optimizers(net, {"architecture": {"optimizer": "adamw", "lr": 0.01, "freeze_epochs": 1}})
    assert [type(o).__name__ for o in frozen.optimizers] == ["SGD", "AdamW"]
    rates = []
    for _ in range(4):
        rates.append(frozen.learning_rates()["architecture"])
        frozen.step()
        frozen.schedule_step()
    assert rates == [0.0, 0.0, 0.01, 0.01]  # two steps per epoch, the first epoch frozen


def test_training_adds_weighted_terms_and_reports_them(gate_op: None) -> None:
    grid = es.input_state((1, 8, 8))
    gate = f"arch/{_gate_path(_network())}/gate"
    checked = es.check_tree(es.parse_tree(TREE), None, grid)
    plain = TrainingEvaluator(**QUICK).evaluate(checked, 0)
    assert plain["aux/gate_penalty"] > 0 and 0 <= plain[gate] <= 1
    settings = {
        **QUICK,
        "param_groups": {"architecture": {"lr": 0.05}},
        "auxiliary_losses": {"gate_penalty": 50.0, "test_gate_total": {"weight": 0.0, "target": 2.0}},
    }
    heavy = TrainingEvaluator(**settings).evaluate(checked, 0)
    # a large weight on g² drives the gate down; the network loss reports what it sees
    assert heavy[gate] < plain[gate]
    assert heavy["test_gate_total/total"] == pytest.approx(heavy[gate])
    assert heavy["test_gate_total/params"] == heavy["params"] - 90  # the head is not in the tree
    assert "aux/test_gate_total" in heavy


def test_a_network_loss_factory_s_own_type_error_is_not_reported_as_an_option(gate_op: None) -> None:
    """The registry checks options against the factory's signature; what the factory raises itself
    passes through (the same rule as for strategies and evaluators)."""
    from einspace.ops.trainable import build_network_loss

    def broken(network: nn.Module, checked: object, scale: float = 1.0) -> None:
        raise TypeError("a bug inside the factory")

    register_network_loss("test_broken")(broken)
    try:
        checked = es.check_tree(es.parse_tree(TREE), None, es.input_state((1, 8, 8)))
        with pytest.raises(TypeError, match="a bug inside the factory"):
            build_network_loss("test_broken", _network(), checked, {"scale": 2.0})
        with pytest.raises(EinspaceError, match="already registered"):
            register_network_loss("test_broken")(broken)
    finally:
        NETWORK_LOSSES.unregister("test_broken")


def test_unknown_network_loss_options_are_errors(gate_op: None) -> None:
    settings = {**QUICK, "auxiliary_losses": {"test_gate_total": {"weight": 1.0, "targte": 1.0}}}
    checked = es.check_tree(es.parse_tree(TREE), None, es.input_state((1, 8, 8)))
    wanted = "'targte' for network loss 'test_gate_total'; did you mean 'target'"
    with pytest.raises(EinspaceError, match=wanted):
        TrainingEvaluator(**settings).evaluate(checked, 0)

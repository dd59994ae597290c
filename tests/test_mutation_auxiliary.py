"""Auxiliary losses (einspace.evaluators.auxiliary): which settings are refused, exact weighted sums.

Written in the mutation-testing round (scripts/mutation.py): boundaries (weight 0 accepted, any
negative refused; a name exactly at the typo cutoff refused) and sums computed by hand.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch
from torch import nn

from einspace.errors import EinspaceError
from einspace.evaluators.auxiliary import AuxiliaryObjective, check_auxiliary_settings
from einspace.ops.trainable import NETWORK_LOSSES, register_network_loss


class Term(nn.Module):
    """Provides the term `name` = value (a fixed tensor)."""

    def __init__(self, name: str, value: float) -> None:
        super().__init__()
        self.term, self.value = name, torch.tensor(value)

    def auxiliary_losses(self) -> dict[str, torch.Tensor]:
        return {self.term: self.value}


class Total:
    """A network loss whose term is `scale` times the number of Term modules."""

    def __init__(self, network: nn.Module, checked: Any, scale: float = 1.0) -> None:
        self.count = sum(isinstance(m, Term) for m in network.modules())
        self.scale = scale

    def loss(self) -> torch.Tensor:
        return torch.tensor(self.scale * self.count)

    def metrics(self) -> dict[str, float]:
        return {"count": self.count, "scale": self.scale}


def _check_scale(scale: float = 1.0) -> None:
    if scale < 0:
        raise EinspaceError(f"scale must be >= 0, got {scale}")


@pytest.fixture
def total_loss() -> Iterator[None]:
    register_network_loss("mutation_total", check=_check_scale)(Total)
    yield
    NETWORK_LOSSES.unregister("mutation_total")


def _refused(settings: dict) -> str:
    with pytest.raises(EinspaceError) as info:
        check_auxiliary_settings(settings)
    return str(info.value)


def test_a_weight_of_zero_is_accepted_and_any_negative_one_refused() -> None:
    check_auxiliary_settings({"sparsity": 0, "other": 0.0, "third": 2})
    assert _refused({"sparsity": -1e-9}) == (
        "setting auxiliary_losses.sparsity: the weight must be a number >= 0, got -1e-09"
    )
    assert _refused({"sparsity": True}).endswith("the weight must be a number >= 0, got True")
    assert _refused({"sparsity": "0.1"}).endswith("the weight must be a number >= 0, got '0.1'")


def test_a_network_loss_weight_and_options_are_checked(total_loss: None) -> None:
    check_auxiliary_settings({"mutation_total": {"scale": 0.0}})  # no weight: 1
    check_auxiliary_settings({"mutation_total": {"weight": 0}})
    check_auxiliary_settings({"mutation_total": 0.5})  # a bare weight for a network loss
    assert _refused({"mutation_total": {"weight": -1}}).endswith("must be a number >= 0, got -1")
    assert _refused({"mutation_total": {"scale": -2}}) == (
        "setting auxiliary_losses.mutation_total: scale must be >= 0, got -2"
    )


def test_a_name_at_the_typo_cutoff_is_refused_and_one_below_it_accepted() -> None:
    # difflib's ratio against "complexity" (10 letters): "comple" 2*6/16 = 0.75, "compl" 2*5/15 < 0.75
    assert _refused({"comple": 0.1}) == (
        "setting auxiliary_losses.comple: no network loss is called 'comple'; did you mean 'complexity'? "
        "(a module's own term of a name this close would be mistaken for it: rename the term)"
    )
    check_auxiliary_settings({"compl": 0.1})


def test_options_for_a_module_term_are_refused_naming_the_network_losses() -> None:
    assert _refused({"sparsity": {"weight": 1}}) == (
        "setting auxiliary_losses.sparsity has options, but no network loss of that name is registered "
        "(network losses: complexity); a module's own term takes a number"
    )


def test_no_terms_give_none() -> None:
    objective = AuxiliaryObjective(nn.Sequential(nn.Linear(2, 2)), None, {})
    assert objective() is None
    assert objective.epoch_metrics() == {}


def test_weighted_sum_epoch_means_and_final_metrics(total_loss: None) -> None:
    network = nn.Sequential(Term("a", 2.0), Term("a", 1.0), Term("b", 5.0))
    settings = {"b": 0.5, "mutation_total": {"weight": 0.25, "scale": 2.0}}
    objective = AuxiliaryObjective(network, None, settings)
    # a: 2 + 1 = 3 at weight 1 (not named); b: 5 at 0.5; mutation_total: 2 * 3 Term modules = 6 at 0.25
    assert float(objective()) == pytest.approx(3 + 2.5 + 1.5)
    assert float(objective()) == pytest.approx(7.0)
    network[2].value = torch.tensor(1.0)
    assert float(objective()) == pytest.approx(3 + 0.5 + 1.5)
    # unweighted means over the three calls
    assert objective.epoch_metrics() == pytest.approx(
        {"aux/a": 3.0, "aux/b": 11 / 3, "aux/mutation_total": 6.0}
    )
    assert objective.epoch_metrics() == {}  # a new epoch
    assert float(objective()) == pytest.approx(5.0)
    assert objective.epoch_metrics() == pytest.approx({"aux/a": 3.0, "aux/b": 1.0, "aux/mutation_total": 6.0})
    assert objective.final_metrics() == {"mutation_total/count": 3.0, "mutation_total/scale": 2.0}


def test_a_network_loss_alone_counts_and_a_module_term_alone_counts(total_loss: None) -> None:
    only_loss = AuxiliaryObjective(nn.Sequential(nn.Linear(2, 2)), None, {"mutation_total": {"scale": 3.0}})
    assert float(only_loss()) == 0.0  # no Term modules: 3 * 0, weight 1
    assert only_loss.final_metrics() == {"mutation_total/count": 0.0, "mutation_total/scale": 3.0}
    only_term = AuxiliaryObjective(nn.Sequential(Term("a", 4.0)), None, {"a": 0.0})
    assert float(only_term()) == 0.0
    assert only_term.epoch_metrics() == {"aux/a": 4.0}
    assert only_term.final_metrics() == {}


def test_every_entry_is_checked_after_a_network_loss(total_loss: None) -> None:
    message = _refused({"mutation_total": 0.5, "sparsity": -1})
    assert message == "setting auxiliary_losses.sparsity: the weight must be a number >= 0, got -1"
    message = _refused({"mutation_total": {"scale": 1.0}, "sparsity": {"weight": 1}})
    assert "(network losses: complexity, mutation_total)" in message


def test_a_network_loss_without_a_weight_weighs_one(total_loss: None) -> None:
    objective = AuxiliaryObjective(nn.Sequential(Term("a", 0.0)), None, {"mutation_total": {"scale": 2.0}})
    assert float(objective()) == pytest.approx(2.0)  # 0 from the term, 2 * 1 module at weight 1

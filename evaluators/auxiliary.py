"""The auxiliary part of a training objective: terms from modules and from network losses, weighted.

The evaluator's `auxiliary_losses` setting maps a term's name to its weight, or, for a
network loss (einspace.ops.trainable.register_network_loss), to a mapping with `weight` and the
loss's own options:

    auxiliary_losses: {complexity: {weight: 0.1, target: 0.5, measure: flops}, sparsity: 0.01}

Module terms that the setting does not name count with weight 1; a network loss runs only
when named. Every term is reported, unweighted, as `aux/<name>` (its mean over the last
epoch), and a network loss adds its own metrics after training.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from einspace.errors import EinspaceError
from einspace.ops.trainable import (
    NetworkLoss,
    auxiliary_loss_modules,
    auxiliary_losses,
    build_network_loss,
    check_network_loss,
    network_losses,
)

__all__ = ["AuxiliaryObjective", "check_auxiliary_settings"]


def check_auxiliary_settings(settings: Mapping[str, Any]) -> None:
    """Weights are numbers >= 0; a mapping is for a registered network loss, has a weight, and
    options that loss takes. A name close to a network loss's but not one is a typo, refused:
    otherwise it would weigh a module term no module provides, and no loss would be applied."""
    for name, value in settings.items():
        key = f"setting auxiliary_losses.{name}"
        weight = value.get("weight", 1.0) if isinstance(value, Mapping) else value
        if isinstance(weight, bool) or not isinstance(weight, (int, float)) or weight < 0:
            raise EinspaceError(f"{key}: the weight must be a number >= 0, got {weight!r}")
        if name in network_losses():
            options = {k: v for k, v in value.items() if k != "weight"} if isinstance(value, Mapping) else {}
            try:
                check_network_loss(name, options)
            except EinspaceError as exc:
                raise EinspaceError(f"{key}: {exc}") from None
            continue
        close = difflib.get_close_matches(name, network_losses(), n=1, cutoff=0.75)
        if close:
            raise EinspaceError(
                f"{key}: no network loss is called {name!r}; did you mean {close[0]!r}? (a module's own "
                "term of a name this close would be mistaken for it: rename the term)"
            )
        if isinstance(value, Mapping):
            known = ", ".join(network_losses()) or "none"
            raise EinspaceError(
                f"{key} has options, but no network loss of that name is "
                f"registered (network losses: {known}); a module's own term takes a number"
            )


class AuxiliaryObjective:
    """The auxiliary terms of one training run: built once, evaluated after every forward pass."""

    def __init__(self, network: nn.Module, checked: Any, settings: Mapping[str, Any]):
        check_auxiliary_settings(settings)
        self.network = network
        self.providers = auxiliary_loss_modules(network)
        self.weights: dict[str, float] = {}
        self.network_losses: dict[str, NetworkLoss] = {}
        for name, value in settings.items():
            options = dict(value) if isinstance(value, Mapping) else {"weight": value}
            self.weights[name] = float(options.pop("weight", 1.0))
            if name in network_losses():
                self.network_losses[name] = build_network_loss(name, network, checked, options)
        self._sums: dict[str, torch.Tensor] = {}  # tensors: no device sync per step
        self._count = 0

    def __call__(self) -> torch.Tensor | None:
        """The weighted sum of every term now (None when there are none); records each term."""
        if not self.providers and not self.network_losses:
            return None
        terms = auxiliary_losses(self.network, self.providers)
        for name, loss in self.network_losses.items():
            terms[name] = loss.loss()
        if not terms:
            return None
        total = None
        for name, value in terms.items():
            self._sums[name] = self._sums[name] + value.detach() if name in self._sums else value.detach()
            weighted = value * self.weights.get(name, 1.0)
            total = weighted if total is None else total + weighted
        self._count += 1
        return total

    def epoch_metrics(self) -> dict[str, float]:
        """The mean of each term since the last call, as `aux/<name>`; starts a new epoch."""
        metrics = {f"aux/{name}": float(value) / max(1, self._count) for name, value in self._sums.items()}
        self._sums, self._count = {}, 0
        return metrics

    def final_metrics(self) -> dict[str, float]:
        """What the network losses report after training."""
        metrics: dict[str, float] = {}
        for name, loss in self.network_losses.items():
            metrics.update({f"{name}/{key}": float(value) for key, value in loss.metrics().items()})
        return metrics

"""The optimisers: parameter groups by kind, each with its own optimiser, and per-step schedules.

Why groups: trainable terminals carry architecture parameters (XD-operations' K-matrices,
DNArch mask cut-offs) that want their own optimiser, learning rate, weight decay and warm-up,
apart from the network weights. A module declares them with
`einspace.ops.trainable.mark_architecture` (a parameter may also carry the attribute
`einspace_group = "<kind>"`); everything else is classified by `parameter_kind`. Training
settings may override any kind:

    param_groups: {architecture: {optimizer: adam, lr: 0.001, weight_decay: 0, freeze_epochs: 1},
                   norm_bias: {weight_decay: 0}}

Options: `optimizer` (sgd, adam or adamw), `lr` (absolute) or `lr_scale` (times the base lr),
`weight_decay`, `momentum` (sgd), `betas` (adam, adamw), `warmup_epochs` (the learning rate
rises linearly over them), `freeze_epochs` (the group does not move during them: the paper's
warm-up for XD architecture parameters, in which only the weights train). Unless overridden,
architecture parameters use Adam, lr 1e-3, no weight decay (`ARCHITECTURE_DEFAULTS`; options
given replace these one by one, and an `lr_scale` given replaces the default `lr`); every
other group gets the base settings: the training setting `optimizer` (SGD by default, the einspace
paper's recipe; Adam trains networks without normalisation far more reliably, which matters from
scratch), `lr`, `momentum`, `weight_decay`. The base schedule (cosine, step, constant) applies
to every group.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from einspace.errors import EinspaceError
from einspace.ops.trainable import ARCHITECTURE, is_architecture_parameter

__all__ = [
    "ARCHITECTURE_DEFAULTS",
    "BUILTIN_KINDS",
    "GROUP_ATTRIBUTE",
    "GROUP_OPTIONS",
    "OPTIMIZERS",
    "Optimizers",
    "build_optimizer",
    "check_param_groups",
    "parameter_groups",
    "parameter_kind",
]

#: The attribute a parameter may set to choose its group.
GROUP_ATTRIBUTE = "einspace_group"
#: What a group's settings may override.
GROUP_OPTIONS = (
    "optimizer", "lr", "lr_scale", "weight_decay", "momentum", "betas", "warmup_epochs", "freeze_epochs",
)  # fmt: skip
#: The groups `parameter_kind` makes of parameters that choose none themselves.
BUILTIN_KINDS = (ARCHITECTURE, "norm_bias", "weights")
#: The optimiser of architecture parameters unless the settings say otherwise.
ARCHITECTURE_DEFAULTS: dict[str, Any] = {"optimizer": "adam", "lr": 1e-3, "weight_decay": 0.0}

#: The optimisers the training setting `optimizer` and a group's `optimizer` option may name.
OPTIMIZERS: dict[str, type[torch.optim.Optimizer]] = {
    "sgd": torch.optim.SGD,
    "adam": torch.optim.Adam,
    "adamw": torch.optim.AdamW,
}
_NORMS = (nn.BatchNorm1d, nn.BatchNorm2d, nn.LayerNorm, nn.GroupNorm)


def parameter_kind(module: nn.Module, name: str, param: nn.Parameter) -> str:
    """The group of one parameter: `architecture` if its module declares it so, else its own
    `einspace_group` if it has one; `norm_bias` for normalisation scales/shifts and biases
    (often trained without weight decay); else `weights`."""
    if is_architecture_parameter(module, name):
        return ARCHITECTURE
    declared = getattr(param, GROUP_ATTRIBUTE, None)
    if declared:
        return str(declared)
    if isinstance(module, _NORMS) or name == "bias":
        return "norm_bias"
    return "weights"


def parameter_groups(model: nn.Module) -> dict[str, list[nn.Parameter]]:
    """Trainable parameters by kind, each parameter once, in module order (deterministic)."""
    groups: dict[str, list[nn.Parameter]] = {}
    seen: set[int] = set()
    for module in model.modules():
        for name, param in module.named_parameters(recurse=False):
            if not param.requires_grad or id(param) in seen:
                continue
            seen.add(id(param))
            groups.setdefault(parameter_kind(module, name, param), []).append(param)
    return groups


class Optimizers:
    """The optimisers of one training run (one per optimiser kind in use), stepped together.

    Each torch optimiser holds the parameter groups that use it, and a LambdaLR with one
    factor per group that `schedule_step` advances once per batch. With `max_grad_norm` a step
    first scales the gradients of all parameters together down to that norm where above it, and
    counts the steps it did so in (`clipped_share`).
    """

    def __init__(
        self,
        pairs: list[tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR]],
        max_grad_norm: float | None = None,
    ):
        self.optimizers = [optimizer for optimizer, _ in pairs]
        self.schedulers = [scheduler for _, scheduler in pairs]
        self.max_grad_norm = max_grad_norm
        self.parameters = [p for group in self.param_groups for p in group["params"]]  # what clipping sees
        self.steps = 0
        self.clipped: torch.Tensor | float = 0.0  # a tensor on the gradients' device once counted

    def _param_groups(self) -> list[dict[str, Any]]:
        """Every parameter group of every optimiser, each named by its kind (`name`)."""
        return [group for optimizer in self.optimizers for group in optimizer.param_groups]

    param_groups = property(_param_groups)  # not decorated: mutmut (scripts/mutation.py) skips those

    def zero_grad(self) -> None:
        for optimizer in self.optimizers:
            optimizer.zero_grad(set_to_none=True)

    def step(self, scaler: torch.amp.GradScaler | None = None) -> None:
        if self.max_grad_norm is not None:
            self._clip(scaler)
        for optimizer in self.optimizers:
            if scaler is None:
                optimizer.step()
            else:
                scaler.step(optimizer)

    def _clip(self, scaler: torch.amp.GradScaler | None) -> None:
        if scaler is not None:  # clip the true gradients, not the loss-scaled ones
            for optimizer in self.optimizers:
                scaler.unscale_(optimizer)
        norm = torch.nn.utils.clip_grad_norm_(self.parameters, self.max_grad_norm)  # skips grad None
        self.clipped = self.clipped + (norm > self.max_grad_norm)  # no sync: a GPU is not waited for
        self.steps += 1

    def clipped_share(self) -> float | None:
        """The share of this run's steps whose gradients were clipped (None: no `max_grad_norm`,
        or no step)."""
        if self.max_grad_norm is None or not self.steps:
            return None
        return float(self.clipped) / self.steps

    def schedule_step(self) -> None:
        for scheduler in self.schedulers:
            scheduler.step()

    def state_dict(self) -> dict[str, Any]:
        """Every optimiser's and schedule's state (tensors and plain values: loads with
        `torch.load(..., weights_only=True)`)."""
        return {
            "optimizers": [o.state_dict() for o in self.optimizers],
            "schedulers": [s.state_dict() for s in self.schedulers],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for optimizer, saved in zip(self.optimizers, state["optimizers"], strict=True):
            optimizer.load_state_dict(saved)
        for scheduler, saved in zip(self.schedulers, state["schedulers"], strict=True):
            scheduler.load_state_dict(saved)

    def learning_rates(self) -> dict[str, float]:
        """The current learning rate of each group, by kind."""
        return {group["name"]: group["lr"] for group in self.param_groups}


def _schedule(
    kind: str, total_steps: int, milestones: tuple[float, ...], gamma: float
) -> Callable[[int], float]:
    """Learning-rate factor at a step: cosine to zero, step decay at fractions of training, or constant."""
    if kind == "cosine":
        return lambda step: 0.5 * (1.0 + math.cos(math.pi * min(step, total_steps) / total_steps))
    if kind == "step":
        cuts = [round(m * total_steps) for m in milestones]
        return lambda step: gamma ** sum(step >= c for c in cuts)
    if kind == "constant":
        return lambda step: 1.0
    raise EinspaceError(f"unknown schedule {kind!r}; expected cosine, step or constant")


def build_optimizer(
    model: nn.Module,
    *,
    optimizer: str = "sgd",
    lr: float,
    momentum: float,
    weight_decay: float,
    nesterov: bool,
    schedule: str,
    milestones: tuple[float, ...],
    gamma: float,
    steps_per_epoch: int,
    epochs: int,
    overrides: dict[str, dict[str, Any]] | None = None,
    max_grad_norm: float | None = None,
) -> Optimizers:
    """The optimisers over the parameter groups, with schedules to step once per batch.

    A group's learning rate is its lr (or lr × lr_scale) × schedule(step) × its warm-up ramp,
    and zero during its frozen epochs. `max_grad_norm` clips all groups' gradients together.
    """
    overrides = overrides or {}
    check_param_groups(overrides)
    total = max(1, steps_per_epoch * epochs)
    base = _schedule(schedule, total, milestones, gamma)
    by_optimizer: dict[str, tuple[list[dict[str, Any]], list[Callable[[int], float]]]] = {}
    groups = parameter_groups(model)
    if not groups:  # a network with no parameters still "trains" (its metric is chance level)
        groups = {"empty": [nn.Parameter(torch.zeros(1))]}
    for kind, params in groups.items():
        options = _options(kind, overrides.get(kind, {}))
        name = options.get("optimizer", optimizer)
        group: dict[str, Any] = {
            "params": params,
            "name": kind,
            "lr": float(options.get("lr", lr)) * float(options.get("lr_scale", 1.0)),
            "weight_decay": float(options.get("weight_decay", weight_decay)),
        }
        if name == "sgd":
            group.update(momentum=float(options.get("momentum", momentum)), nesterov=nesterov)
        elif "betas" in options:
            group["betas"] = tuple(float(b) for b in options["betas"])
        warmup = float(options.get("warmup_epochs", 0)) * steps_per_epoch
        frozen = float(options.get("freeze_epochs", 0)) * steps_per_epoch
        entry = by_optimizer.setdefault(name, ([], []))
        entry[0].append(group)
        entry[1].append(_frozen_then(_with_warmup(base, warmup), frozen))
    pairs = []
    for name, (param_groups, factors) in by_optimizer.items():
        stepper = OPTIMIZERS[name](param_groups, lr=lr)
        pairs.append((stepper, torch.optim.lr_scheduler.LambdaLR(stepper, factors)))
    return Optimizers(pairs, max_grad_norm)


def _options(kind: str, given: dict[str, Any]) -> dict[str, Any]:
    """A group's options: the architecture defaults, key by key, under what the settings give
    (an `lr_scale` given replaces the default absolute `lr`)."""
    defaults = dict(ARCHITECTURE_DEFAULTS) if kind == ARCHITECTURE else {}
    if "lr_scale" in given:
        defaults.pop("lr", None)
    return {**defaults, **given}


def check_param_groups(overrides: dict[str, dict[str, Any]]) -> None:
    """The `param_groups` setting, before any network exists (so a search refuses it before it
    starts). A group name close to a built-in kind but not one is a typo, refused: its options
    would apply to no parameter, silently."""
    for kind, options in overrides.items():
        close = difflib.get_close_matches(kind, BUILTIN_KINDS, n=1, cutoff=0.75)
        if kind not in BUILTIN_KINDS and close:
            raise EinspaceError(
                f"setting param_groups.{kind}: no parameter group is called {kind!r}; did you mean "
                f"{close[0]!r}? (built-in groups: {', '.join(BUILTIN_KINDS)}; a parameter's own "
                f"`{GROUP_ATTRIBUTE}` names others)"
            )
        _check_options(kind, options)


def _check_options(kind: str, options: dict[str, Any]) -> None:
    """Unknown options, optimisers and ill-typed values name the group and the option."""
    if not isinstance(options, dict):
        raise EinspaceError(f"setting param_groups.{kind}: expected a mapping of options, got {options!r}")
    unknown = set(options) - set(GROUP_OPTIONS)
    if unknown:
        raise EinspaceError(
            f"setting param_groups.{kind}: unknown option(s) {', '.join(sorted(unknown))} "
            f"(known: {', '.join(GROUP_OPTIONS)})"
        )
    if options.get("optimizer", "sgd") not in OPTIMIZERS:
        raise EinspaceError(
            f"setting param_groups.{kind}: unknown optimizer {options['optimizer']!r} "
            f"(known: {', '.join(OPTIMIZERS)})"
        )
    if "lr" in options and "lr_scale" in options:
        raise EinspaceError(f"setting param_groups.{kind}: give lr or lr_scale, not both")
    for option in set(options) - {"optimizer", "betas"}:
        value = options[option]
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
            raise EinspaceError(f"setting param_groups.{kind}: {option} must be a number >= 0, got {value!r}")
    betas = options.get("betas", (0.9, 0.999))
    if not (
        isinstance(betas, (list, tuple))
        and len(betas) == 2
        and all(isinstance(b, (int, float)) and 0 <= b < 1 for b in betas)
    ):
        raise EinspaceError(
            f"setting param_groups.{kind}: betas must be two numbers in [0, 1), got {betas!r}"
        )


def _frozen_then(factor: Callable[[int], float], frozen_steps: float) -> Callable[[int], float]:
    if frozen_steps <= 0:
        return factor
    return lambda step: 0.0 if step < frozen_steps else factor(step)


def _with_warmup(base: Callable[[int], float], warmup_steps: float) -> Callable[[int], float]:
    if warmup_steps <= 0:
        return base
    return lambda step: base(step) * min(1.0, (step + 1) / warmup_steps)

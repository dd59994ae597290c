"""The optimiser: parameter groups by kind, SGD with momentum, and per-step learning-rate schedules.

Why groups: future terminals carry architecture parameters (XD-operations' K/L/M, DNArch
masks) that want their own learning rate, weight decay and warm-up, separate from the
network weights. A parameter declares its kind by carrying an attribute
`param.einspace_group = "architecture"` (set in the operation's `build()`); everything else is
classified by `parameter_kind`. Training settings may then override any kind:

    param_groups: {architecture: {lr_scale: 0.1, weight_decay: 0, warmup_epochs: 2},
                   norm_bias: {weight_decay: 0}}

With no overrides every group gets the same SGD settings, which is the paper's recipe.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from einspace.errors import EinspaceError

__all__ = ["GROUP_ATTRIBUTE", "GROUP_OPTIONS", "build_optimizer", "parameter_groups", "parameter_kind"]

#: The attribute a parameter sets to choose its group.
GROUP_ATTRIBUTE = "einspace_group"
#: What a group's settings may override.
GROUP_OPTIONS = ("lr_scale", "weight_decay", "momentum", "warmup_epochs")

_NORMS = (nn.BatchNorm1d, nn.BatchNorm2d, nn.LayerNorm, nn.GroupNorm)


def parameter_kind(module: nn.Module, name: str, param: nn.Parameter) -> str:
    """The group of one parameter: its own `einspace_group` if it declares one; `norm_bias` for
    normalisation scales/shifts and biases (often trained without weight decay); else `weights`."""
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
) -> tuple[torch.optim.SGD, torch.optim.lr_scheduler.LambdaLR]:
    """SGD over the parameter groups and a scheduler to step once per batch.

    Each group's learning rate is lr × lr_scale × schedule(step) × warm-up ramp, the ramp
    rising linearly over its `warmup_epochs` (none by default).
    """
    overrides = overrides or {}
    for kind, options in overrides.items():
        unknown = set(options) - set(GROUP_OPTIONS)
        if unknown:
            raise EinspaceError(
                f"parameter group {kind!r}: unknown option(s) {', '.join(sorted(unknown))} "
                f"(known: {', '.join(GROUP_OPTIONS)})"
            )
    total = max(1, steps_per_epoch * epochs)
    base = _schedule(schedule, total, milestones, gamma)
    groups, factors = [], []
    for kind, params in parameter_groups(model).items():
        options = overrides.get(kind, {})
        groups.append(
            {
                "params": params,
                "name": kind,
                "lr": lr * float(options.get("lr_scale", 1.0)),
                "weight_decay": float(options.get("weight_decay", weight_decay)),
                "momentum": float(options.get("momentum", momentum)),
                "nesterov": nesterov,
            }
        )
        warmup = float(options.get("warmup_epochs", 0)) * steps_per_epoch
        factors.append(_with_warmup(base, warmup))
    if not groups:  # a network with no parameters still "trains" (its metric is chance level)
        groups.append({"params": [nn.Parameter(torch.zeros(1))], "name": "empty"})
        factors.append(base)
    optimizer = torch.optim.SGD(
        groups, lr=lr, momentum=momentum, weight_decay=weight_decay, nesterov=nesterov
    )
    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, factors)


def _with_warmup(base: Callable[[int], float], warmup_steps: float) -> Callable[[int], float]:
    if warmup_steps <= 0:
        return base
    return lambda step: base(step) * min(1.0, (step + 1) / warmup_steps)

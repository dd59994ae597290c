"""Resource budgets checked from a tree's analytic counts: parameters, FLOPs, activation memory.

Everything here reads a CheckedTree (the checker's per-node signals, parameter and FLOP
counts); nothing builds a module or allocates a tensor. That makes `budget_violation` cheap
enough to call on every candidate a sampler or mutation produces, so over-budget trees are
rejected before anyone trains them (the training evaluator checks again before building, and
`require_training_memory` against the machine's free memory).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from einspace.checker import CheckedTree
from einspace.errors import EinspaceError
from einspace.evaluators.base import EvaluationFailed
from einspace.network.memory import require_memory
from einspace.ops.registry import Group, get_op
from einspace.tree import Terminal, walk

__all__ = [
    "Budget",
    "activation_bytes",
    "activation_values",
    "budget_violation",
    "head_flops",
    "head_params",
    "require_training_memory",
]

_MIB = 2**20


@dataclass(frozen=True)
class Budget:
    """Limits on a network; None means unlimited.

    `classes`, when given, adds the classification head (App. B.1) to the parameter and FLOP
    counts; otherwise they cover the backbone only, as the sampler's `Limits.max_params` does.
    Activation memory is for one batch of `batch_size` examples at `bytes_per_value` bytes.
    """

    max_params: int | None = None
    max_flops: int | None = None
    max_activation_mb: float | None = None
    batch_size: int = 256
    bytes_per_value: int = 4
    classes: int | None = None

    def __post_init__(self) -> None:
        for name in ("max_params", "max_flops", "max_activation_mb"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, (int, float)) or value < 0):
                raise EinspaceError(f"budget {name} must be a non-negative number or None, got {value!r}")
        for name in ("batch_size", "bytes_per_value"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise EinspaceError(f"budget {name} must be a positive integer, got {getattr(self, name)!r}")
        if self.classes is not None and (not isinstance(self.classes, int) or self.classes < 1):
            raise EinspaceError(f"budget classes must be positive, got {self.classes}")

    @property
    def unlimited(self) -> bool:
        return self.max_params is None and self.max_flops is None and self.max_activation_mb is None

    @staticmethod
    def from_settings(settings: dict[str, Any]) -> Budget:
        """The budget keys of a settings mapping (an evaluator's settings, as written under
        `evaluator: settings:` in an experiment file); other keys are ignored."""
        keys = ("max_params", "max_flops", "max_activation_mb", "batch_size", "bytes_per_value", "classes")
        return Budget(**{k: settings[k] for k in keys if settings.get(k) is not None})


def _counts_as_activation(node: Terminal) -> bool:
    """Whether a terminal's output is a new tensor: identity passes its input on, and the
    branching operations return references to or views of their input."""
    return node.op != "identity" and get_op(node.op).group is not Group.BRANCHING


def activation_values(checked: CheckedTree) -> int:
    """Values in the outputs of every operation for one example, Repeat copies included.

    This is what autograd may keep for the backward pass if every operation saved its output;
    real usage is lower where outputs are views (permute) or freed early, and lowering
    (im2col·linear·col2im -> conv) drops the unfolded patches, so it is a conservative estimate.
    The network input is not included.
    """
    total = 0
    for path, node in walk(checked.tree):
        if isinstance(node, Terminal) and _counts_as_activation(node):
            facts = checked.facts[path]
            total += sum(math.prod(state.shape) for state in facts.output) * facts.copies
    return total


def activation_bytes(checked: CheckedTree, batch_size: int, bytes_per_value: int = 4) -> int:
    """Estimated activation memory of one batch: the input plus every operation's output."""
    inputs = sum(math.prod(state.shape) for state in checked.input)
    return (inputs + activation_values(checked)) * batch_size * bytes_per_value


def _head_width(checked: CheckedTree) -> tuple[int, int]:
    """(features the head's linear layer sees, values it averages) for the App. B.1 head."""
    (state,) = checked.output
    width = state.shape[0] if len(state.shape) == 3 else state.shape[-1]
    return width, math.prod(state.shape)


def head_params(checked: CheckedTree, classes: int) -> int:
    """Parameters of the classification head: a linear layer from the pooled features."""
    width, _ = _head_width(checked)
    return (width + 1) * classes


def head_flops(checked: CheckedTree, classes: int) -> int:
    """FLOPs of the head for one example: the mean pool plus the linear layer."""
    width, values = _head_width(checked)
    return values + (2 * width + 1) * classes


def budget_violation(checked: CheckedTree, budget: Budget) -> str | None:
    """Why `checked` exceeds `budget` (the first limit it breaks, with both numbers), or None."""
    params, flops = checked.params, checked.flops
    scope = "backbone"
    if budget.classes is not None:
        params += head_params(checked, budget.classes)
        flops += head_flops(checked, budget.classes)
        scope = "network"
    if budget.max_params is not None and params > budget.max_params:
        return f"{params:,} {scope} parameters exceed the budget of {int(budget.max_params):,}"
    if budget.max_flops is not None and flops > budget.max_flops:
        return f"{flops:,} {scope} FLOPs per example exceed the budget of {int(budget.max_flops):,}"
    if budget.max_activation_mb is not None:
        used = activation_bytes(checked, budget.batch_size, budget.bytes_per_value) / _MIB
        if used > budget.max_activation_mb:
            return (
                f"an estimated {used:,.1f} MiB of activations for a batch of {budget.batch_size} "
                f"exceeds the budget of {budget.max_activation_mb:,} MiB"
            )
    return None


def require_training_memory(checked: CheckedTree, batch_size: int) -> None:
    """Refuse, before building, to train a network whose float32 weights, gradients and optimiser
    state (at most four copies) and one batch's activations exceed the memory there is: the
    operating system would kill the process, with no message."""
    try:
        require_memory(
            {
                "weights, gradients and optimiser state": 16 * checked.params,
                f"activations for a batch of {batch_size}": activation_bytes(checked, batch_size),
            },
            f"training a network of {checked.params:,} parameters",
        )
    except EinspaceError as exc:
        raise EvaluationFailed(str(exc)) from None

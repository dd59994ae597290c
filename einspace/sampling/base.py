"""What every sampling mode shares: the limits on sampled trees, the sampler's constructor and a
pause of the cyclic garbage collector. A module of its own so that the modes build on it without
building on each other."""

from __future__ import annotations

import gc
import random
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from einspace.checker import CheckedTree, check_tree
from einspace.errors import EinspaceError
from einspace.grammar.model import Grammar
from einspace.state import FeatureState, Signal
from einspace.tree import Node

__all__ = ["Limits", "SamplerBase", "cyclic_gc_paused"]


@dataclass(frozen=True)
class Limits:
    """Bounds on sampled trees. Depth counts non-terminal levels; nodes count terminals and
    non-terminals; the parameter budget, the FLOP budget `max_flops` and the minimums
    `min_params` and `min_flops` use the operations' analytic counts (those of
    `einspace.checker.check_tree`; FLOPs per sample). The minimums keep degenerate candidates out
    and `max_flops` the ones an evaluator's FLOP budget would refuse: every mode, mutation and
    crossover reject a complete tree outside them (`cost_violation`), which in the exact mode
    conditions exactly. `max_operations` bounds the network's terminal operations, each Repeat
    copy counted (`CheckedTree.operations`): a tree of few FLOPs but hundreds of small operations
    spends its time in the interpreter, building and stepping (measured on the digits benchmark:
    ten times a typical tree's time per evaluation), which no FLOP budget sees.

    `max_steps` bounds the paper mode's backtracking per attempt and `max_attempts` its restarts;
    the exact mode gives up after `max_attempts` x 100 rejected drafts (`einspace.sampling.exact`).
    """

    max_depth: int = 40
    max_nodes: int = 2000
    min_depth: int = 0
    max_params: int | None = None
    max_steps: int = 20_000
    max_attempts: int = 100
    min_params: int = 0
    min_flops: int = 0
    max_flops: int | None = None
    max_operations: int | None = None

    def __post_init__(self) -> None:
        for name in ("max_depth", "max_nodes", "max_steps", "max_attempts"):
            if getattr(self, name) < 1:
                raise EinspaceError(f"limit {name} must be at least 1, got {getattr(self, name)}")
        if self.max_operations is not None and self.max_operations < 1:
            raise EinspaceError(f"limit max_operations must be at least 1, got {self.max_operations}")
        if self.min_depth > self.max_depth:
            raise EinspaceError(f"min_depth {self.min_depth} exceeds max_depth {self.max_depth}")
        for name in ("max_params", "min_params", "min_flops", "max_flops"):
            value = getattr(self, name)
            if value is not None and value < 0:
                raise EinspaceError(f"{name} must be non-negative, got {value}")
        if self.max_params is not None and self.min_params > self.max_params:
            raise EinspaceError(f"min_params {self.min_params} exceeds max_params {self.max_params}")
        if self.max_flops is not None and self.min_flops > self.max_flops:
            raise EinspaceError(f"min_flops {self.min_flops} exceeds max_flops {self.max_flops}")

    @property
    def checks_whole_trees(self) -> bool:
        """Whether a cost limit that only a complete tree's counts decide is set: a minimum
        (`min_params`, `min_flops`), `max_flops` or `max_operations` (the modes keep `max_params`
        while drawing)."""
        return (
            self.min_params > 0
            or self.min_flops > 0
            or self.max_flops is not None
            or self.max_operations is not None
        )

    def cost_violation(self, checked: CheckedTree) -> tuple[str, str] | None:
        """The first cost limit a checked tree breaks, as (the setting's name, a message), or
        None: the one place that compares costs with limits."""
        params, flops = checked.params, checked.flops
        if self.max_params is not None and params > self.max_params:
            return "max_params", f"{params} parameters > max_params {self.max_params}"
        if params < self.min_params:
            return "min_params", f"{params} parameters < min_params {self.min_params}"
        if flops < self.min_flops:
            return "min_flops", f"{flops} FLOPs < min_flops {self.min_flops}"
        if self.max_flops is not None and flops > self.max_flops:
            return "max_flops", f"{flops} FLOPs > max_flops {self.max_flops}"
        if self.max_operations is not None and checked.operations > self.max_operations:
            return "max_operations", f"{checked.operations} operations > max_operations {self.max_operations}"
        return None

    def describe(self) -> str:
        """The limits on a tree's size and costs, for the messages of a sampler that gives up."""
        names = (
            "max_depth",
            "max_nodes",
            "min_depth",
            "max_params",
            "min_params",
            "min_flops",
            "max_flops",
            "max_operations",
        )
        return ", ".join(f"{name}={getattr(self, name)}" for name in names)


class SamplerBase:
    """What every sampling mode takes: a grammar, the input, the limits and a random stream
    (`rng`, or one seeded by `random_seed`); subclasses implement `sample()`."""

    def __init__(
        self,
        grammar: Grammar,
        input: FeatureState | Signal,
        limits: Limits | None = None,
        random_seed: int | None = None,
        rng: random.Random | None = None,
    ):
        self.grammar = grammar
        self.input: Signal = (input,) if isinstance(input, FeatureState) else tuple(input)
        self.limits = limits or Limits()
        self.rng = rng if rng is not None else random.Random(random_seed)
        self._setup()

    def _setup(self) -> None:
        """What a mode prepares once from the grammar, input and limits (tables, counters)."""

    def sample(self) -> Node:
        raise NotImplementedError

    def _cost_violation(self, tree: Node) -> str | None:
        """For a complete tree: the cost limit it breaks (the setting's name: a minimum,
        `max_flops` or `max_operations`, as the modes keep `max_params` while drawing), or None.
        Its costs come from the checker, so it looks only when such a limit is set; a mode
        rejects the whole tree, never part of it, which keeps the exact mode exact."""
        if not self.limits.checks_whole_trees:
            return None
        checked = check_tree(tree, None, self.input)
        violation = self.limits.cost_violation(checked)
        return violation[0] if violation else None


@contextmanager
def cyclic_gc_paused() -> Iterator[None]:
    """Pause Python's cyclic garbage collector. Sampling and mutation allocate many small
    tuples and create no reference cycles, yet the collector would walk the caches again and
    again (measured: half the sampling time, single pauses of seconds)."""
    collecting = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if collecting:
            gc.enable()

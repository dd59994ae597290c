"""What every sampling mode shares: the limits on sampled trees, the sampler's constructor and a
pause of the cyclic garbage collector. A module of its own so that the modes build on it without
building on each other."""

from __future__ import annotations

import gc
import random
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from einspace.errors import EinspaceError
from einspace.grammar.model import Grammar
from einspace.state import FeatureState, Signal
from einspace.tree import Node

__all__ = ["Limits", "SamplerBase", "cyclic_gc_paused"]


@dataclass(frozen=True)
class Limits:
    """Bounds on sampled trees. Depth counts non-terminal levels; nodes count terminals and
    non-terminals; the parameter budget uses the operations' analytic counts.

    `max_steps` bounds the paper mode's backtracking per attempt and `max_attempts` its restarts;
    the exact mode gives up after `max_attempts` x 100 rejected drafts (`einspace.sampling.exact`).
    """

    max_depth: int = 40
    max_nodes: int = 2000
    min_depth: int = 0
    max_params: int | None = None
    max_steps: int = 20_000
    max_attempts: int = 100

    def __post_init__(self) -> None:
        for name in ("max_depth", "max_nodes", "max_steps", "max_attempts"):
            if getattr(self, name) < 1:
                raise EinspaceError(f"limit {name} must be at least 1, got {getattr(self, name)}")
        if self.min_depth > self.max_depth:
            raise EinspaceError(f"min_depth {self.min_depth} exceeds max_depth {self.max_depth}")
        if self.max_params is not None and self.max_params < 0:
            raise EinspaceError(f"max_params must be non-negative, got {self.max_params}")


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

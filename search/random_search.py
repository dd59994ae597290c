"""Random sampling and random search (paper Sec. 4.1): K independent samples from the grammar.

They propose the same thing; they differ in what is reported (the average of the K, or the best
on validation), which `einspace report` reads from `Strategy.reports_mean`.
"""

from __future__ import annotations

from einspace.search.strategy import Strategy, register_strategy
from einspace.tree import Node


@register_strategy
class RandomSearch(Strategy):
    """K samples; the result is the best of them. Never waits: every ask is a fresh sample."""

    name = "random_search"

    def _propose(self) -> tuple[Node, str, tuple[int, ...]]:
        return self.sampler.sample(), "sampled", ()


@register_strategy
class RandomSampling(RandomSearch):
    """K samples; the result is their average (the expected performance of the space)."""

    name = "random_sampling"
    reports_mean = True

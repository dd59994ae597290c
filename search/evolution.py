"""Regularised evolution (Real et al. 2019; paper Sec. 4.1): tournaments, mutation, aging.

Asynchronous steady state: the strategy answers `ask` whenever a slot is free, so with N
evaluations in flight each finished child enters the population and a new one is asked for at
once (Real et al.'s distributed setting). With N = 1 asks and tells alternate and this is exactly
the sequential algorithm.
"""

from __future__ import annotations

from typing import Any

from einspace.errors import EinspaceError
from einspace.search.strategy import Candidate, SearchSpace, Strategy, _positive_int, register_strategy
from einspace.tree import Node

#: How often a failed mutation (e.g. a minimal tree with nothing to change) is retried with a new
#: tournament before falling back to a fresh sample, so one awkward parent cannot stall the search.
_MUTATION_TRIES = 10


@register_strategy
class RegularisedEvolution(Strategy):
    """Population P (default 100), tournament S (default 10), K = `evaluations` in total.

    The first P candidates are the initial population: fresh samples, or the `space.seeds` cycled
    in order (RE(RN18): one seed repeated; RE(Mix): several). Identical seeds share one evaluation
    because the run loop serves repeated trees from its cache. Afterwards each candidate is a
    mutation of the fittest of S individuals drawn uniformly with replacement (Real et al.,
    Algorithm 1) -- or, with probability `crossover`, the crossover of two tournament winners.
    Every told child joins the population and, once it holds more than P, the oldest dies (FIFO),
    whatever its fitness. Failed evaluations join with fitness -inf and age out like the rest.
    """

    name = "regularised_evolution"

    def __init__(
        self,
        space: SearchSpace,
        random_seed: int = 0,
        evaluations: int = 1000,
        population: int = 100,
        tournament: int = 10,
        crossover: float = 0.0,
    ):
        super().__init__(space, random_seed, evaluations)
        self.population_size = _positive_int("population", population)
        self.tournament_size = _positive_int("tournament", tournament)
        if isinstance(crossover, bool) or not isinstance(crossover, int | float) or not 0 <= crossover <= 1:
            raise EinspaceError(
                f"strategy setting 'crossover' must be a probability in [0, 1], got {crossover!r}"
            )
        self.crossover = float(crossover)
        # (id, tree text, fitness), oldest first: the list order *is* the age.
        self.population: list[tuple[int, str, float]] = []

    def _propose(self) -> tuple[Node, str, tuple[int, ...]] | None:
        if self.next_id < self.population_size:
            if self.space.seeds:
                name, tree = self.space.seed_trees()[self.next_id % len(self.space.seeds)]
                return tree, f"seed:{name}", ()
            return self.sampler.sample(), "sampled", ()
        if not self.population:
            return None  # every initial candidate is still in flight: wait for one to come back
        if self.crossover and len(self.population) > 1 and self.rng.random() < self.crossover:
            a, b = self._tournament(), self._tournament()
            try:
                child = self.variation.crossover(self.tree_of(a[0], a[1]), self.tree_of(b[0], b[1]))
                return child, "crossover", (a[0], b[0])
            except EinspaceError:
                pass  # no exchangeable subtrees: mutate instead
        for _ in range(_MUTATION_TRIES):
            parent = self._tournament()
            try:
                return self.variation.mutate(self.tree_of(parent[0], parent[1])), "mutation", (parent[0],)
            except EinspaceError:
                continue
        return self.sampler.sample(), "sampled", ()

    def _tournament(self) -> tuple[int, str, float]:
        """The fittest of S uniform draws (ties: the first drawn)."""
        best = None
        for _ in range(self.tournament_size):
            contender = self.rng.choice(self.population)
            if best is None or contender[2] > best[2]:
                best = contender
        assert best is not None
        return best

    def _observe(self, candidate: Candidate, fitness: float) -> None:
        self.population.append((candidate.id, candidate.tree, fitness))
        if len(self.population) > self.population_size:
            self.forget(self.population.pop(0)[0])

    def _extra_state(self) -> dict[str, Any]:
        # -inf is not JSON: failed individuals are stored with fitness null.
        return {"population": [[i, t, None if f == float("-inf") else f] for i, t, f in self.population]}

    def _load_extra_state(self, state: dict[str, Any]) -> None:
        self.population = [
            (int(i), t, float("-inf") if f is None else float(f)) for i, t, f in state["population"]
        ]

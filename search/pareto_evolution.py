"""Multi-objective regularised evolution: Real et al.'s aging population, with the tournament won
by NSGA-II's order (Deb et al. 2002) instead of the highest fitness.

Why NSGA-II's non-dominated rank and crowding distance rather than random scalarisations (ParEGO,
Knowles 2006): the rank needs no weights, reference or normalisation of objectives in different
units (accuracy in [0, 1], parameters in millions), it reaches the non-convex parts of a front that
weighted sums miss, and it is decided within the population RE already keeps, so aging, the
asynchronous steady state and the checkpoint stay exactly as in single-objective RE. ParEGO's
strength is its Gaussian-process model of each scalarisation, which RE's tournament has no use for.

Each result is told as [violation, objective values maximised] (`einspace.search.multi_objective`),
or None for a failed one (a plain fitness is one objective); a tournament's winner is the
contender with the lowest constrained non-dominated rank within the population, ties broken by the
larger crowding distance on its front (the extremes of a front win), then by the first drawn.
"""

from __future__ import annotations

import math
from typing import Any

from einspace.errors import EinspaceError
from einspace.search.evolution import RegularisedEvolution
from einspace.search.pareto import crowding_distance, non_dominated_ranks
from einspace.search.strategy import Candidate, SearchSpace, register_strategy

Score = list[float] | None


@register_strategy
class ParetoEvolution(RegularisedEvolution):
    """Regularised evolution (population P, tournament S, aging) over several objectives; takes
    RE's settings but `screen` (its surrogate predicts one fitness) and `restart_after` (its
    results are not ordered by one fitness)."""

    name = "pareto_evolution"
    multi_objective = True

    def __init__(
        self,
        space: SearchSpace,
        random_seed: int = 0,
        evaluations: int = 1000,
        population: int = 100,
        tournament: int = 10,
        crossover: float = 0.0,
        mutations: dict[str, float] | None = None,
        immigrants: float = 0.0,
    ):
        super().__init__(
            space,
            random_seed,
            evaluations,
            population,
            tournament,
            crossover,
            mutations=mutations,
            immigrants=immigrants,
        )
        self._order: dict[int, tuple[int, float]] | None = None  # id -> (rank, -crowding), cached

    def tell(
        self, candidate_id: int, fitness: Any, partial: bool = False, seconds: float | None = None
    ) -> None:
        self._observe(self._take_pending(candidate_id), _score(fitness))

    def _observe(self, candidate: Candidate, fitness: Any) -> None:
        self._order = None
        super()._observe(candidate, fitness)

    def _tournament(self) -> tuple[int, str, Any]:
        """The contender NSGA-II orders first of S uniform draws."""
        order = self._population_order()
        best = None
        for _ in range(self.tournament_size):
            contender = self.rng.choice(self.population)
            if best is None or order[contender[0]] < order[best[0]]:
                best = contender
        assert best is not None
        return best

    def _population_order(self) -> dict[int, tuple[int, float]]:
        """(constrained non-dominated rank, minus crowding distance) of each member; members
        without a point (failed) after every front."""
        if self._order is None:
            scored = [(i, s) for i, _, s in self.population if s is not None]
            ranks = non_dominated_ranks([s[1:] for _, s in scored], [s[0] for _, s in scored])
            self._order = {i: (len(scored) + 1, 0.0) for i, _, s in self.population if s is None}
            for rank in set(ranks):
                front = [k for k, r in enumerate(ranks) if r == rank]
                distances = crowding_distance([scored[k][1][1:] for k in front])
                for k, d in zip(front, distances, strict=True):
                    self._order[scored[k][0]] = (rank, -d)
        return self._order

    def _extra_state(self) -> dict[str, Any]:
        return {"population": [[i, t, s] for i, t, s in self.population], "restart": self._restart_state()}

    def _load_extra_state(self, state: dict[str, Any]) -> None:
        self.population = [(int(i), t, _score(s)) for i, t, s in state["population"]]
        self._order = None
        self._load_restart_state(state)


def _score(value: Any) -> Score:
    """A told score as a list of finite floats; None (or -inf, a failure told as a fitness, or any
    value not finite) for a result without a point. A plain fitness is a single objective, [0, fitness]."""
    if value is None or (isinstance(value, float) and value == -math.inf):
        return None
    if isinstance(value, int | float) and not isinstance(value, bool):
        return [0.0, float(value)]
    if not isinstance(value, list | tuple) or len(value) < 2:
        raise EinspaceError(f"pareto_evolution is told [violation, objectives, ...] or a fitness: {value!r}")
    score = [float(x) for x in value]
    return score if all(math.isfinite(x) for x in score) else None

"""Regularised evolution (Real et al. 2019; paper Sec. 4.1): tournaments, mutation, aging.

Asynchronous steady state: the strategy answers `ask` whenever a slot is free, so with N
evaluations in flight each finished child enters the population and a new one is asked for at
once (Real et al.'s distributed setting). With N = 1 asks and tells alternate and this is exactly
the sequential algorithm.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from einspace.errors import EinspaceError
from einspace.sampling.variation import mutation_weights
from einspace.search.screening import Proposal, Screen
from einspace.search.strategy import Candidate, SearchSpace, Strategy, _positive_int, register_strategy
from einspace.search.surrogate import Surrogate
from einspace.tree import Node

#: How often a failed mutation (e.g. a minimal tree with nothing to change) is retried with a new
#: tournament before falling back to a fresh sample, so one awkward parent cannot stall the search.
_MUTATION_TRIES = 10


@dataclass
class _Restarts:
    """When a population has stalled: `after` * P results in a row (0: never) none of which beat
    the best result since it started (a tie does not, nor a failure). Counted while the population
    fills too, but a restart waits until all its fresh samples have been proposed."""

    after: float
    growth: int
    best: float = float("-inf")
    since_best: int = 0
    count: int = 0  # restarts so far

    @staticmethod
    def of_settings(after: Any, growth: Any) -> _Restarts:
        if isinstance(after, bool) or not isinstance(after, int | float) or not 0 <= after < float("inf"):
            raise EinspaceError(
                f"strategy setting 'restart_after' must be a number >= 0 (0: never), got {after!r}"
            )
        return _Restarts(float(after), _positive_int("restart_growth", growth))

    def stalled(self, fitness: float, population: int) -> bool:
        """Hear one result of a population of `population`: whether it has stalled."""
        if not self.after:
            return False
        if fitness > self.best:
            self.best, self.since_best = fitness, 0
        else:
            self.since_best += 1
        return self.since_best >= self.after * population

    def restarted(self) -> None:
        self.best, self.since_best, self.count = float("-inf"), 0, self.count + 1

    def to_json(self) -> dict[str, Any]:
        best = None if self.best == float("-inf") else self.best  # -inf is not JSON
        return {"after": self.after, "best": best, "since_best": self.since_best, "restarts": self.count}

    def load(self, data: dict[str, Any]) -> None:
        self.best = float("-inf") if data["best"] is None else float(data["best"])
        self.since_best, self.count = int(data["since_best"]), int(data["restarts"])


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

    `mutations` weighs the mutation operators (`einspace.sampling.variation`: subtree, insert,
    remove); by default the paper's subtree mutation alone.

    With `immigrants` p > 0, each candidate after the initial population is a fresh sample with
    probability p instead of a child ("random immigrants", Grefenstette 1992): a population that
    settled on one family early keeps meeting others, which win their tournaments where they do
    better. An immigrant is screened as an initial sample is.

    With `screen` k > 1, each child is the best of k such proposals as ranked by a `Surrogate`
    fitted to every result told so far (`surrogate`: gradient_boosting or random_forest), once
    `surrogate_min_results` are in; before that, plain RE. Screening prefers trees not proposed
    before (a repeat would only be served from the cache). The initial population's samples are
    screened the same way once the surrogate is ready: from the first candidate when it is
    warm-started from earlier runs (`einspace.search.warm_start`), each the best of k samples.

    With `screen_cost` c > 0 the screen also weighs cost (`einspace.search.screening`): a
    proposal predicted ten times costlier, in seconds learnt from the run's own evaluations, must
    be predicted c standard deviations of the run's results fitter to be chosen.

    Inside successive halving that passes on later rungs (`hear_promotion`), a member's fitness
    becomes its result at the highest rung it reached, and a member that reached a higher rung wins
    any tournament against one that did not: promotion is a judgment made with more training.

    With `restart_after` r > 0, a population whose results have not beaten its best for r * P
    results in a row is restarted (`_Restarts`): it is emptied and the next P candidates are fresh
    samples again, screened as initial samples are; P and S grow by `restart_growth` each time (2:
    IPOP's doubling). A search whose population settled on a family of poor networks gets new
    starting points; what it found stays in the store. Seeds start only the first population;
    children still in flight join the new one. With `restart_keep` k, the population's k best
    (the highest rung first) survive a restart: they rejoin it as its youngest once its fresh
    samples have been proposed, so a lineage still worth refining competes with the new starts.
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
        screen: int = 1,
        surrogate: str = "gradient_boosting",
        surrogate_min_results: int = 20,
        screen_cost: float = 0.0,
        mutations: dict[str, float] | None = None,
        restart_after: float = 0,
        restart_growth: int = 1,
        restart_keep: int = 0,
        immigrants: float = 0.0,
    ):
        self.mutations = mutation_weights(mutations)  # read by Strategy.__init__'s variation
        super().__init__(space, random_seed, evaluations)
        self.screen = _positive_int("screen", screen)
        min_results = _positive_int("surrogate_min_results", surrogate_min_results, minimum=2)
        cost_weight = _cost_weight(screen_cost, self.screen)
        self.screening = (
            Screen(Surrogate(surrogate, random_seed, min_results, cost=cost_weight > 0), space, cost_weight)
            if self.screen > 1
            else None
        )
        self.population_size = _positive_int("population", population)
        self.tournament_size = _positive_int("tournament", tournament)
        self.crossover = _probability("crossover", crossover)
        self.immigrants = _probability("immigrants", immigrants)
        self.restart = _Restarts.of_settings(restart_after, restart_growth)
        self.restart_keep = _positive_int("restart_keep", restart_keep, minimum=0)
        if not self.restart.after and (self.restart.growth > 1 or self.restart_keep):
            raise EinspaceError(
                "strategy settings 'restart_growth' and 'restart_keep' shape restarts, and "
                "'restart_after' is 0 (never restart): set it too"
            )
        self._kept: list[tuple[int, str, float]] = []  # members a restart kept, until they rejoin
        self._initial_left = self.population_size  # fresh candidates the (re)started population still needs
        # (id, tree text, fitness), oldest first: the list order *is* the age.
        self.population: list[tuple[int, str, float]] = []
        self.rung_of: dict[int, int] = {}  # member id -> the rung its fitness is from, where above 0

    def _propose(self) -> tuple[Node, str, tuple[int, ...]] | None:
        if self._initial_left:
            self._initial_left -= 1
            if self.space.seeds and not self.restart.count:
                name, tree = self.space.seed_trees()[self.next_id % len(self.space.seeds)]
                return tree, f"seed:{name}", ()
            propose = self._sample
        elif not self.population:
            return None  # every initial candidate is still in flight: wait for one to come back
        else:
            self.population += self._kept  # those a restart kept rejoin, as the youngest
            self._kept = []
            # no draw without immigrants: a run's random stream stays what it was before them
            immigrant = self.immigrants and self.rng.random() < self.immigrants
            propose = self._sample if immigrant else self._vary
        if self.screening is None or not self.screening.surrogate.ready:
            return propose()[:3]
        return self.screening.pick([propose() for _ in range(self.screen)], self.next_id)[:3]

    @property
    def surrogate(self) -> Surrogate | None:
        """The screen's model of fitness (None: nothing is screened)."""
        return self.screening.surrogate if self.screening is not None else None

    def _sample(self) -> Proposal:
        """A fresh sample (no check made): an initial candidate, an immigrant, or a child when no
        mutation works."""
        return self.sampler.sample(), "sampled", (), None

    def _vary(self) -> Proposal:
        """A child of tournament winners: a crossover (with probability `crossover`) or a mutation,
        with its check when variation made one."""
        if self.crossover and len(self.population) > 1 and self.rng.random() < self.crossover:
            a, b = self._tournament(), self._tournament()
            try:
                child = self.variation.crossover_checked(self.tree_of(a[0], a[1]), self.tree_of(b[0], b[1]))
                return child.tree, "crossover", (a[0], b[0]), child
            except EinspaceError:
                pass  # no exchangeable subtrees: mutate instead
        for _ in range(_MUTATION_TRIES):
            parent = self._tournament()
            try:
                child = self.variation.mutate_checked(self.tree_of(parent[0], parent[1]))
                return child.tree, "mutation", (parent[0],), child
            except EinspaceError:
                continue
        return self._sample()

    def live_parents(self) -> set[int]:
        """The population (and the members a restart kept): only they enter tournaments."""
        return {i for i, _, _ in self.population + self._kept}

    def _rank(self, member: tuple[int, str, float]) -> tuple[int, float]:
        """What a tournament compares: the highest rung reached, then fitness."""
        return self.rung_of.get(member[0], 0), member[2]

    def _tournament(self) -> tuple[int, str, float]:
        """The fittest of S uniform draws, the highest rung first (ties: the first drawn)."""
        best, best_key = None, None
        for _ in range(self.tournament_size):
            contender = self.rng.choice(self.population)
            key = self._rank(contender)
            if best_key is None or key > best_key:
                best, best_key = contender, key
        assert best is not None
        return best

    def hear_promotion(self, candidate_id: int, rung: int, fitness: float) -> None:
        """A living member's result at a higher rung replaces its fitness; the dead are gone."""
        for members in (self.population, self._kept):
            for i, (member, tree, _) in enumerate(members):
                if member == candidate_id:
                    members[i] = (member, tree, float(fitness))
                    self.rung_of[member] = rung

    def tell(
        self, candidate_id: int, fitness: float, partial: bool = False, seconds: float | None = None
    ) -> None:
        if seconds is not None and self.screening is not None:
            self.screening.measured(candidate_id, seconds)
        super().tell(candidate_id, fitness, partial)

    def _observe(self, candidate: Candidate, fitness: float) -> None:
        if self.screening is not None:
            self.screening.observe(candidate, fitness, lambda: self.tree_of(candidate.id, candidate.tree))
        self.population.append((candidate.id, candidate.tree, fitness))
        while len(self.population) > self.population_size:  # more than one after the kept rejoined
            dead = self.population.pop(0)[0]
            self.forget(dead)
            self.rung_of.pop(dead, None)
        if self.restart.stalled(fitness, self.population_size) and not self._initial_left:
            self._restart()

    def _restart(self) -> None:
        """Empty the population but its `restart_keep` best; the next P (grown) candidates are
        fresh samples."""
        # stable: the older first; those kept last time and not yet rejoined compete as the oldest
        ranked = sorted(self._kept + self.population, key=self._rank, reverse=True)
        self._kept = ranked[: self.restart_keep]
        for member, _, _ in ranked[self.restart_keep :]:
            self.forget(member)
        self.population, kept = [], {i for i, _, _ in self._kept}
        self.rung_of = {i: r for i, r in self.rung_of.items() if i in kept}
        self.population_size *= self.restart.growth
        self.tournament_size *= self.restart.growth
        self._initial_left = self.population_size
        self.restart.restarted()

    def _restart_state(self) -> dict[str, Any]:
        return {
            **self.restart.to_json(),
            "initial_left": self._initial_left,
            "population": self.population_size,
            "tournament": self.tournament_size,
            "keep": self.restart_keep,
            "kept": _saved(self._kept),
        }

    def _load_restart_state(self, state: dict[str, Any]) -> None:
        saved = state.get("restart")
        if saved is None:  # written before restarts (2026-11-28): the first population, never restarted
            self._initial_left = max(0, self.population_size - self.next_id)
            return
        self.restart.load(saved)
        self._initial_left = int(saved["initial_left"])
        self.population_size, self.tournament_size = int(saved["population"]), int(saved["tournament"])
        self._kept = _members(saved.get("kept", []))  # absent before restart_keep (2026-11-29)

    def _extra_state(self) -> dict[str, Any]:
        state: dict[str, Any] = {
            "population": _saved(self.population),
            "rung_of": sorted(self.rung_of.items()),
            "restart": self._restart_state(),
        }
        if self.screening is not None:
            state["surrogate"] = self.screening.state_dict()
        return state

    def _load_extra_state(self, state: dict[str, Any]) -> None:
        self.population = _members(state["population"])
        self.rung_of = {int(i): int(r) for i, r in state.get("rung_of", [])}  # absent before 2026-11
        self._load_restart_state(state)
        if self.screening is not None:
            saved = state.get("surrogate")
            if saved is None:
                raise EinspaceError("checkpoint has no surrogate: was the strategy setting 'screen' changed?")
            self.screening.load_state_dict(saved)


def _probability(name: str, value: Any) -> float:
    """A strategy setting that must be a probability in [0, 1]."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= 1:
        raise EinspaceError(f"strategy setting {name!r} must be a probability in [0, 1], got {value!r}")
    return float(value)


def _cost_weight(value: Any, screen: int) -> float:
    """`screen_cost`: a number >= 0, above 0 only where there is a screen to weigh cost in."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < float("inf"):
        raise EinspaceError(
            f"strategy setting 'screen_cost' must be a number >= 0 (0: cost ignored), got {value!r}"
        )
    if value and screen < 2:
        raise EinspaceError(
            "strategy setting 'screen_cost' weighs cost in the surrogate's screen, and 'screen' is 1 "
            "(nothing screened): set 'screen' above 1 too"
        )
    return float(value)


def _saved(members: list[tuple[int, str, float]]) -> list[list[Any]]:
    """Population members as a checkpoint holds them: -inf is not JSON, a failure's fitness is null."""
    return [[i, t, None if f == float("-inf") else f] for i, t, f in members]


def _members(saved: list[list[Any]]) -> list[tuple[int, str, float]]:
    """Population members from a checkpoint (`_saved`)."""
    return [(int(i), t, float("-inf") if f is None else float(f)) for i, t, f in saved]

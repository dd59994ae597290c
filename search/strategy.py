"""The ask/tell strategy contract, the search space strategies draw from, and the strategy registry.

A strategy proposes candidates (`ask`) and hears their fitness (`tell`); it never sees a model, an
executor or a store, so it can be tested with a dictionary as the "evaluator" and checkpointed as
JSON. The run loop (`einspace.search.loop`) is the only place where strategy, executor and store meet.
"""

from __future__ import annotations

import random
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from einspace.errors import EinspaceError
from einspace.grammar.model import Grammar
from einspace.registry import Registry
from einspace.sampling import Limits, Sampler, make_sampler
from einspace.sampling.exact import ExactSampler
from einspace.sampling.variation import Variation
from einspace.state import FeatureState
from einspace.tree import Node, content_hash, parse_tree, to_text

__all__ = [
    "Candidate",
    "SearchSpace",
    "Strategy",
    "get_strategy",
    "list_strategies",
    "register_strategy",
    "rng_from_json",
    "rng_to_json",
    "saved_state",
]


@dataclass(frozen=True)
class Candidate:
    """One architecture a strategy wants evaluated. `id`s are issued by the strategy, 0, 1, 2, ...,
    so a resumed strategy re-issues exactly the ids (and trees) an interrupted one would have."""

    id: int
    tree: str  # canonical bracket text (`to_text`), never a pickled tree
    hash: str  # `content_hash` of the tree: computed where the tree object is at hand (parsing is slow)
    origin: str  # "sampled", "seed:<name>", "mutation", "crossover" or "promotion"
    parents: tuple[int, ...] = ()
    fidelity: int | None = None  # what to train it for (epochs); None: the evaluator's own setting
    continues: int | None = None  # the evaluation whose trained state it may go on from (a promotion's)

    @property
    def key(self) -> tuple[str, int | None]:
        """What makes two evaluations the same: the tree and the fidelity it is trained at."""
        return self.hash, self.fidelity

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "tree": self.tree,
            "hash": self.hash,
            "origin": self.origin,
            "parents": list(self.parents),
            "fidelity": self.fidelity,
            "continues": self.continues,
        }

    @staticmethod
    def from_json(data: dict[str, Any]) -> Candidate:
        return Candidate(
            int(data["id"]),
            data["tree"],
            data["hash"],
            data["origin"],
            tuple(data["parents"]),
            data.get("fidelity"),  # absent in checkpoints written before multi-fidelity search
            data.get("continues"),
        )


@dataclass
class SearchSpace:
    """What strategies sample and vary: a grammar, an input, limits, optional seed trees
    (name, bracket text) in the order they are cycled, and the sampling mode (`einspace.sampling`;
    mutation and crossover keep the paper mode's derivations)."""

    grammar: Grammar
    input: FeatureState
    limits: Limits = field(default_factory=Limits)
    seeds: list[tuple[str, str]] = field(default_factory=list)
    sampling: str = "paper"

    def seed_trees(self) -> list[tuple[str, Node]]:
        """The seeds parsed, once: a large seed's text takes milliseconds to parse."""
        if not hasattr(self, "_seed_trees"):
            self._seed_trees = [(name, parse_tree(text)) for name, text in self.seeds]
        return self._seed_trees

    def sampler(self, rng: random.Random) -> Sampler | ExactSampler:
        return make_sampler(self.grammar, self.input, self.limits, self.sampling, rng=rng)

    def variation(self, rng: random.Random, mutations: Mapping[str, float] | None = None) -> Variation:
        """Mutation and crossover on `rng`, with the mutation operators' weights (None: the
        paper's subtree mutation alone)."""
        return Variation(self.grammar, self.input, self.limits, rng=rng, mutations=mutations)


def saved_state(checkpoint: dict[str, Any] | None, key: str) -> dict[str, Any] | None:
    """The state, in a run's checkpoint, of the strategy that saved `key` (one that successive
    halving wraps is under `base`); None when no strategy in it saved `key`."""
    state = checkpoint or {}
    while "base" in state and key not in state:
        state = state["base"]
    return state if key in state else None


def rng_to_json(rng: random.Random) -> list[Any]:
    """The Mersenne Twister state as plain JSON (no pickle): [version, [625 ints], gauss_next]."""
    version, internal, gauss = rng.getstate()
    return [version, list(internal), gauss]


def rng_from_json(data: list[Any]) -> random.Random:
    rng = random.Random()
    rng.setstate((data[0], tuple(data[1]), data[2]))
    return rng


class Strategy(ABC):
    """The ask/tell contract every strategy keeps (the strategy contract tests check each one):

    - `ask()` returns the next `Candidate`, or None when it has nothing to propose right now
      (budget used up, or waiting for results it needs, e.g. an empty population).
    - `tell(id, fitness, partial=False)` is called exactly once per asked id, in any order; fitness
      is maximised and a failed evaluation is told as -inf. Telling an unknown or already-told id
      is an error. `partial`: the result was scored before reaching its fidelity (a time budget
      stopped training); the built-in strategies take its fitness as it is (the shorter training
      already lowers it), and successive halving never promotes it.
      `seconds`: what evaluating it took, where it was measured (None for a failure or a result
      served from the cache); a strategy that weighs cost learns from it, others ignore it.
    - `hear_promotion(id, rung, fitness)` may follow a `tell`: the same tree's result after more
      training (successive halving's higher rungs, where the experiment asks for it).
    - `pending()` lists the asked-but-untold candidates (to re-queue after a crash).
    - `done` is true when the budget is used up and nothing is pending.
    - `live_parents()` names the told candidates it may still vary (none, unless it varies).
    - `state_dict()` is JSON-able and complete (RNG included): a fresh strategy given
      `load_state_dict(s.state_dict())` asks exactly what `s` would have asked.
    - Strategies never import torch or ray, and never see the store or the executor.
    """

    name: ClassVar[str]
    state_version: ClassVar[int] = 1
    #: Whether the strategy's result is the mean fitness of what it evaluated (random sampling:
    #: the expected performance of the space) rather than the best; reports print the mean then.
    reports_mean: ClassVar[bool] = False
    #: Whether `tell` takes a multi-objective score ([violation, objectives maximised], None for a
    #: failure: `einspace.search.multi_objective`) instead of the fitness.
    multi_objective: ClassVar[bool] = False
    #: The mutation operators' weights for `self.variation` (`einspace.sampling.variation`);
    #: a strategy that takes them as a setting sets this before `Strategy.__init__`.
    mutations: Mapping[str, float] | None = None

    def __init__(self, space: SearchSpace, random_seed: int = 0, evaluations: int = 1000):
        self.space = space
        self.evaluations = _positive_int("evaluations", evaluations)
        self.rng = random.Random(random_seed)
        self.next_id = 0
        self._pending: dict[int, Candidate] = {}
        self._trees: dict[int, Node] = {}  # id -> parsed tree, for candidates a strategy may vary
        self._bind_rng()

    def _bind_rng(self) -> None:
        """(Re)create the samplers on `self.rng`: after a restore they must draw from the restored stream."""
        self.sampler = self.space.sampler(self.rng)
        self.variation = self.space.variation(self.rng, self.mutations)

    # ---------------------------------------------------------------- the contract
    def ask(self) -> Candidate | None:
        if self.next_id >= self.evaluations:
            return None
        proposal = self._propose()
        if proposal is None:
            return None
        tree, origin, parents = proposal
        text = to_text(tree)
        candidate = Candidate(self.next_id, text, content_hash(tree), origin, parents)
        self.next_id += 1
        self._pending[candidate.id] = candidate
        self._trees[candidate.id] = tree
        return candidate

    def tree_of(self, candidate_id: int, text: str) -> Node:
        """The parsed tree of a candidate this strategy asked (parsed again only after a restore)."""
        tree = self._trees.get(candidate_id)
        if tree is None:
            tree = self._trees[candidate_id] = parse_tree(text)
        return tree

    def forget(self, candidate_id: int) -> None:
        """Drop a cached tree the strategy will not vary again."""
        self._trees.pop(candidate_id, None)

    def tell(
        self, candidate_id: int, fitness: float, partial: bool = False, seconds: float | None = None
    ) -> None:
        self._observe(self._take_pending(candidate_id), float(fitness))

    def hear_promotion(self, candidate_id: int, rung: int, fitness: float) -> None:  # noqa: B027
        """A later result of a told candidate: successive halving trained its tree on to rung index
        `rung` (1 or more), where it scored `fitness` (`multi_fidelity.strategy_fitness:
        highest_rung`). Strategies that choose nothing by fitness ignore it."""

    def _take_pending(self, candidate_id: int) -> Candidate:
        """The pending candidate `candidate_id`, no longer pending (an error if it was not)."""
        candidate = self._pending.pop(candidate_id, None)
        if candidate is None:
            raise EinspaceError(
                f"strategy {self.name!r} was told about candidate {candidate_id}, not pending"
            )
        return candidate

    def pending(self) -> list[Candidate]:
        return sorted(self._pending.values(), key=lambda c: c.id)

    def live_parents(self) -> set[int]:
        """The evaluated candidates this strategy may still choose as parents of new ones (weight
        inheritance keeps their weights); none for strategies that do not vary what they found."""
        return set()

    @property
    def done(self) -> bool:
        return self.next_id >= self.evaluations and not self._pending

    def state_dict(self) -> dict[str, Any]:
        return {
            "strategy": self.name,
            "version": self.state_version,
            "rng": rng_to_json(self.rng),
            "next_id": self.next_id,
            "pending": [c.to_json() for c in self.pending()],
            **self._extra_state(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("strategy") != self.name or state.get("version") != self.state_version:
            raise EinspaceError(
                f"checkpoint is for strategy {state.get('strategy')!r} version {state.get('version')}, "
                f"not {self.name!r} version {self.state_version}"
            )
        self.rng = rng_from_json(state["rng"])
        self.next_id = int(state["next_id"])
        self._pending = {c.id: c for c in map(Candidate.from_json, state["pending"])}
        self._trees = {}
        self._load_extra_state(state)
        self._bind_rng()

    # ---------------------------------------------------------------- for subclasses
    @abstractmethod
    def _propose(self) -> tuple[Node, str, tuple[int, ...]] | None:
        """(tree, origin, parent ids) for the next candidate, or None to wait."""

    def _observe(self, candidate: Candidate, fitness: float) -> None:
        """Hear one result; stateless strategies just forget the tree."""
        self.forget(candidate.id)

    def _extra_state(self) -> dict[str, Any]:
        return {}

    def _load_extra_state(self, state: dict[str, Any]) -> None:  # noqa: B027 - optional hook
        pass


def _positive_int(name: str, value: Any, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise EinspaceError(f"strategy setting {name!r} must be an integer >= {minimum}, got {value!r}")
    return value


#: Every strategy class by name; the built-in ones register as their modules are first needed.
STRATEGIES: Registry[type[Strategy]] = Registry(
    "strategy",
    builtins=(
        "einspace.search.eda",
        "einspace.search.evolution",
        "einspace.search.pareto_evolution",
        "einspace.search.random_search",
    ),
)


def register_strategy(cls: type[Strategy]) -> type[Strategy]:
    """Class decorator: make a strategy available by its `name` (a duplicate is an error)."""
    return STRATEGIES.register(cls)


def list_strategies() -> list[str]:
    return STRATEGIES.names()


def get_strategy(
    name: str, space: SearchSpace, random_seed: int = 0, settings: dict[str, Any] | None = None
) -> Strategy:
    """A strategy by registered name; an unknown name or setting is an error naming it."""
    return STRATEGIES.create(name, settings, space, random_seed=random_seed)

"""Several objectives and hard limits in one search: the experiment's `multi_objective` section,
its checks, and how a stored result becomes a point to rank.

An objective is a quantity with a direction: the evaluator's `fitness` (validation accuracy for
classification), analytic counts from the tree (`params`, `flops`, `activation_memory` in bytes at
`batch_size`), `latency_ms` (measured by the training evaluator when its `latency_batch_size`
setting is given), or `metric:<name>`, any metric the evaluator returns. A constraint bounds a
quantity (`max:` or `min:`): as a hard `limit` a violating result is infeasible, ranked below every
feasible one (NSGA-II's constrained dominance, `einspace.search.pareto`), and a tree violating a
limit on an analytic quantity is refused before it is trained; as an `objective`, its excess over
the bound is one more objective, minimised.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from einspace.search import compute
from einspace.search.pareto import hypervolume, non_dominated
from einspace.search.store import Record, Status

if TYPE_CHECKING:
    from einspace.checker import CheckedTree
    from einspace.grammar.model import Grammar
    from einspace.state import FeatureState

__all__ = ["DIRECTIONS", "QUANTITIES", "MultiObjectiveSection", "Objectives", "check_multi_objective"]

#: Objective directions.
DIRECTIONS = ("min", "max")
#: Built-in quantities: name -> (default direction, where the value comes from).
QUANTITIES: dict[str, tuple[str, str]] = {
    "fitness": ("max", "result"),
    "params": ("min", "analytic"),
    "flops": ("min", "analytic"),
    "activation_memory": ("min", "analytic"),
    "latency_ms": ("min", "result"),
}
#: Prefix of an evaluator metric named as a quantity.
METRIC = "metric:"
#: The evaluator setting that makes the training evaluator measure `latency_ms`.
LATENCY_SETTING = "latency_batch_size"
_CONSTRAINT_KINDS = ("limit", "objective")
#: Trees whose analytic counts are kept (a tree is counted when refused or not, then scored).
_CACHED_TREES = 4096


@dataclass(frozen=True)
class MultiObjectiveSection:
    """The objectives with their directions ([{name, direction}]), constraints ([{name, max|min,
    kind}]), the hypervolume's reference point (one value per objective, constraint objectives
    last, in their own units) and the batch size of `activation_memory`. Off with no objectives."""

    objectives: tuple[dict[str, Any], ...] = ()
    constraints: tuple[dict[str, Any], ...] = ()
    reference: tuple[float, ...] | None = None
    batch_size: int = 1

    @property
    def enabled(self) -> bool:
        return bool(self.objectives)


@dataclass(frozen=True)
class Term:
    """One objective: a quantity and its direction; `bound` (max|min) and `limit` for a constraint
    kept as an objective, whose value is the quantity's excess over the limit."""

    quantity: str
    direction: str
    bound: str | None = None
    limit: float = 0.0

    @property
    def label(self) -> str:
        return self.quantity if self.bound is None else f"{self.quantity} beyond {self.bound} {self.limit:g}"

    def value(self, raw: float) -> float:
        """The objective's value in its own units."""
        return raw if self.bound is None else _excess(raw, self.bound, self.limit)

    def maximised(self, raw: float) -> float:
        value = self.value(raw)
        return value if self.direction == "max" else -value


def _excess(raw: float, bound: str, limit: float) -> float:
    return max(0.0, raw - limit) if bound == "max" else max(0.0, limit - raw)


@dataclass(frozen=True)
class Limit:
    """A hard constraint: `quantity` at most (`bound` max) or at least (min) `limit`."""

    quantity: str
    bound: str
    limit: float

    def violation(self, raw: float) -> float:
        """How far beyond the limit, relative to it (so that limits in different units add up)."""
        return _excess(raw, self.bound, self.limit) / (abs(self.limit) or 1.0)

    def describe(self, raw: float) -> str:
        return f"{self.quantity} {raw:.4g} {'>' if self.bound == 'max' else '<'} {self.limit:g}"


def _source(quantity: str) -> str:
    return QUANTITIES[quantity][1] if quantity in QUANTITIES else "result"


@dataclass
class Objectives:
    """The objectives and limits of an experiment, applied to the trees and results of its run."""

    terms: list[Term]
    limits: list[Limit]
    reference: tuple[float, ...] | None
    batch_size: int
    grammar: Grammar
    input: FeatureState
    _analytic: dict[str, dict[str, float]] = field(default_factory=dict, repr=False)

    @staticmethod
    def of(section: MultiObjectiveSection, grammar: Grammar, input: FeatureState) -> Objectives | None:
        """The section's objectives (None when it names none); the section was checked."""
        if not section.enabled:
            return None
        terms = [Term(o["name"], o.get("direction") or QUANTITIES[o["name"]][0]) for o in section.objectives]
        limits = []
        for c in section.constraints:
            bound = "max" if "max" in c else "min"
            if c.get("kind", "limit") == "objective":
                terms.append(Term(c["name"], "min", bound, float(c[bound])))
            else:
                limits.append(Limit(c["name"], bound, float(c[bound])))
        return Objectives(terms, limits, section.reference, section.batch_size, grammar, input)

    @property
    def labels(self) -> list[str]:
        return [t.label for t in self.terms]

    def analytic(self, tree: str) -> dict[str, float]:
        """Parameters, FLOPs and activation bytes of a tree, from the checked tree (cached)."""
        if tree not in self._analytic:
            from einspace.checker import check_tree
            from einspace.tree import parse_tree

            if len(self._analytic) >= _CACHED_TREES:  # a long search must not grow the driver without end
                self._analytic.clear()

            self._analytic[tree] = _counts(
                check_tree(parse_tree(tree), self.grammar, self.input), self.batch_size
            )
        return self._analytic[tree]

    def refusal(self, tree: str) -> str | None:
        """Why a tree is refused before training (a limit on an analytic quantity it breaks), or None."""
        needed = [lim for lim in self.limits if _source(lim.quantity) == "analytic"]
        if not needed:
            return None
        counts = self.analytic(tree)
        broken = [
            lim.describe(counts[lim.quantity]) for lim in needed if lim.violation(counts[lim.quantity]) > 0
        ]
        return f"infeasible before training: {', '.join(broken)}" if broken else None

    def raw(self, record: Record) -> dict[str, float] | None:
        """Every quantity the objectives and limits read, for a successful result (None: a failed
        one, or one without a metric an objective needs)."""
        if record.status == Status.FAILED or record.fitness is None or not math.isfinite(record.fitness):
            return None  # a cached copy of a failure is a failure too
        values: dict[str, float] = {}
        for quantity in {t.quantity for t in self.terms} | {lim.quantity for lim in self.limits}:
            if quantity == "fitness":
                values[quantity] = record.fitness
            elif _source(quantity) == "analytic":
                values[quantity] = self.analytic(record.tree)[quantity]
            else:
                metric = quantity.removeprefix(METRIC)
                if metric not in record.metrics or not math.isfinite(record.metrics[metric]):
                    return None
                values[quantity] = record.metrics[metric]
        return values

    def values(self, record: Record) -> tuple[float, ...] | None:
        """The objectives' values in their own units (None: no point)."""
        raw = self.raw(record)
        return None if raw is None else tuple(t.value(raw[t.quantity]) for t in self.terms)

    def violation(self, record: Record) -> float:
        raw = self.raw(record)
        return math.inf if raw is None else sum(lim.violation(raw[lim.quantity]) for lim in self.limits)

    def score(self, record: Record) -> list[float] | None:
        """What a multi-objective strategy is told: [total violation, objective values maximised],
        or None for a result without a point (ranked below everything)."""
        raw = self.raw(record)
        if raw is None:
            return None
        violation = sum(lim.violation(raw[lim.quantity]) for lim in self.limits)
        return [violation, *(t.maximised(raw[t.quantity]) for t in self.terms)]

    def front(self, history: Iterable[Record]) -> list[tuple[Record, tuple[float, ...]]]:
        """The feasible non-dominated results with their values, one per point (the first result
        to reach it), best first in the first objective."""
        points: dict[tuple[float, ...], Record] = {}
        for r in history:
            score = self.score(r)
            if score is not None and score[0] == 0:
                points.setdefault(tuple(score[1:]), r)
        items = [(r, point) for point, r in points.items()]
        kept = [items[i] for i in non_dominated([p for _, p in items])]
        kept.sort(key=lambda item: -item[1][0])
        return [(r, self.values(r)) for r, _ in kept]  # type: ignore[misc]

    def hypervolume_over_compute(self, history: list[Record]) -> list[tuple[float, float]]:
        """(cumulative compute seconds, hypervolume of the feasible results so far against the
        reference point) after each result; empty without a reference point."""
        if self.reference is None:
            return []
        reference = tuple(
            r if t.direction == "max" else -r for t, r in zip(self.terms, self.reference, strict=True)
        )
        front: list[tuple[float, ...]] = []
        spent, volume, curve = 0.0, 0.0, []
        for r in history:
            spent += compute.compute_of(r)
            score = self.score(r)
            if score is not None and score[0] == 0:
                point = tuple(score[1:])
                if not any(all(f >= p for f, p in zip(kept, point, strict=True)) for kept in front):
                    front = [f for f in front if not all(p >= x for p, x in zip(point, f, strict=True))] + [
                        point
                    ]
                    volume = hypervolume(front, reference)
            curve.append((spent, volume))
        return curve


def _counts(checked: CheckedTree, batch_size: int) -> dict[str, float]:
    from einspace.evaluators.budgets import activation_bytes

    return {
        "params": float(checked.params),
        "flops": float(checked.flops),
        "activation_memory": float(activation_bytes(checked, batch_size)),
    }


def _known(name: Any) -> bool:
    return isinstance(name, str) and (
        name in QUANTITIES or (name.startswith(METRIC) and len(name) > len(METRIC))
    )


def _entries(data: dict[str, Any], key: str, allowed: tuple[str, ...], source: str) -> list[dict[str, Any]]:
    """The mappings listed under multi_objective.`key`, each with known keys and a known name."""
    from einspace.search.config import ConfigError

    known = ", ".join(sorted(QUANTITIES)) + f" or {METRIC}<evaluator metric>"
    for i, entry in enumerate(data[key]):
        where = f"multi_objective.{key}[{i}]"
        if not isinstance(entry, dict):
            raise ConfigError(f"{source}: {where} must be a mapping with a name, got {entry!r}")
        unknown = sorted(set(entry) - set(allowed))
        if unknown:
            raise ConfigError(f"{source}: unknown key {where}.{unknown[0]} (known: {', '.join(allowed)})")
        if not _known(entry.get("name")):
            raise ConfigError(
                f"{source}: {where}.name: unknown quantity {entry.get('name')!r} (known: {known})"
            )
    return list(data[key])


def check_multi_objective(data: dict[str, Any], source: str) -> None:
    """The `multi_objective` section of checked experiment data, and what it asks of the rest
    (the evaluator's latency setting, no successive halving): a ConfigError naming the key."""
    from einspace.search.config import ConfigError

    m = data["multi_objective"]
    objectives = _entries(m, "objectives", ("name", "direction"), source)
    constraints = _entries(m, "constraints", ("name", "max", "min", "kind"), source)
    if not objectives:
        if constraints or m["reference"] is not None:
            raise ConfigError(
                f"{source}: multi_objective.constraints and reference need multi_objective.objectives"
            )
        return
    names = [o["name"] for o in objectives]
    for i, o in enumerate(objectives):
        direction = o.get("direction") or QUANTITIES.get(o["name"], (None,))[0]
        if direction not in DIRECTIONS:
            raise ConfigError(
                f"{source}: multi_objective.objectives[{i}].direction must be 'min' or 'max', "
                f"got {o.get('direction')!r}"
            )
        if names.index(o["name"]) != i:
            raise ConfigError(f"{source}: multi_objective.objectives[{i}].name: {o['name']!r} is named twice")
    extra = 0
    for i, c in enumerate(constraints):
        where = f"multi_objective.constraints[{i}]"
        bounds = [b for b in ("max", "min") if b in c]
        if len(bounds) != 1 or isinstance(c[bounds[0]], bool) or not isinstance(c[bounds[0]], int | float):
            raise ConfigError(f"{source}: {where} must give one number, max or min, got {c!r}")
        if c.get("kind", "limit") not in _CONSTRAINT_KINDS:
            raise ConfigError(f"{source}: {where}.kind must be 'limit' or 'objective', got {c.get('kind')!r}")
        extra += c.get("kind", "limit") == "objective"
    reference = m["reference"]
    if reference is not None and (
        len(reference) != len(objectives) + extra
        or not all(isinstance(x, int | float) and not isinstance(x, bool) for x in reference)
    ):
        raise ConfigError(
            f"{source}: multi_objective.reference must be {len(objectives) + extra} numbers, one per "
            "objective "
            f"(constraints kept as objectives last), got {list(reference)!r}"
        )
    if isinstance(m["batch_size"], bool) or m["batch_size"] < 1:
        raise ConfigError(
            f"{source}: multi_objective.batch_size must be a positive integer, got {m['batch_size']!r}"
        )
    if "latency_ms" in names + [c["name"] for c in constraints]:
        batch = data["evaluator"]["settings"].get(LATENCY_SETTING)
        if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
            raise ConfigError(
                f"{source}: latency_ms is measured by the evaluator: evaluator.settings.{LATENCY_SETTING} "
                "must be "
                f"the batch size to time a forward pass at (a positive integer), got {batch!r}"
            )
    if data["multi_fidelity"]["scheduler"] != "none":
        raise ConfigError(
            f"{source}: multi_fidelity.scheduler {data['multi_fidelity']['scheduler']!r} promotes by one "
            "fitness; "
            "it cannot be combined with multi_objective.objectives (use scheduler: none)"
        )


def check_strategy(strategy: Any, enabled: bool, source: str) -> None:
    """A strategy that ranks by the objectives, or one that ignores results (random search):
    a strategy that climbs the fitness alone is refused with objectives, and the other way round."""
    from einspace.search.config import ConfigError
    from einspace.search.random_search import RandomSearch

    if enabled and not (strategy.multi_objective or isinstance(strategy, RandomSearch)):
        raise ConfigError(
            f"{source}: strategy.name {strategy.name!r} climbs the fitness alone; with "
            "multi_objective.objectives "
            "use pareto_evolution or random_search"
        )
    if strategy.multi_objective and not enabled:
        raise ConfigError(f"{source}: strategy.name {strategy.name!r} needs multi_objective.objectives")

"""A run's results read against the compute it spent: what each evaluation cost, the best result so
far after each, and how much went into evaluations that failed.

Compute is `Cost.compute_seconds` (GPU seconds where a GPU trained, else CPU seconds). Cached
duplicates cost nothing. Records of stores written before compute was recorded have no cost and
count as their wall seconds, the closest measure they kept.

The incumbent of a multi-fidelity run is the best result at the highest fidelity reached so far
(a network trained for one epoch is not compared with one trained for eight); a run without
fidelities has one level, so its incumbent is simply its best result.
"""

from __future__ import annotations

import itertools
import math
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from einspace.search.columns import Columns, as_columns
from einspace.search.store import Record, Status
from einspace.search.successive_halving import PROMOTION

__all__ = [
    "ComputeSummary",
    "Tally",
    "best_so_far",
    "compute_of",
    "cumulative",
    "incumbent",
    "incumbents",
    "level",
    "rank",
    "scored",
    "spent",
    "summarise",
    "wasted",
]


def spent(status: str | None, cost_seconds: float | None, seconds: float | None) -> float:
    """Compute seconds of a finished evaluation from its status, its cost's `compute_seconds`
    (None: no cost recorded) and its wall seconds: `compute_of`'s rule, for records and for a
    history's columns alike."""
    if status == Status.CACHED:
        return 0.0
    if cost_seconds is None:
        return seconds or 0.0
    return cost_seconds


def compute_of(record: Record) -> float:
    """Compute seconds one finished evaluation spent (0 for a cached duplicate)."""
    m = record.measured
    return spent(record.status, None if m is None else m.compute_seconds, record.seconds)


def level(fidelity: int | None, fitness: float | None) -> tuple[float, float]:
    """What the incumbent is chosen by, the larger the better: the fidelity asked for (None: the
    evaluator's own, the top), then the fitness."""
    return math.inf if fidelity is None else float(fidelity), fitness if fitness is not None else -math.inf


def rank(record: Record) -> tuple[float, float]:
    """`level` of a record."""
    return level(record.fidelity, record.fitness)


def scored(status: str | None, fitness: float | None) -> bool:
    """Whether a finished evaluation can be the incumbent: not failed, with a finite fitness."""
    return status != Status.FAILED and fitness is not None and math.isfinite(fitness)


def _beats(record: Record, best: Record | None) -> bool:
    """Whether `record` is scored and better than the incumbent `best`: higher fidelity first,
    then higher fitness (ties keep the earlier)."""
    if not scored(record.status, record.fitness):
        return False
    return best is None or rank(record) > rank(best)


def incumbent(history: Iterable[Record]) -> Record | None:
    """The best scored record at the highest fidelity any scored record reached (ties: the first)."""
    best: Record | None = None
    for r in history:
        if _beats(r, best):
            best = r
    return best


def incumbents(history: Columns | Sequence[Record]) -> list[int | None]:
    """After each row of the history, the row of the incumbent then (None before any result)."""
    h = as_columns(history)
    out: list[int | None] = []
    best, top = None, (-math.inf, -math.inf)
    at: object = object()  # the incumbent's fidelity (none yet: equal to none)
    for i, (status, fitness, fidelity) in enumerate(zip(h.status, h.fitness, h.fidelity, strict=True)):
        # at the incumbent's fidelity, no higher fitness: not better (most rows, decided at once)
        worse = fidelity == at and (fitness is None or fitness <= top[1])
        if not worse and scored(status, fitness) and (best is None or level(fidelity, fitness) > top):
            best, top, at = i, level(fidelity, fitness), fidelity
        out.append(best)
    return out


def cumulative(seconds: list[float]) -> list[float]:
    """The running totals of `seconds`, each added to a float total from 0.0 in order (as a loop
    of `total += s` gives them)."""
    return list(itertools.accumulate(seconds, initial=0.0))[1:]


def best_so_far(history: Columns | Sequence[Record]) -> list[tuple[float, float | None]]:
    """After each finished record, in finishing order: (cumulative compute seconds, the
    incumbent's fitness then, None before any result)."""
    h = as_columns(history)
    fitness = h.fitness
    totals = cumulative(h.compute)
    return [
        (total, None if best is None else fitness[best])
        for total, best in zip(totals, incumbents(h), strict=True)
    ]


def wasted(history: Iterable[Record]) -> float:
    """Compute seconds spent on evaluations that failed."""
    return sum(compute_of(r) for r in history if r.status == Status.FAILED)


@dataclass(frozen=True)
class ComputeSummary:
    """What a run spent: in all, on failures, by fidelity, and when the incumbent was found."""

    total: float
    wasted: float
    by_fidelity: dict[int | None, tuple[int, float]]  # fidelity -> (evaluations, compute seconds)
    partial: int  # ok results scored before reaching their fidelity
    incumbent_at: float | None  # cumulative compute when the current incumbent finished
    promoted: int = 0  # evaluations of a promoted tree (successive halving)
    resumable: int = 0  # of them, those from a rung that saves a state (any but 0 epochs)
    continued: int = 0  # of those, the ones that trained on from their lower rung's saved state
    #: fidelity -> how many promotions started from a result at it (successive halving's
    #: realised promotion rate, which an improving strategy pushes above 1/eta)
    promoted_from: dict[int | None, int] = field(default_factory=dict)
    #: (lower fidelity, fidelity) -> (result at the lower, result at the fidelity) of each tree
    #: promoted between them that scored at both: how well a rung foretells the next
    promotion_pairs: dict[tuple[int, int], list[tuple[float, float]]] = field(default_factory=dict)
    incumbent: int | None = None  # the history row of the current incumbent (None: no result)

    @property
    def wasted_share(self) -> float:
        return self.wasted / self.total if self.total else 0.0


def summarise(history: Columns | Sequence[Record]) -> ComputeSummary:
    h = as_columns(history)
    by_fidelity: dict[int | None, tuple[int, float]] = {}
    totals = cumulative(h.compute)
    best = incumbents(h)[-1] if totals else None
    for status, fidelity, seconds in zip(h.status, h.fidelity, h.compute, strict=True):
        if status != Status.CACHED:
            n, so_far = by_fidelity.get(fidelity, (0, 0.0))
            by_fidelity[fidelity] = (n + 1, so_far + seconds)
    partial = sum(p and s == Status.OK for p, s in zip(h.partial, h.status, strict=True))
    promoted = [
        i
        for i, (o, s) in enumerate(zip(h.origin, h.status, strict=True))
        if o == PROMOTION and s != Status.CACHED
    ]
    row_of = {job: i for i, job in enumerate(h.id)}
    # the row each promotion started from: its parent evaluation's
    parent = {i: row_of.get(next(iter(h.parents_of(i)), None)) for i in promoted}
    source = {i: None if p is None else h.fidelity[p] for i, p in parent.items()}
    pairs: dict[tuple[int, int], list[tuple[float, float]]] = {}
    for i, p in parent.items():
        if p is not None and all(scored(h.status[j], h.fitness[j]) for j in (p, i)):
            pairs.setdefault((h.fidelity[p], h.fidelity[i]), []).append((h.fitness[p], h.fitness[i]))
    resumable = [i for i in promoted if source[i] != 0]
    continued = sum(h.metrics_of(i).get("continued_from_epoch", 0) > 0 for i in resumable)
    promoted_from = Counter(source.values())
    wasted = sum(c for c, s in zip(h.compute, h.status, strict=True) if s == Status.FAILED)
    return ComputeSummary(
        totals[-1] if totals else 0.0,
        wasted,
        by_fidelity,
        partial,
        None if best is None else totals[best],
        len(promoted),
        len(resumable),
        continued,
        dict(promoted_from),
        pairs,
        best,
    )


@dataclass
class Tally:
    """What finished records add up to, as a search's progress display counts them: their ids
    (each is counted once), the architectures done (promotions apart), failures, cached copies,
    compute spent and wasted, and the incumbent. `Store.tally` sums a run's in SQL."""

    ids: set[int] = field(default_factory=set)
    done: int = 0
    promoted: int = 0
    failed: int = 0
    cached: int = 0
    compute: float = 0.0
    wasted: float = 0.0
    best: Record | None = None

    @classmethod
    def of(cls, records: list[Record]) -> Tally:
        promoted = sum(r.origin == PROMOTION for r in records)
        return cls(
            {r.id for r in records},
            len(records) - promoted,
            promoted,
            sum(r.status == Status.FAILED for r in records),
            sum(r.status == Status.CACHED for r in records),
            sum(map(compute_of, records)),
            wasted(records),
            incumbent(records),
        )

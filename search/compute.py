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

import math
from collections.abc import Iterable
from dataclasses import dataclass, field

from einspace.search.store import Record, Status
from einspace.search.successive_halving import PROMOTION

__all__ = ["ComputeSummary", "Tally", "best_so_far", "compute_of", "incumbent", "rank", "summarise", "wasted"]


def compute_of(record: Record) -> float:
    """Compute seconds one finished evaluation spent (0 for a cached duplicate)."""
    if record.status == Status.CACHED:
        return 0.0
    if record.measured is None:
        return record.seconds or 0.0
    return record.measured.compute_seconds


def rank(record: Record) -> tuple[float, float]:
    """What the incumbent is chosen by, the larger the better: the fidelity the record was asked to
    train for (None: the evaluator's own, the top), then its fitness."""
    level = math.inf if record.fidelity is None else float(record.fidelity)
    return level, record.fitness if record.fitness is not None else -math.inf


def _beats(record: Record, best: Record | None) -> bool:
    """Whether `record` is scored and better than the incumbent `best`: higher fidelity first,
    then higher fitness (ties keep the earlier)."""
    if record.status == Status.FAILED or record.fitness is None or not math.isfinite(record.fitness):
        return False
    return best is None or rank(record) > rank(best)


def incumbent(history: Iterable[Record]) -> Record | None:
    """The best scored record at the highest fidelity any scored record reached (ties: the first)."""
    best: Record | None = None
    for r in history:
        if _beats(r, best):
            best = r
    return best


def best_so_far(history: Iterable[Record]) -> list[tuple[float, float | None]]:
    """After each finished record, in finishing order: (cumulative compute seconds, the
    incumbent's fitness then, None before any result)."""
    points: list[tuple[float, float | None]] = []
    total, best = 0.0, None
    for r in history:
        total += compute_of(r)
        if _beats(r, best):
            best = r
        points.append((total, best.fitness if best is not None else None))
    return points


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
    continued: int = 0  # of them, those that trained on from their lower rung's saved state

    @property
    def wasted_share(self) -> float:
        return self.wasted / self.total if self.total else 0.0


def summarise(history: list[Record]) -> ComputeSummary:
    by_fidelity: dict[int | None, tuple[int, float]] = {}
    total, at = 0.0, None
    best = incumbent(history)
    for r in history:
        spent = compute_of(r)
        total += spent
        if r is best:
            at = total
        if r.status != Status.CACHED:
            n, seconds = by_fidelity.get(r.fidelity, (0, 0.0))
            by_fidelity[r.fidelity] = (n + 1, seconds + spent)
    partial = sum(r.partial and r.status == Status.OK for r in history)
    promoted = [r for r in history if r.origin == PROMOTION and r.status != Status.CACHED]
    continued = sum(r.metrics.get("continued_from_epoch", 0) > 0 for r in promoted if r.metrics)
    return ComputeSummary(total, wasted(history), by_fidelity, partial, at, len(promoted), continued)


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

"""Pareto maths for multi-objective search: dominance, non-dominated sorting, crowding distance
and the exact hypervolume. Pure Python on tuples, every objective *maximised* (callers flip the
sign of a minimised one), so that strategies can use it without numpy or torch.

Non-dominated sorting and crowding distance are those of NSGA-II (Deb, Pratap, Agarwal and
Meyarivan, "A fast and elitist multiobjective genetic algorithm: NSGA-II", IEEE TEC 2002), with
its constrained dominance: a feasible point dominates every infeasible one, and of two infeasible
points the one with the smaller total violation dominates.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

__all__ = [
    "crowding_distance",
    "dominates",
    "hypervolume",
    "non_dominated",
    "non_dominated_ranks",
]

Point = Sequence[float]


def dominates(a: Point, b: Point) -> bool:
    """Whether `a` is at least as good as `b` in every objective and better in one (maximising)."""
    return all(x >= y for x, y in zip(a, b, strict=True)) and any(x > y for x, y in zip(a, b, strict=True))


def _constrained_dominates(a: Point, va: float, b: Point, vb: float) -> bool:
    if va > 0 or vb > 0:
        return va < vb
    return dominates(a, b)


def non_dominated_ranks(points: Sequence[Point], violations: Sequence[float] | None = None) -> list[int]:
    """The front each point is on, 0 for the non-dominated ones (Deb et al.'s fast non-dominated
    sort, O(M N^2)); with `violations` (0: feasible), by constrained dominance."""
    n = len(points)
    v = list(violations) if violations is not None else [0.0] * n
    dominated_by = [0] * n  # how many points dominate i
    dominating: list[list[int]] = [[] for _ in range(n)]  # the points i dominates
    for i in range(n):
        for j in range(i + 1, n):
            if _constrained_dominates(points[i], v[i], points[j], v[j]):
                dominating[i].append(j)
                dominated_by[j] += 1
            elif _constrained_dominates(points[j], v[j], points[i], v[i]):
                dominating[j].append(i)
                dominated_by[i] += 1
    ranks = [0] * n
    front = [i for i in range(n) if dominated_by[i] == 0]
    rank = 0
    while front:
        following = []
        for i in front:
            ranks[i] = rank
            for j in dominating[i]:
                dominated_by[j] -= 1
                if dominated_by[j] == 0:
                    following.append(j)
        front, rank = following, rank + 1
    return ranks


def non_dominated(points: Sequence[Point]) -> list[int]:
    """The indices of the points no other point dominates, in order."""
    return [i for i, r in enumerate(non_dominated_ranks(points)) if r == 0]


def crowding_distance(points: Sequence[Point]) -> list[float]:
    """NSGA-II's crowding distance of each point of one front: the sum over objectives of the gap
    between its two neighbours in that objective, divided by the objective's range; the extremes
    of each objective get infinity, so that the ends of the front are kept."""
    n = len(points)
    if n == 0:
        return []
    distance = [0.0] * n
    for m in range(len(points[0])):
        order = sorted(range(n), key=lambda i: points[i][m])
        low, high = points[order[0]][m], points[order[-1]][m]
        distance[order[0]] = distance[order[-1]] = math.inf
        if high == low:
            continue
        for before, i, after in zip(order, order[1:], order[2:], strict=False):
            distance[i] += (points[after][m] - points[before][m]) / (high - low)
    return distance


def hypervolume(points: Sequence[Point], reference: Point) -> float:
    """The exact volume dominated by `points` and bounded by `reference` (maximising: the union of
    the boxes [reference, p]); points not better than the reference in every objective add nothing.
    Two objectives: one sweep, O(N log N). More: slicing along the last objective (Hypervolume by
    Slicing Objectives, While et al. 2006), exponential in the number of objectives and fine for
    the small fronts a search keeps."""
    ref = tuple(reference)
    inside = [tuple(p) for p in points if all(x > r for x, r in zip(p, ref, strict=True))]
    front = [inside[i] for i in non_dominated(inside)] if inside else []
    return _slice_volume(sorted(set(front)), ref)


def _slice_volume(front: list[tuple[float, ...]], ref: tuple[float, ...]) -> float:
    if not front:
        return 0.0
    if len(ref) == 1:
        return max(p[0] for p in front) - ref[0]
    if len(ref) == 2:  # the sweep: best first objective first, each adds its strip
        volume, height = 0.0, ref[1]
        for x, y in sorted(front, reverse=True):
            if y > height:
                volume += (x - ref[0]) * (y - height)
                height = y
        return volume
    # slices along the last objective: between consecutive levels, the (d-1)-volume of the points
    # that reach above the slice
    levels = sorted({p[-1] for p in front}, reverse=True)
    volume = 0.0
    for upper, lower in zip(levels, [*levels[1:], ref[-1]], strict=True):
        above = [p[:-1] for p in front if p[-1] >= upper]
        reduced = [above[i] for i in non_dominated(above)]
        volume += _slice_volume(sorted(set(reduced)), ref[:-1]) * (upper - lower)
    return volume

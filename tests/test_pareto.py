"""Pareto maths against brute force: ranks by peeling fronts pairwise, crowding by nearest
neighbours, hypervolume by counting grid cells."""

from __future__ import annotations

import itertools
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from einspace.search.pareto import crowding_distance, dominates, hypervolume, non_dominated_ranks


def _peeled_ranks(points: list[tuple[int, ...]], violations: list[float]) -> list[int]:
    """Ranks by definition: repeatedly take the points nothing left beats (constrained dominance)."""

    def beats(i: int, j: int) -> bool:
        if violations[i] > 0 or violations[j] > 0:
            return violations[i] < violations[j]
        a, b = points[i], points[j]
        return all(x >= y for x, y in zip(a, b, strict=True)) and a != b

    left, ranks, rank = set(range(len(points))), [0] * len(points), 0
    while left:
        front = {i for i in left if not any(beats(j, i) for j in left)}
        for i in front:
            ranks[i] = rank
        left -= front
        rank += 1
    return ranks


coordinates = st.integers(0, 5)


@settings(max_examples=150, deadline=None)
@given(
    st.integers(1, 3).flatmap(
        lambda m: st.lists(
            st.tuples(st.tuples(*[coordinates] * m), st.sampled_from([0.0, 0.0, 1.0, 2.5])), max_size=14
        )
    )
)
def test_ranks_match_peeling_fronts(items: list[tuple[tuple[int, ...], float]]) -> None:
    points, violations = [p for p, _ in items], [v for _, v in items]
    assert non_dominated_ranks(points, violations) == _peeled_ranks(points, violations)


def test_an_infeasible_point_ranks_below_every_feasible_one() -> None:
    points = [(0.0, 0.0), (10.0, 10.0), (5.0, 5.0)]
    assert non_dominated_ranks(points, [0.0, 3.0, 1.0]) == [0, 2, 1]
    assert non_dominated_ranks(points) == [2, 0, 1]


def _neighbour_crowding(points: list[tuple[float, ...]]) -> list[float]:
    """Crowding by definition, for distinct values: the gap between the nearest values below and
    above in each objective, infinite at either end."""
    out = []
    for p in points:
        total = 0.0
        for m in range(len(p)):
            values = [q[m] for q in points]
            below = [v for v in values if v < p[m]]
            above = [v for v in values if v > p[m]]
            if not below or not above:
                total = math.inf
                break
            total += (min(above) - max(below)) / (max(values) - min(values))
        out.append(total)
    return out


@settings(max_examples=100, deadline=None)
@given(st.integers(1, 3).flatmap(lambda m: st.lists(st.permutations(range(12)), min_size=m, max_size=m)))
def test_crowding_matches_nearest_neighbours(columns: list[list[int]]) -> None:
    # distinct values in each objective: the neighbours in sorted order are unambiguous
    n = 1 + (sum(columns[0][:2]) % 11)
    points = [tuple(float(col[i]) for col in columns) for i in range(n)]
    assert crowding_distance(points) == pytest.approx(_neighbour_crowding(points))


def _grid_volume(points: list[tuple[int, ...]], reference: tuple[int, ...], top: int) -> int:
    """Unit cells between the reference and `top` that some point covers (maximising)."""
    cells = itertools.product(*[range(r, top) for r in reference])
    return sum(any(all(c + 1 <= x for c, x in zip(cell, p, strict=True)) for p in points) for cell in cells)


@settings(max_examples=150, deadline=None)
@given(
    st.integers(2, 4).flatmap(
        lambda m: st.tuples(
            st.lists(st.tuples(*[st.integers(-1, 5)] * m), max_size=9), st.tuples(*[st.integers(-1, 1)] * m)
        )
    )
)
def test_hypervolume_counts_the_grid_cells_it_covers(
    case: tuple[list[tuple[int, ...]], tuple[int, ...]],
) -> None:
    points, reference = case
    assert hypervolume(points, reference) == _grid_volume(points, reference, 6)


def test_hypervolume_by_hand() -> None:
    # the union of [0,3]x[0,1] and [0,1]x[0,2]: 3 + 2 - 1
    assert hypervolume([(3.0, 1.0), (1.0, 2.0)], (0.0, 0.0)) == 4.0
    assert hypervolume([(3.0, 1.0), (1.0, 2.0), (2.0, 0.5)], (0.0, 0.0)) == 4.0  # dominated: nothing
    assert hypervolume([(1.0, -1.0)], (0.0, 0.0)) == 0.0  # not better than the reference
    assert hypervolume([(2.0, 2.0, 2.0)], (1.0, 0.0, -1.0)) == 1.0 * 2.0 * 3.0


def test_dominance_needs_a_strict_improvement() -> None:
    assert dominates((1, 2), (1, 1)) and not dominates((1, 1), (1, 1)) and not dominates((2, 0), (1, 1))

"""Learned probabilities (einspace.grammar.learning): exact refusals and the shrinkage's grid point.

Written in the mutation-testing round (scripts/mutation.py): the shrinkage is checked against a
blend computed here by hand, so that the bisection must find exactly the smallest grid step.
"""

from __future__ import annotations

import pytest

from einspace import load_grammar
from einspace.errors import EinspaceError
from einspace.grammar.analysis import analyse
from einspace.grammar.learning import learn_probabilities, with_probabilities
from einspace.state import input_state
from einspace.tree import parse_tree

X = input_state((3, 16, 16))


def _setting():
    """A grammar of rho 2/3 and a tree of many M -> M M choices: the raw estimate has rho 0.963."""
    grammar = load_grammar("einspace").with_probability("M", 3, 0.6)
    leaves = "(M (C identity))"
    for _ in range(5):
        leaves = f"(M {leaves} {leaves})"
    return grammar, parse_tree(f"(S {leaves} (M (C norm)))")


def _rows(grammar) -> list[list[float]]:
    return [[a.probability for a in rule.alternatives] for rule in grammar.rules]


def test_probability_tables_of_the_wrong_size_or_sum_are_refused() -> None:
    grammar = load_grammar("einspace")
    rows = _rows(grammar)
    with pytest.raises(EinspaceError) as info:
        with_probabilities(grammar, rows[:-1])
    assert str(info.value) == f"{len(rows) - 1} probability rows for {len(rows)} rules"
    assert len(rows[0]) == 3
    for bad in ([0.5, 0.5], [0.45, 0.45, 0.05], [0.5, 0.5, 0.05]):  # too short; sums 0.95 and 1.05
        with pytest.raises(EinspaceError) as info:
            with_probabilities(grammar, [bad, *rows[1:]])
        assert (
            str(info.value)
            == f"rule {grammar.rules[0].symbol}: {bad} are not positive probabilities summing to 1"
        )


@pytest.mark.parametrize("max_rho", [0.0, 1.0, 1.5, -0.1])
def test_max_rho_outside_the_open_unit_interval_is_refused(max_rho: float) -> None:
    grammar, tree = _setting()
    with pytest.raises(EinspaceError) as info:
        learn_probabilities(grammar, X, [tree], max_rho=max_rho)
    assert str(info.value) == f"max_rho must be in (0, 1), got {max_rho}"


def test_the_shrinkage_is_the_smallest_grid_step_within_the_bound() -> None:
    grammar, tree = _setting()
    raw = learn_probabilities(grammar, X, [tree], prior_strength=1.0, max_rho=0.99, modes=("im",))
    assert raw.shrink == 0.0 and set(raw.spectral_radius) == {"im"}
    t = 1 / 32  # the first grid step, blended by hand
    rows = [
        [(1 - t) * e + t * o for e, o in zip(er, orow, strict=True)]
        for er, orow in zip(_rows(raw.grammar), _rows(grammar), strict=True)
    ]
    rho = analyse(with_probabilities(grammar, rows), "im").spectral_radius
    assert 2 / 3 < rho < raw.spectral_radius["im"]
    # a bound of exactly that rho: the first step is allowed (rho == bound), the estimate is not
    learned = learn_probabilities(grammar, X, [tree], prior_strength=1.0, max_rho=rho, modes=("im",))
    assert learned.shrink == 1 / 32
    assert learned.spectral_radius == {"im": rho}
    for got, want in zip(_rows(learned.grammar), rows, strict=True):
        assert got == pytest.approx(want)


def test_a_bound_below_the_original_keeps_the_original() -> None:
    grammar, tree = _setting()
    learned = learn_probabilities(grammar, X, [tree], prior_strength=1.0, max_rho=0.01, modes=("im",))
    # the bound is the original's own rho (2/3): every blend short of the original exceeds it
    assert learned.shrink == 1.0 and learned.grammar == grammar
    assert learned.spectral_radius == {"im": analyse(grammar, "im").spectral_radius}


def test_the_radii_are_of_the_modes_asked_for() -> None:
    grammar, tree = _setting()
    col = learn_probabilities(grammar, X, [tree], prior_strength=1.0, modes=("col",))
    assert col.spectral_radius == {"col": analyse(col.grammar, "col").spectral_radius}
    both = learn_probabilities(grammar, X, [tree], prior_strength=1.0)
    assert set(both.spectral_radius) == {"im", "col"}

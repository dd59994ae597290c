"""Learned probabilities (einspace.grammar.learning): exact refusals and the shrinkage's grid point.

Written in the mutation-testing round (scripts/mutation.py): the shrinkage is checked against a
blend computed here by hand, so that the bisection must find exactly the smallest grid step.
"""

from __future__ import annotations

import pytest

from einspace import load_grammar
from einspace.errors import EinspaceError, TreeError
from einspace.grammar import parse_grammar
from einspace.grammar.analysis import analyse
from einspace.grammar.learning import _bounds, learn_probabilities, rule_counts, with_probabilities
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


# ------------------------------------------------- the bisection against every grid step, and _bounds


@pytest.fixture(autouse=True)
def _fresh_bounds() -> None:
    """Every test analyses its grammar afresh: _bounds' cache may hold what an earlier test, or a
    process this one was forked from (mutmut's), computed with other code."""
    _bounds.cache_clear()


def _blend_rho(raw, grammar, step: int) -> tuple[list[list[float]], float]:
    """The rows `step` / 32 of the way from the raw estimate back to `grammar`, and their im rho."""
    t = step / 32
    rows = [
        [(1 - t) * e + t * o for e, o in zip(er, orow, strict=True)]
        for er, orow in zip(_rows(raw.grammar), _rows(grammar), strict=True)
    ]
    return rows, analyse(with_probabilities(grammar, rows), "im").spectral_radius


@pytest.fixture
def counted_blends(monkeypatch) -> list[int]:
    """Counts the candidate grammars learn_probabilities builds, and stops it after 12 (the
    bisection over 32 steps needs 1 + 5): a loop that never ends fails here within a second."""
    import einspace.grammar.learning as learning

    calls: list[int] = []
    original = learning.with_probabilities

    def counting(grammar, rows):
        calls.append(1)
        if len(calls) > 12:
            raise RuntimeError("the bisection did not end after 12 blends")
        return original(grammar, rows)

    monkeypatch.setattr(learning, "with_probabilities", counting)
    return calls


@pytest.fixture(scope="module")
def raw_estimate():
    """The setting's unshrunk estimate (prior strength 1), computed once for the tests below."""
    grammar, tree = _setting()
    return learn_probabilities(grammar, X, [tree], prior_strength=1.0, max_rho=0.99, modes=("im",))


@pytest.mark.parametrize("step", [1, 13, 20, 31])
def test_the_shrinkage_is_the_grid_step_just_within_the_bound(
    step: int, raw_estimate, counted_blends
) -> None:
    grammar, tree = _setting()
    rows, bound = _blend_rho(raw_estimate, grammar, step)
    # rho falls along the blend, so the smallest step within a bound of exactly rho(step) is the
    # step itself when the step before it exceeds that bound
    assert _blend_rho(raw_estimate, grammar, step - 1)[1] > bound
    learned = learn_probabilities(grammar, X, [tree], prior_strength=1.0, max_rho=bound, modes=("im",))
    assert learned.shrink == step / 32
    assert learned.spectral_radius == {"im": bound}
    assert learned.counts == raw_estimate.counts
    for got, want in zip(_rows(learned.grammar), rows, strict=True):
        assert got == pytest.approx(want)
    assert len(counted_blends) == 1 + 5  # the estimate, then log2(32) halvings


def test_no_step_short_of_the_original_keeps_the_original_after_five_halvings(counted_blends) -> None:
    grammar, tree = _setting()
    learned = learn_probabilities(grammar, X, [tree], prior_strength=1.0, max_rho=0.5, modes=("im",))
    assert learned.shrink == 1.0 and learned.grammar is grammar
    assert learned.spectral_radius == {"im": analyse(grammar, "im").spectral_radius}
    assert len(counted_blends) == 1 + 5


def test_an_estimate_between_max_rho_and_the_originals_rho_is_kept() -> None:
    """The bound is the larger of max_rho and the original's rho: trees that lower rho need no
    shrinking even under a max_rho below the original's."""
    grammar = load_grammar("einspace").with_probability("M", 3, 0.6)
    tree = parse_tree("(S (M (C identity)) (M (C norm)))")
    original = analyse(grammar, "im").spectral_radius
    learned = learn_probabilities(grammar, X, [tree] * 4, prior_strength=2.0, max_rho=0.2, modes=("im",))
    m = next(i for i, r in enumerate(grammar.rules) if r.symbol == "M" and not r.guard)
    old = _rows(grammar)[m]
    # by hand: 8 M nodes, all chose M -> C
    assert _rows(learned.grammar)[m] == pytest.approx(
        [(n + 2 * p) / (8 + 2) for n, p in zip([0, 0, 0, 8], old, strict=True)]
    )
    assert learned.shrink == 0.0
    assert 0.2 < learned.spectral_radius["im"] < original


def test_an_inconsistent_original_is_refused_naming_the_file_and_mode() -> None:
    grammar = load_grammar("einspace").with_probability("M", 0, 0.7)  # M -> M M seven times in ten: rho 1.56
    for modes, mode in ((None, "im"), (("col",), "col")):
        with pytest.raises(EinspaceError) as info:
            learn_probabilities(grammar, X, [], modes=modes)
        want = f"{grammar.path} is itself inconsistent in {mode} mode: nothing to shrink toward"
        assert str(info.value) == want


def test_by_default_only_the_modes_the_grammar_derives_from_are_bounded() -> None:
    grammar = load_grammar("einspace_1d")  # col mode only: im inputs derive nothing
    assert not analyse(grammar, "im").derivable and not analyse(grammar, "im").infinite
    learned = learn_probabilities(grammar, input_state((8, 16)), [])
    assert learned.spectral_radius == {"col": analyse(grammar, "col").spectral_radius}
    assert learned.shrink == 0.0
    assert sum(_rows(learned.grammar), []) == pytest.approx(sum(_rows(grammar), []))
    asked = learn_probabilities(grammar, input_state((8, 16)), [], modes=("im",))
    assert asked.spectral_radius == {"im": analyse(grammar, "im").spectral_radius}


def test_trees_are_checked_against_the_grammar_given() -> None:
    """Counted by hand for a grammar of its own; a tree it cannot derive is refused by the check
    against that grammar (a shape-only check would pass it on to the counting)."""
    grammar = parse_grammar("start S\nS -> identity | leaky_relu @ 0.25\n")
    trees = [parse_tree("(S identity)"), parse_tree("(S leaky_relu)"), parse_tree("(S identity)")]
    assert rule_counts(grammar, X, trees) == [[2, 1]]
    with pytest.raises(TreeError):
        rule_counts(grammar, X, [parse_tree("(S norm)")])

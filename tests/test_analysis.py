"""Grammar consistency analysis (paper App. A.4): hand-built grammars with known answers, then the paper's."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from einspace.errors import EinspaceError
from einspace.grammar.analysis import analyse, critical_probability, format_analysis, label_text
from einspace.grammar.model import (
    Alternative,
    Condition,
    Grammar,
    OpItem,
    ParallelItem,
    RepeatItem,
    Rule,
    SymbolItem,
)
from einspace.ops.registry import Argument, Group, Operation, register_op, unregister_op

PAPER_GRAMMAR = Path(__file__).resolve().parents[1] / "grammars" / "einspace.pcfg"


class _Term(Operation):
    name = "t_term"
    group = Group.COMPUTATION


class _Branch(Operation):
    name = "t_branch"
    group = Group.BRANCHING
    arguments = (Argument("b", int),)


class _Agg(Operation):
    name = "t_agg"
    group = Group.AGGREGATION


class _Fold(Operation):
    """im -> col, like im2col; cannot apply in col mode."""

    name = "t_fold"
    group = Group.ROUTING

    def abstract(self, mode, b, args):
        return ("col", 1) if mode == "im" and b == 1 else None


class _Never(Operation):
    name = "t_never"
    group = Group.COMPUTATION

    def abstract(self, mode, b, args):
        return None


@pytest.fixture(scope="module", autouse=True)
def test_ops():
    ops = (_Term, _Branch, _Agg, _Fold, _Never)
    for op in ops:
        register_op(op)
    yield
    for op in ops:
        unregister_op(op.name)


def sym(name: str) -> SymbolItem:
    return SymbolItem(name)


def op(name: str, **grid: tuple) -> OpItem:
    """An op item whose choices are the product of one argument axis (enough for these tests)."""
    if not grid:
        return OpItem(name)
    ((arg, values),) = grid.items()
    return OpItem(name, tuple(((arg, v),) for v in values))


def alt(p: float, *items) -> Alternative:
    return Alternative(tuple(items), p)


def rule(symbol: str, *alts: Alternative, guard: tuple[Condition, ...] = ()) -> Rule:
    return Rule(symbol, guard, tuple(alts))


def binary(q: float) -> Grammar:
    """S -> S S @ q | t: a Galton-Watson tree with mean offspring 2q."""
    return Grammar("S", (rule("S", alt(q, sym("S"), sym("S")), alt(1 - q, op("t_term"))),))


@pytest.mark.parametrize("q", [0.1, 0.25, 0.4, 0.6, 0.9])
def test_binary_grammar_matches_closed_form(q):
    a = analyse(binary(q))
    assert a.labels == (("S", ("im", 1)),)
    assert a.spectral_radius == pytest.approx(2 * q)
    assert a.consistent == (q < 0.5)
    if q < 0.5:
        assert a.expected_nonterminals == pytest.approx(1 / (1 - 2 * q))
        assert a.expected_terminals == pytest.approx((1 - q) / (1 - 2 * q))
        assert a.expected_occurrences == pytest.approx({"S": 1 / (1 - 2 * q)})
    else:
        assert a.expected_nonterminals is None and a.expected_terminals is None
        assert a.expected_occurrences is None


def test_binary_critical_probability():
    assert critical_probability(binary(0.2), "S", 0) == pytest.approx(0.5, abs=1e-4)
    assert critical_probability(binary(0.2), "S", 1) == pytest.approx(0.5, abs=1e-4)


def test_no_crossing_gives_none():
    g = Grammar("S", (rule("S", alt(0.5, op("t_term")), alt(0.5, op("t_term"), op("t_term"))),))
    assert critical_probability(g, "S", 0) is None


def guarded(q: float) -> Grammar:
    """X recurses with three children in im mode and two in col mode (first matching guard wins)."""
    three = alt(q, sym("X"), sym("X"), sym("X"))
    two = alt(q, sym("X"), sym("X"))
    return Grammar(
        "X",
        (
            rule("X", three, alt(1 - q, op("t_term")), guard=(Condition("mode", "==", ("im",)),)),
            rule("X", two, alt(1 - q, op("t_term"))),
        ),
    )


def test_guard_selects_the_rule_by_input_mode():
    im, col = analyse(guarded(0.4), "im"), analyse(guarded(0.4), "col")
    assert im.spectral_radius == pytest.approx(1.2) and not im.consistent
    assert col.spectral_radius == pytest.approx(0.8) and col.consistent
    assert critical_probability(guarded(0.2), "X", 0, "im") == pytest.approx(1 / 3, abs=1e-4)
    assert critical_probability(guarded(0.2), "X", 0, "col") == pytest.approx(1 / 2, abs=1e-4)


def test_rank_guard_and_mode_change_through_an_op():
    """S -> F X: F folds to col half the time; X recurses only where rank == 2 (col)."""
    q = 0.3
    g = Grammar(
        "S",
        (
            rule("S", alt(1.0, sym("F"), sym("X"))),
            rule("F", alt(0.5, op("t_fold")), alt(0.5, op("t_term"))),
            rule(
                "X",
                alt(q, sym("X"), sym("X")),
                alt(1 - q, op("t_term")),
                guard=(Condition("rank", "==", (2,)),),
            ),
            rule("X", alt(1.0, op("t_term"))),
        ),
    )
    a = analyse(g)
    assert [label_text(x) for x in a.labels] == ["S@im", "F@im", "X@im", "X@col"]
    e = dict(zip(a.labels, a.matrix[0], strict=True))
    assert e[("X", ("im", 1))] == pytest.approx(0.5) and e[("X", ("col", 1))] == pytest.approx(0.5)
    assert a.spectral_radius == pytest.approx(2 * q)
    assert a.expected_nonterminals == pytest.approx(1 + 1 + 0.5 + 0.5 / (1 - 2 * q))
    assert a.expected_terminals == pytest.approx(1 + 0.5 + 0.5 * (1 - q) / (1 - 2 * q))


def test_infeasible_alternatives_are_renormalised_away():
    """`t_never` can never apply, so S -> S S effectively has probability 0.6 / 0.8."""
    g = Grammar(
        "S", (rule("S", alt(0.6, sym("S"), sym("S")), alt(0.2, op("t_never")), alt(0.2, op("t_term"))),)
    )
    assert analyse(g).spectral_radius == pytest.approx(1.5)


def branching(p: float) -> Grammar:
    """The paper's branching prior in miniature: b = 2 derives two M's, b = 4 or 8 one repeated M.

    M's per M: (1 - p) / 2 * (2 + (1/3 * 2 + 2/3 * 1)) = 5 (1 - p) / 3, critical at p = 2/5.
    """
    rest = (1 - p) / 2
    return Grammar(
        "M",
        (
            rule(
                "M",
                alt(rest, sym("M"), sym("M")),
                alt(rest, sym("B"), sym("Br"), sym("A")),
                alt(p, op("t_term")),
            ),
            rule("B", alt(1.0, op("t_branch", b=(2, 4, 8)))),
            rule("Br", alt(1.0, ParallelItem((sym("M"), sym("M")))), guard=(Condition("b", "==", (2,)),)),
            rule("Br", alt(1.0, RepeatItem(sym("M"))), guard=(Condition("b", "in", (4, 8)),)),
            rule("A", alt(1.0, op("t_agg"))),
        ),
    )


def test_branching_prior_counts_parallel_items_and_one_repeated_symbol():
    a = analyse(branching(0.5))
    names = [label_text(x) for x in a.labels]
    assert names == [
        "M@im",
        "B@im",
        "Br@im,b=2",
        "Br@im,b=4",
        "Br@im,b=8",
        "A@im,b=2",
        "A@im,b=4",
        "A@im,b=8",
    ]
    e = {
        (label_text(r), label_text(c)): a.matrix[i, j]
        for i, r in enumerate(a.labels)
        for j, c in enumerate(a.labels)
    }
    assert e["M@im", "Br@im,b=2"] == pytest.approx(0.25 / 3)
    assert e["Br@im,b=2", "M@im"] == 2 and e["Br@im,b=4", "M@im"] == 1 and e["Br@im,b=8", "M@im"] == 1
    assert critical_probability(branching(0.5), "M", 2) == pytest.approx(2 / 5, abs=1e-4)


def test_matrix_row_sums_are_expected_children():
    a = analyse(branching(0.5))
    m = a.labels.index(("M", ("im", 1)))
    assert a.matrix[m].sum() == pytest.approx(0.25 * 2 + 0.25 * 3)
    assert a.terminals[m] == pytest.approx(0.5)
    assert np.all(a.matrix >= 0)


def test_format_reports_rho_and_warns_when_inconsistent():
    good, bad = format_analysis(analyse(branching(0.5))), format_analysis(analyse(binary(0.7)))
    assert "rho = " in good and "Consistent: yes" in good and "WARNING" not in good
    assert "Br@im,b=4" not in good and "Expected terminal nodes" in good
    assert "Br@im,b=4" in format_analysis(analyse(branching(0.5)), contexts=True)
    assert "Consistent: NO" in bad and "WARNING" in bad and "1.4000" in bad


def test_format_caps_rows():
    text = format_analysis(analyse(branching(0.5)), max_rows=3, contexts=True)
    assert "... 5 more" in text


def test_unknown_mode_is_an_error():
    with pytest.raises(EinspaceError, match="unknown mode"):
        analyse(binary(0.2), "seq")


def test_underivable_start_is_reported():
    g = Grammar("S", (rule("S", alt(1.0, op("t_never"))),))
    a = analyse(g)
    assert not a.derivable and "cannot be derived" in format_analysis(a)


@pytest.mark.parametrize("q", [1.0, 0.7])
def test_symbol_without_finite_derivation_is_inconsistent_not_infeasible(q):
    """S -> t @ 1-q | X; X -> X X (or X X | t_never, which fails): X never ends, it does not fail."""
    x_alts = (alt(q, sym("X"), sym("X")), alt(1 - q, op("t_never")))
    g = Grammar("S", (rule("S", alt(0.5, op("t_term")), alt(0.5, sym("X"))), rule("X", *x_alts)))
    a = analyse(g)
    assert a.derivable and not a.consistent and a.infinite == (("X", ("im", 1)),)
    assert a.expected_terminals is None
    assert "no finite derivation exists for X@im" in format_analysis(a)


# ---- the paper's grammar (needs the parser and the core operations) ----


@pytest.fixture(scope="module")
def paper():
    parser = pytest.importorskip("einspace.grammar.parser")
    return parser.load_grammar(str(PAPER_GRAMMAR))


def m_to_c(paper: Grammar) -> int:
    """Index of the alternative M -> C."""
    (r,) = paper.rules_for("M")
    return next(i for i, a in enumerate(r.alternatives) if a.items == (SymbolItem("C"),))


def test_paper_grammar_is_consistent_at_032(paper):
    a = analyse(paper)
    assert a.consistent and a.spectral_radius < 1
    assert a.expected_terminals is not None and np.isfinite(a.expected_terminals)
    assert a.expected_nonterminals is not None and a.expected_nonterminals > a.expected_terminals / 2
    assert analyse(paper.with_probability("M", m_to_c(paper), 0.32)).consistent


def test_paper_grammar_is_inconsistent_at_025(paper):
    assert analyse(paper.with_probability("M", m_to_c(paper), 0.25)).spectral_radius > 1


@pytest.mark.parametrize("mode", ["im", "col"])
def test_paper_critical_probability_is_4_over_13(paper, mode):
    """Paper Fig. 4: p(M -> C) > 0.31; with the branching prior exactly 13 (1 - p) / 9 < 1."""
    p = critical_probability(paper, "M", m_to_c(paper), mode)
    assert p == pytest.approx(0.31, abs=0.01)
    assert p == pytest.approx(4 / 13, abs=1e-3)

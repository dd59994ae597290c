"""Grammar composition (einspace.grammar.compose): exact messages, locations and boundaries of each change.

Written in the mutation-testing round (scripts/mutation.py): each test pins a behaviour that a
single-line change to compose.py would alter while every older test still passed.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from einspace.errors import GrammarError
from einspace.grammar.model import format_alternative
from einspace.grammar.parser import load_grammar

BASE = """start S
S -> M M
M -> M M | C @ 0.4 | R M
R if b == 2 -> identity | norm
R -> identity
C -> identity | norm | leaky_relu | softmax
"""


def _child(tmp_path: Path, text: str) -> object:
    (tmp_path / "base.pcfg").write_text(BASE)
    path = tmp_path / "child.pcfg"
    path.write_text('extends "base.pcfg"\n' + text)
    return load_grammar(path)


def _error(tmp_path: Path, text: str) -> GrammarError:
    with pytest.raises(GrammarError) as info:
        _child(tmp_path, text)
    return info.value


def _where(error: GrammarError) -> tuple[str, int, int]:
    return Path(error.location.path).name, error.location.line, error.location.column


def _probabilities(rule) -> dict[str, float]:
    return {format_alternative(a): a.probability for a in rule.alternatives}


def test_changing_an_unknown_symbol_lists_every_symbol(tmp_path: Path) -> None:
    error = _error(tmp_path, "X += norm\n")
    assert error.message == "no rule for 'X' to change (the grammar defines C, M, R, S)"
    assert _where(error) == ("child.pcfg", 2, 1)


def test_a_guard_no_rule_has_lists_the_guards_there_are(tmp_path: Path) -> None:
    error = _error(tmp_path, "R if b == 3 and mode == im += norm\n")
    assert (
        error.message == "R has no rule with the guard `b == 3 and mode == im` (its guards: b == 2; no guard)"
    )
    assert _where(error) == ("child.pcfg", 2, 1)


def test_a_guarded_change_touches_only_the_rule_with_that_guard(tmp_path: Path) -> None:
    g = _child(tmp_path, "R if b == 2 += softmax @ 0.2\n")
    guarded, plain = g.rules_for("R")
    assert _probabilities(guarded) == pytest.approx({"identity": 0.4, "norm": 0.4, "softmax": 0.2})
    assert _probabilities(plain) == {"identity": 1.0}


def test_an_unguarded_change_touches_every_rule_of_the_symbol(tmp_path: Path) -> None:
    g = _child(tmp_path, "R += softmax @ 0.2\n")
    guarded, plain = g.rules_for("R")
    assert _probabilities(guarded) == pytest.approx({"identity": 0.4, "norm": 0.4, "softmax": 0.2})
    assert _probabilities(plain) == pytest.approx({"identity": 0.8, "softmax": 0.2})


def test_added_probabilities_over_one_are_refused_with_their_sum(tmp_path: Path) -> None:
    error = _error(tmp_path, "C += linear(d = 3) @ 0.7 | pos_enc @ 0.6\n")
    assert error.message == (
        "the added alternatives of C take probability 1.3, leaving nothing for the existing ones"
    )
    assert _where(error) == ("child.pcfg", 2, 1)


def test_added_probabilities_just_under_one_leave_room(tmp_path: Path) -> None:
    g = _child(tmp_path, "R += softmax @ 0.99\n")
    assert _probabilities(g.rules_for("R")[1]) == pytest.approx({"identity": 0.01, "softmax": 0.99})


def test_reweight_without_a_probability(tmp_path: Path) -> None:
    error = _error(tmp_path, "M @= C @ 0.5 | R M\n")
    assert error.message == "@= sets probabilities: write one after each alternative (`a @ 0.4`)"
    assert _where(error) == ("child.pcfg", 2, 16)


def test_reweight_of_an_alternative_the_rule_lacks_lists_its_alternatives(tmp_path: Path) -> None:
    error = _error(tmp_path, "M @= C C @ 0.5\n")
    assert error.message == "M has no such alternative to reweight; its alternatives are: M M | C | R M"
    assert _where(error) == ("child.pcfg", 2, 6)


def test_reweighting_one_alternative_twice(tmp_path: Path) -> None:
    error = _error(tmp_path, "M @= C @ 0.3 | C @ 0.2\n")
    assert error.message == "this alternative is reweighted twice"
    assert _where(error) == ("child.pcfg", 2, 16)


@pytest.mark.parametrize(
    "text, message",
    [
        (
            "M @= C @ 0.6 | M M @ 0.5\n",
            "the probabilities set for M sum to 1.1, leaving nothing for the other alternatives",
        ),
        (
            "M @= C @ 0.6 | M M @ 0.4\n",
            "the probabilities set for M sum to 1, leaving nothing for the other alternatives",
        ),
        (
            "R @= identity @ 1\n",
            "the probabilities set for R sum to 1, leaving nothing for the other alternatives",
        ),
        (
            "M @= C @ 0.6 | M M @ 0.3 | R M @ 0.3\n",
            "the probabilities set for M sum to 1.2, leaving a sum above 1",
        ),
        ("M @= C @ 0.6 | M M @ 0.3 | R M @ 0.05\n", "the probabilities of M sum to 0.95, not 1"),
    ],
)
def test_reweights_that_leave_nothing_or_do_not_sum_to_one(tmp_path: Path, text: str, message: str) -> None:
    error = _error(tmp_path, text)
    assert error.message == message
    assert _where(error) == ("child.pcfg", 2, 1)


def test_reweighting_every_alternative_to_sum_one_is_accepted(tmp_path: Path) -> None:
    g = _child(tmp_path, "M @= C @ 0.5 | M M @ 0.25 | R M @ 0.25\n")
    assert _probabilities(g.rules_for("M")[0]) == {"M M": 0.25, "C": 0.5, "R M": 0.25}


def test_reweighting_one_alternative_just_below_one(tmp_path: Path) -> None:
    g = _child(tmp_path, "M @= C @ 0.9\n")
    # the other two had 0.3 each: they share the remaining 0.1 in that ratio
    assert _probabilities(g.rules_for("M")[0]) == pytest.approx({"M M": 0.05, "C": 0.9, "R M": 0.05})


def test_the_guards_listed_join_their_conditions_with_and(tmp_path: Path) -> None:
    (tmp_path / "base.pcfg").write_text(BASE.replace("R if b == 2 ->", "R if b == 2 and mode == im ->"))
    path = tmp_path / "child.pcfg"
    path.write_text('extends "base.pcfg"\nR if b == 3 += norm\n')
    with pytest.raises(GrammarError) as info:
        load_grammar(path)
    assert (
        info.value.message
        == "R has no rule with the guard `b == 3` (its guards: b == 2 and mode == im; no guard)"
    )

"""Grammars that extend grammars: what each change does to the rules, files found, cycles refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from einspace.cli import main
from einspace.errors import GrammarError
from einspace.grammar.model import format_alternative
from einspace.grammar.parser import load_grammar, parse_grammar

BASE = """start S
S -> M M
M -> M M | C @ 0.4 | R M
R -> identity
C -> identity | norm | leaky_relu | softmax
"""


def _probabilities(grammar, symbol: str) -> dict[str, float]:
    (rule,) = grammar.rules_for(symbol)
    return {format_alternative(a): a.probability for a in rule.alternatives}


@pytest.fixture
def base(tmp_path: Path) -> Path:
    path = tmp_path / "base.pcfg"
    path.write_text(BASE)
    return path


def _extend(tmp_path: Path, text: str, name: str = "child.pcfg") -> object:
    path = tmp_path / name
    path.write_text(text)
    return load_grammar(path)


def test_adding_alternatives_scales_the_others(base: Path, tmp_path: Path) -> None:
    g = _extend(tmp_path, 'extends "base.pcfg"\nC += pos_enc | linear(d = 8) @ 0.1\n')
    p = _probabilities(g, "C")
    # pos_enc is one more equal alternative: 1 / (4 + 2); the old four share 1 - 1/6 - 0.1 equally
    assert p["pos_enc"] == pytest.approx(1 / 6) and p["linear(d = 8)"] == pytest.approx(0.1)
    assert p["identity"] == pytest.approx((1 - 1 / 6 - 0.1) / 4)
    assert sum(p.values()) == pytest.approx(1)
    assert _probabilities(g, "M") == _probabilities(load_grammar(base), "M")  # untouched


def test_reweighting_keeps_the_ratios_of_the_others(base: Path, tmp_path: Path) -> None:
    g = _extend(tmp_path, "extends base\nM @= C @ 0.7\n")  # a bare name: base.pcfg beside the file
    p = _probabilities(g, "M")
    assert p["C"] == pytest.approx(0.7)
    assert p["M M"] == pytest.approx(0.15) and p["R M"] == pytest.approx(0.15)


def test_redefining_a_symbol_replaces_it_in_place_and_new_symbols_follow(base: Path, tmp_path: Path) -> None:
    text = 'extends "base.pcfg"\nstart Net\nNet -> S\nR -> identity | X\nX -> permute(order = (2, 1))\n'
    g = _extend(tmp_path, text)
    assert g.start == "Net"
    assert g.nonterminals == ("S", "M", "R", "C", "Net", "X")
    assert _probabilities(g, "R") == {"identity": 0.5, "X": 0.5}
    (rule,) = g.rules_for("R")
    assert rule.location.path.endswith("child.pcfg")
    assert g.rules_for("C")[0].location.path.endswith("base.pcfg")


def test_guarded_additions_touch_one_rule() -> None:
    g = parse_grammar("extends einspace\nA if b == 2 += identity @ 0.1\n", "plus.pcfg")
    two, many = g.rules_for("A")
    assert [format_alternative(a) for a in two.alternatives][-1] == "identity"
    assert "identity" not in [format_alternative(a) for a in many.alternatives]


def test_chains_of_extensions_and_cycles(tmp_path: Path) -> None:
    (tmp_path / "a.pcfg").write_text("extends einspace\nC += pos_enc\n")
    with pytest.raises(GrammarError, match="repeats the one at .*einspace.pcfg"):
        load_grammar(tmp_path / "a.pcfg")  # pos_enc is in einspace already
    (tmp_path / "a.pcfg").write_text('extends "b.pcfg"\n')
    (tmp_path / "b.pcfg").write_text('extends "sub/c.pcfg"\n')
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "c.pcfg").write_text('extends "../a.pcfg"\n')
    with pytest.raises(GrammarError) as info:
        load_grammar(tmp_path / "a.pcfg")
    message = str(info.value)
    assert message.startswith(f"{tmp_path / 'sub' / 'c.pcfg'}:1:9: grammars extend each other in a cycle")
    assert "a.pcfg -> " in message and "b.pcfg -> " in message
    (tmp_path / "sub" / "c.pcfg").write_text("extends einspace\nM @= C @ 0.5\n")
    chained = load_grammar(tmp_path / "a.pcfg")  # a -> b -> c -> bundled einspace
    assert _probabilities(chained, "M")["C"] == pytest.approx(0.5)


def test_errors_in_the_base_are_reported_in_the_base(tmp_path: Path) -> None:
    (tmp_path / "base.pcfg").write_text("start S\nS -> lineer(d = 3)\n")
    with pytest.raises(GrammarError) as info:
        _extend(tmp_path, 'extends "base.pcfg"\n')
    assert str(info.value).startswith(f"{tmp_path / 'base.pcfg'}:2:6: 'lineer'")
    assert "    S -> lineer(d = 3)" in str(info.value)


def test_check_says_where_each_rule_came_from(base: Path, tmp_path: Path, capsys) -> None:
    child = 'extends "base.pcfg"\nC += pos_enc\nR -> identity | permute(order = (2, 1))\n'
    (tmp_path / "child.pcfg").write_text(child)
    assert main(["check", str(tmp_path / "child.pcfg"), "--mode", "col"]) == 0
    out = capsys.readouterr().out
    assert "composed of 2 files" in out
    assert f"C                        {base}:5:1, +1 alternative from {tmp_path / 'child.pcfg'}" in out
    assert f"R                        {tmp_path / 'child.pcfg'}:3:1" in out
    (tmp_path / "bad.pcfg").write_text('extends "missing.pcfg"\n')
    assert main(["check", str(tmp_path / "bad.pcfg")]) == 2
    err = capsys.readouterr().err
    assert f'{tmp_path / "bad.pcfg"}:1:9: cannot extend "missing.pcfg": no file' in err
    assert "Traceback" not in err

"""The grammar-file language: the bundled grammars parse to the right objects; bad ones say why."""

from __future__ import annotations

from pathlib import Path

import pytest

from einspace.errors import GrammarError, GrammarSyntaxError
from einspace.grammar.model import OpItem, ParallelItem, RepeatItem, SymbolItem
from einspace.grammar.parser import load_grammar, parse_grammar
from einspace.ops.registry import Argument, Group, Operation, register_op, unregister_op
from einspace.state import input_state

GRAMMARS = Path(__file__).resolve().parent.parent / "grammars"

IM = input_state((3, 32, 32))
COL = input_state((64, 16))


@pytest.fixture(scope="module")
def einspace_grammar():
    return load_grammar(GRAMMARS / "einspace.pcfg")


def _op_items(rule):
    return {item.name: item for alt in rule.alternatives for item in alt.items if isinstance(item, OpItem)}


def test_einspace_grammar_start_and_symbols(einspace_grammar):
    g = einspace_grammar
    assert g.start == "S"
    assert g.nonterminals == ("S", "M", "B", "Branches", "A", "R1", "R2", "C")
    assert str(g.path).endswith("einspace.pcfg")


def test_einspace_grammar_probabilities(einspace_grammar):
    (m,) = einspace_grammar.rules_for("M")
    assert [a.probability for a in m.alternatives] == pytest.approx([0.68 / 3] * 3 + [0.32])
    assert m.alternatives[0].probability == pytest.approx(0.22666666)
    for rule in einspace_grammar.rules:
        assert sum(a.probability for a in rule.alternatives) == pytest.approx(1.0)


def test_einspace_grammar_alternatives_and_grids(einspace_grammar):
    g = einspace_grammar
    (b,) = g.rules_for("B")
    assert len(b.alternatives) == 2
    assert len(_op_items(b)["group_dim"].choices) == 9
    (c,) = g.rules_for("C")
    linear = _op_items(c)["linear"]
    assert linear.choices == tuple((("d", d),) for d in (16, 32, 64, 128, 256, 512, 1024, 2048))
    assert (linear.location.line, linear.location.column) == (61, 6)
    im2col = _op_items(g.rules_for("R1")[0])["im2col"]
    triples = [(1, 1, 0), (1, 2, 0), (3, 1, 1), (3, 2, 1), (4, 4, 0), (8, 8, 0), (16, 16, 0)]
    assert im2col.choices == tuple((("k", k), ("s", s), ("p", p)) for k, s, p in triples)
    permute = _op_items(g.rules_for("R2")[0])["permute"]
    assert permute.choices[0] == (("order", (1, 3, 2)),)


def test_einspace_grammar_branches(einspace_grammar):
    two, many = einspace_grammar.rules_for("Branches")
    assert two.alternatives[0].items == (ParallelItem((SymbolItem("M"), SymbolItem("M"))),)
    assert many.alternatives[0].items == (RepeatItem(SymbolItem("M"), None),)


def test_einspace_grammar_guards(einspace_grammar):
    g = einspace_grammar
    two, many = g.rules_for("A")
    assert [str(c) for c in two.guard] == ["b == 2"]
    assert [str(c) for c in many.guard] == ["b in (4, 8)"]
    assert g.rule_for("A", (COL, COL)) is two
    assert g.rule_for("A", (COL,) * 4) is many
    assert g.rule_for("A", (COL,) * 8) is many
    assert g.rule_for("A", (COL,) * 3) is None
    assert "im2col" in _op_items(g.rule_for("R1", (IM,)))
    assert "im2col" not in _op_items(g.rule_for("R1", (COL,)))
    assert "col2im" in _op_items(g.rule_for("R2", (COL,)))


def test_einspace_1d_grammar():
    g = load_grammar(GRAMMARS / "einspace_1d.pcfg")
    assert g.start == "S"
    assert g.rule_for("S", (COL,)) is not None
    assert g.rule_for("S", (IM,)) is None
    ops = {item.name: item for rule in g.rules for item in _op_items(rule).values()}
    assert "im2col" not in ops and "col2im" not in ops
    assert {dict(choice)["order"] for choice in ops["permute"].choices} == {(2, 1)}
    for name in ("group_dim", "concat"):
        assert {dict(choice)["dim"] for choice in ops[name].choices} == {1, 2}


def test_layout_comments_and_continuations():
    text = (
        "# a comment\r\n\r\nstart S   # trailing comment\r\n"
        "S -> identity (M, M) add   # a name then a parallel item\r\n"
        "\r\n"
        "   # a comment between continuation lines\r\n"
        "  | im2col((k, s, p) =\r\n"
        "        (1, 1, 0)\r\n"
        "      | (3, 1, 1)) linear(d = 8) col2im @ 0.25\r\n"
        "M -> identity"
    )
    g = parse_grammar(text)
    first, second = g.rules_for("S")[0].alternatives
    assert [type(i).__name__ for i in first.items] == ["OpItem", "ParallelItem", "OpItem"]
    assert [a.probability for a in (first, second)] == [0.75, 0.25]
    assert second.items[0].choices == ((("k", 1), ("s", 1), ("p", 0)), (("k", 3), ("s", 1), ("p", 1)))
    assert (second.location.line, second.location.column) == (7, 5)


def test_missing_file_names_the_path(tmp_path):
    missing = tmp_path / "nope.pcfg"
    with pytest.raises(GrammarError, match="nope.pcfg"):
        load_grammar(missing)


# (id, error class, grammar text, message fragment, "line:column"): every way a grammar file
# can be wrong, with the message and the place it must report.
SYN = GrammarSyntaxError  # does not parse
SEM = GrammarError  # parses but means nothing sensible
BAD_GRAMMARS = [
    ("empty-rhs", SYN, "start S\nS ->\n", "unexpected end of line; expected a name or '('", "2:5"),
    ("no-arrow", SYN, "start S\nS identity\n", "name 'identity'; expected '+=', '->', '@=' or 'if'", "2:3"),
    ("bad-char", SYN, "start S\nS -> identity $\n", "unexpected character '$'", "2:15"),
    ("unclosed", SYN, "start S\nS -> linear(d = 16\n", "'(' is never closed", "2:12"),
    ("unclosed-2", SYN, "start S\nS -> (M, M\nM -> add\n", "name 'M'; expected ')' or ','", "3:1"),
    ("stray-rpar", SYN, "start S\nS -> identity)\n", "unexpected ')'", "2:14"),
    ("empty-value", SYN, "start S\nS -> linear(d = 16 | )\n", "expected a name, a number", "2:22"),
    ("space-before-args", SYN, "start S\nS -> linear (d = 16)\n", "follow its name without a space", "2:16"),
    ("guard-equals", SYN, "start S\nS if b = 2 -> add\n", "'='; expected '!=', '==' or 'in'", "2:8"),
    ("no-bar", SYN, "start S\nS -> add\n  norm\n", "end of line; expected '+=', '->', '@=' or 'if'", "3:7"),
    ("no-probability", SYN, "start S\nS -> identity @\n", "expected a number", "2:16"),
    ("start-two-names", SYN, "start S S\nS -> add\n", "unexpected name 'S'; expected end of line", "1:9"),
    ("keyword-symbol", SYN, "start if\n", "unexpected 'if'; expected a name", "1:7"),
    ("undefined", SEM, "start S\nS -> M\nN -> identity\n", "'M' is neither a non-terminal", "2:6"),
    ("unknown-op", SEM, "start S\nS -> lineer(d = 3)\n", "did you mean 'linear'?", "2:6"),
    ("unknown-name", SEM, "start S\nS -> Mm\nMM -> identity\n", "did you mean 'MM'?", "2:6"),
    ("symbol-args", SEM, "start S\nS -> M(d = 3)\nM -> add\n", "'M' is a non-terminal; only", "2:6"),
    ("op-as-symbol", SEM, "start S\nS -> add\nadd -> identity\n", "'add' is a registered operation", "3:1"),
    ("arg-type", SEM, "start S\nS -> linear(d = 1.5)\n", "'d' of 'linear' must be int, got 1.5", "2:6"),
    ("bool-for-int", SEM, "start S\nS -> clone(b = true)\n", "argument 'b' of 'clone' must be int", "2:6"),
    ("arg-name", SEM, "start S\nS -> linear(e = 1)\n", "operation 'linear' has no argument 'e'", "2:6"),
    ("missing-arg", SEM, "start S\nS -> linear\n", "operation 'linear' needs argument 'd'", "2:6"),
    ("arg-value", SEM, "start S\nS -> permute(order = (2, 2))\n", "must be a permutation", "2:6"),
    ("arg-twice", SEM, "start S\nS -> linear(d = 16, d = 32)\n", "'d' of 'linear' is given twice", "2:6"),
    ("grid-point-twice", SEM, "start S\nS -> linear(d = 16 | 16)\n", "linear(d = 16) appears twice", "2:6"),
    ("linked-arity", SEM, "start S\nS -> im2col((k, s, p) = (1, 1))\n", "(k, s, p) needs 3 values", "2:25"),
    ("no-start", SEM, "S -> identity\n", "no start symbol", "1:1"),
    ("two-starts", SEM, "start S\nstart S\nS -> add\n", "second start declaration (the first is at", "2:7"),
    ("start-no-rule", SEM, "start Net\nNets -> add\n", "no rule; did you mean 'Nets'?", "1:7"),
    ("p-zero", SEM, "start S\nS -> identity @ 0 | norm\n", "probability must be in (0, 1], got 0", "2:17"),
    ("p-above-one", SEM, "start S\nS -> identity @ 1.5\n", "probability must be in (0, 1], got 1.5", "2:17"),
    ("p-negative", SEM, "start S\nS -> identity @ -0.5 | norm\n", "got -0.5", "2:17"),
    ("p-no-room", SEM, "start S\nS -> add @ 1 | norm\n", "explicit probabilities sum to 1, leaving", "2:1"),
    ("p-over-one", SEM, "start S\nS -> add @ 0.7 | norm @ 0.6 | pos_enc\n", "sum to 1.3, leaving", "2:1"),
    ("p-sum", SEM, "start S\nS -> identity @ 0.5\n   | norm @ 0.4\n", "this rule sum to 0.9, not 1", "2:1"),
    ("guard-attribute", SEM, "start S\nS if mod == im -> add\n", "guard attribute 'mod'", "2:6"),
    ("guard-mode", SEM, "start S\nS if mode == img -> identity\n", "mode is im or col, not 'img'", "2:14"),
    ("guard-b", SEM, "start S\nS if b in (2, 0) -> add\n", "b must be a positive integer", "2:15"),
    ("guard-rank", SEM, "start S\nS if rank != col -> add\n", "rank must be a positive integer", "2:14"),
    ("guard-twice", SEM, "start S\nS if b == 2 -> add\nS if b == 2 -> add\n", "`b == 2` (the first", "3:1"),
    ("guard-order", SEM, "start S\nS if b==2 and b!=3 -> add\nS if b!=3 and b==2 -> add\n", "line 2", "3:1"),
    ("two-unguarded", SEM, "start S\nS -> add\nS -> norm\n", "S without a guard (the first is", "3:1"),
    ("shadowed", SEM, "start S\nS -> add\nS if b == 2 -> add\n", "never apply: the rule at line 2", "3:1"),
    ("parallel-of-one", SEM, "start S\nS -> (M)\nM -> add\n", "needs at least 2 branches", "2:6"),
    ("repeat-once", SEM, "start S\nS -> (M) * 1\nM -> add\n", "must be b or at least 2, got 1", "2:6"),
    ("repeat-by-n", SEM, "start S\nS -> (M) * n\nM -> add\n", "must be an integer or b", "2:12"),
    ("unreachable", SEM, "start S\nS -> add\nM -> add\n", "M is not reachable from the start symbol", "3:1"),
    ("unproductive", SEM, "start S\nS -> M | add\nM -> M M\n", "M never derives only operations", "3:1"),
    ("same-alternative", SEM, "start S\nS -> add\n  | norm\n  | add\n", "repeats the one at line 2", "4:5"),
    # grammars that extend grammars (einspace.grammar.compose)
    ("extends-missing", SEM, 'extends "nope.pcfg"\n', 'cannot extend "nope.pcfg": no file', "1:9"),
    ("extends-unknown", SEM, "extends einspase\n", "no bundled grammar of that name (bundled: ", "1:9"),
    ("extends-twice", SEM, "extends einspace\nextends einspace\n", "a second `extends` (the first", "2:9"),
    ("extends-path-name", SYN, "extends ../a.pcfg\n", "'.' (a path goes in quotes", "1:9"),
    ("add-no-base", SEM, "start S\nS -> add\nS += norm\n", "and it extends none: add a line", "3:1"),
    ("add-no-rhs", SYN, "extends einspace\nC +=\n", "unexpected end of line; expected a name or '('", "2:5"),
    ("add-unknown-symbol", SEM, "extends einspace\nCC += norm\n", "no rule for 'CC' to change", "2:1"),
    ("add-guard", SEM, "extends einspace\nA if b == 3 += add\n", "no rule with the guard `b == 3`", "2:1"),
    ("add-no-room", SEM, "extends einspace\nC += linear(d = 3) @ 1\n", "leaving nothing for the", "2:1"),
    ("add-repeats", SEM, "extends einspace\nC += norm\n", "repeats the one at ", "2:6"),
    ("add-p", SEM, "extends einspace\nC += linear(d = 3) @ 2\n", "must be in (0, 1], got 2", "2:22"),
    ("reweight-unknown", SEM, "extends einspace\nM @= C C @ 0.5\n", "M has no such alternative", "2:6"),
    ("reweight-no-p", SEM, "extends einspace\nM @= C\n", "write one after each alternative", "2:6"),
    ("reweight-twice", SEM, "extends einspace\nM @= C @ 0.3 | C @ 0.3\n", "reweighted twice", "2:16"),
    ("reweight-sum", SEM, "extends einspace\nM @= C @ 0.6 | M M @ 0.5\n", "sum to 1.1, leaving", "2:1"),
    (
        "reweight-all",
        SEM,
        "extends einspace\nR1 if mode == col @= identity @ 0.5\n | permute(order = (2, 1)) @ 0.4\n",
        "sum to 0.9, not 1",
        "2:1",
    ),
]


@pytest.mark.parametrize(
    "error, text, fragment, where", [r[1:] for r in BAD_GRAMMARS], ids=[r[0] for r in BAD_GRAMMARS]
)
def test_bad_grammar_messages(error, text, fragment, where):
    with pytest.raises(error) as info:
        parse_grammar(text, "bad.pcfg")
    assert type(info.value) is error
    message = str(info.value)
    assert message.startswith(f"bad.pcfg:{where}: ")
    assert fragment in message
    line, column = map(int, where.split(":"))
    source_line, caret = message.splitlines()[1:3]
    assert source_line == "    " + text.splitlines()[line - 1]
    assert caret == "    " + " " * (column - 1) + "^"


class _Scale(Operation):
    """A user operation: multiplies by a factor, optionally after a shift (order: factor, shift)."""

    name = "test_scale"
    group = Group.COMPUTATION
    arguments = (
        Argument("factor", float, lambda v: None if v > 0 else "must be positive"),
        Argument("shift", int),
    )


@pytest.fixture
def scale_op():
    register_op(_Scale)
    yield _Scale.name
    unregister_op(_Scale.name)


def test_user_operation_in_grammar(scale_op):
    g = parse_grammar(f"start S\nS -> {scale_op}(shift = 0 | 1, factor = 0.5) M\nM -> identity\n")
    (op, symbol) = g.rules_for("S")[0].alternatives[0].items
    assert symbol == SymbolItem("M")
    assert op.name == scale_op
    assert op.choices == ((("factor", 0.5), ("shift", 0)), (("factor", 0.5), ("shift", 1)))


def test_user_operation_argument_check(scale_op):
    with pytest.raises(
        GrammarError, match=r"<string>:2:6: argument 'factor' of '\w+' = -1.0: must be positive"
    ):
        parse_grammar(f"start S\nS -> {scale_op}(factor = -1.0, shift = 0)\n")


def test_load_grammar_is_one_function_under_both_public_names():
    import einspace
    import einspace.grammar

    assert einspace.load_grammar is einspace.grammar.load_grammar is load_grammar


def test_a_bundled_name_means_the_bundled_file_even_beside_a_file_of_that_name(tmp_path, monkeypatch):
    """Run in a folder holding a file called `einspace` (a virtualenv's bin/ holds the console
    script of that name), `einspace` is still the paper's grammar; ./einspace is the file."""
    from einspace.bundled import grammar_path

    (tmp_path / "einspace").write_text("#!/usr/bin/env python\nimport sys\n")
    monkeypatch.chdir(tmp_path)
    assert load_grammar("einspace").start == "S"
    assert grammar_path("einspace").parent.name == "grammars"
    with pytest.raises(GrammarSyntaxError, match="unexpected name 'sys'"):
        load_grammar("./einspace")


def test_items_are_visited_by_kind_and_walked_with_their_children() -> None:
    """`ItemVisitor` dispatches on an item's kind as `TreeVisitor` does on a node's; `walk_items`
    yields each item before those nested in it; `format_item` writes grids by their size."""
    from einspace.errors import EinspaceError
    from einspace.grammar.model import ItemVisitor, format_item, walk_items

    g = parse_grammar("start S\nS -> (M, M) add (linear(d = 8 | 16)) * b\nM -> identity\n")
    items = g.rules_for("S")[0].alternatives[0].items
    assert [i.kind for i in walk_items(items)] == ["parallel", "symbol", "symbol", "op", "repeat", "op"]
    assert [format_item(i) for i in items] == ["(M, M)", "add", "(linear(<2 choices>)) * b"]

    class Symbols(ItemVisitor[str]):
        def symbol(self, item: SymbolItem) -> str:
            return item.name

    assert Symbols().visit(items[0].items[0]) == "M"
    with pytest.raises(EinspaceError, match="Symbols has no handler for op items"):
        Symbols().visit(items[1])

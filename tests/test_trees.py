"""Derivation trees by hand: text round trips, syntax errors with carets, check errors with node paths."""

from __future__ import annotations

import json

import pytest

from einspace import check_tree, content_hash, load_grammar, parse_tree, pretty, to_text
from einspace.errors import EinspaceError, TreeError, TreeSyntaxError
from einspace.ops.registry import Argument, Group, Operation, register_op, unregister_op
from einspace.sampling import sample_tree
from einspace.state import input_state
from einspace.tree import (
    Nonterminal,
    Parallel,
    Repeat,
    Terminal,
    TreeVisitor,
    dumps_json,
    from_json,
    load_tree,
    node_at,
    replace_at,
    tree_depth,
    walk,
    walk_depths,
)

#: The paper's Fig. 3 block: a 3x3 convolution (im2col, linear, col2im), norm and leaky ReLU
#: on one branch, the identity on the other, added. With linear(d=3) it keeps 3 channels.
FIG3 = (
    "(S (B clone(b=2)) (Branches [(M (M (R1 im2col(k=3, s=1, p=1)) (M (C linear(d=3))) (R2 col2im))"
    " (M (M (C norm)) (M (C leaky_relu)))) (M (C identity))]) (A add))"
)


def _nt(symbol: str, *kids) -> Nonterminal:
    return Nonterminal(symbol, tuple(kids))


def _c(op: str, **args) -> Nonterminal:
    return _nt("C", Terminal(op, tuple(args.items())))


FIG3_TREE = _nt(
    "S",
    _nt("B", Terminal("clone", (("b", 2),))),
    _nt(
        "Branches",
        Parallel(
            (
                _nt(
                    "M",
                    _nt(
                        "M",
                        _nt("R1", Terminal("im2col", (("k", 3), ("s", 1), ("p", 1)))),
                        _nt("M", _c("linear", d=3)),
                        _nt("R2", Terminal("col2im")),
                    ),
                    _nt("M", _nt("M", _c("norm")), _nt("M", _c("leaky_relu"))),
                ),
                _nt("M", _c("identity")),
            )
        ),
    ),
    _nt("A", Terminal("add")),
)


@pytest.fixture(scope="module")
def paper():
    return load_grammar("grammars/einspace.pcfg")


@pytest.fixture(scope="module")
def sequences():
    return load_grammar("grammars/einspace_1d.pcfg")


# ----------------------------------------------------------------------------- round trips

#: Canonical one-line texts: each parses and prints back character for character.
CANONICAL = [
    "(S (M (C identity)) (M (C identity)))",
    FIG3,
    "(S (B clone(b=4)) (Branches (M (C linear(d=16)))*4) (A add))",
    "(S (B group_dim(dim=2, b=8)) (Branches (M (R1 identity) (M (C norm)) (R2 identity))*8) (A add))",
    "(S (B clone(b=2)) (Branches [(M (C identity)) (M (C norm))]) (A matmul(scaled=true)))",
    "(S (B clone(b=2)) (Branches [(M (C softmax)) (M (C pos_enc))]) (A matmul(scaled=false)))",
    "(S (R1 permute(order=(3,1,2))) (M (C norm)) (R2 permute(order=(2,3,1))))",
    "(X identity*3)",
    "(M)",
    "(X [a b*2 (Y c)])",
    # an operation without arguments followed by a node: not a call (grammar `S -> identity M`)
    "(S identity (M norm) identity [(M)])",
    # argument values of every kind a grammar file can write: negative, float, word, nested tuple
    "(X op(n=-2, f=0.5, e=1e-05, g=1e+20, w=same, t=(1,(2,true),0.25)))",
]


@pytest.mark.parametrize("text", CANONICAL)
def test_canonical_text_round_trips(text):
    tree = parse_tree(text)
    assert to_text(tree) == text
    assert parse_tree(pretty(tree)) == tree
    assert parse_tree(pretty(tree, width=1)) == tree  # every subtree on its own line
    assert from_json(json.loads(dumps_json(tree))) == tree
    assert content_hash(parse_tree(to_text(tree))) == content_hash(tree)


def test_figure3_parses_to_the_hand_built_tree():
    assert parse_tree(FIG3) == FIG3_TREE
    assert to_text(FIG3_TREE) == FIG3


def test_parallel_and_repeat_nodes():
    tree = parse_tree("(Branches [(M (C identity)) (M (C norm))])")
    assert tree == _nt("Branches", Parallel((_nt("M", _c("identity")), _nt("M", _c("norm")))))
    tree = parse_tree("(Branches (M (C linear(d=16)))*4)")
    assert tree == _nt("Branches", Repeat(_nt("M", _c("linear", d=16)), 4))
    assert parse_tree("(X identity*3)") == _nt("X", Repeat(Terminal("identity"), 3))


@pytest.mark.parametrize(
    "text",
    [
        "(S\n  (M (C identity))\n  (M (C identity)))",
        "  (S (M (C identity))   (M (C identity)) )  ",
        "(S\t(M (C identity))\r\n(M (C identity)))",
    ],
)
def test_layout_is_insignificant(text):
    assert parse_tree(text) == parse_tree("(S (M (C identity)) (M (C identity)))")


FIG3_PRETTY_40 = """\
(S
  (B clone(b=2))
  (Branches
    [
      (M
        (M
          (R1 im2col(k=3, s=1, p=1))
          (M (C linear(d=3)))
          (R2 col2im))
        (M
          (M (C norm))
          (M (C leaky_relu))))
      (M (C identity))])
  (A add))"""


def test_pretty_breaks_long_trees_over_lines():
    """Subtrees that fit the width stay on one line; the others open one line per child."""
    assert pretty(FIG3_TREE, width=40) == FIG3_PRETTY_40
    assert pretty(FIG3_TREE, width=len(FIG3)) == FIG3
    repeat = parse_tree("(B (M (C linear(d=16)))*4)")
    assert pretty(repeat, width=20) == "(B\n  (M\n    (C linear(d=16)))*4)"  # the count follows the child


def test_repr_reads_back():
    namespace = {"Nonterminal": Nonterminal, "Terminal": Terminal, "Parallel": Parallel, "Repeat": Repeat}
    tree = parse_tree(CANONICAL[2])
    assert eval(repr(tree), namespace) == tree
    assert eval(repr(FIG3_TREE), namespace) == FIG3_TREE


def test_trees_are_values():
    a, b = parse_tree(FIG3), parse_tree(pretty(FIG3_TREE))
    assert a == b and hash(a) == hash(b) and a is not b
    assert len({a, b, parse_tree(CANONICAL[0])}) == 2
    with pytest.raises(AttributeError):
        a.symbol = "T"  # type: ignore[misc]


def test_content_hash_is_stable_and_discriminating():
    # A literal: the hash is a function of the canonical text, the same in every process.
    assert content_hash(FIG3_TREE) == "12f8b5ef7b82c00e"
    hashes = {content_hash(parse_tree(text)) for text in CANONICAL}
    assert len(hashes) == len(CANONICAL)


def test_walk_node_at_and_replace_at():
    paths = [path for path, _ in walk(FIG3_TREE)]
    assert paths[:4] == [(), (0,), (0, 0), (1,)]  # pre-order
    assert len(paths) == len(set(paths)) == 8 + 17 + 1  # terminals, non-terminals, one Parallel
    for path, node in walk(FIG3_TREE):
        assert node_at(FIG3_TREE, path) is node
    identity_path = next(p for p, n in walk(FIG3_TREE) if n == Terminal("identity"))
    changed = replace_at(FIG3_TREE, identity_path, Terminal("norm"))
    assert to_text(changed) == FIG3.replace("(C identity)", "(C norm)")
    assert changed.children[0] is FIG3_TREE.children[0]  # untouched subtrees are shared


class _Kinds(TreeVisitor[str]):
    """Handles two kinds by name; the others fall to `default`."""

    def terminal(self, node: Terminal, prefix: str) -> str:
        return prefix + node.op

    def repeat(self, node: Repeat, prefix: str) -> str:
        return prefix + f"x{node.times}:" + self.visit(node.child, prefix)


def test_visitor_dispatches_by_kind_name_with_a_default_for_the_rest():
    visitor = _Kinds()
    assert visitor.visit(Repeat(Terminal("norm"), 4), "> ") == "> x4:> norm"
    with pytest.raises(EinspaceError, match="_Kinds has no handler for a parallel node"):
        visitor.visit(Parallel((Terminal("norm"),)), "")


@pytest.mark.parametrize(
    "text,depth",
    [
        ("(S (C identity))", 2),
        ("(S (M (C identity)) (M (M (C norm))))", 4),
        # groupings add no level: S > Branches > [ ] > M > C is depth 4, as is the repeat's M > C
        ("(S (B clone(b=2)) (Branches [(M (C identity)) (M (C norm))]) (A add))", 4),
        ("(S (B clone(b=2)) (Branches (M (C identity))*2) (A add))", 4),
    ],
)
def test_depth_counts_nonterminal_levels(text, depth):
    tree = parse_tree(text)
    assert tree_depth(tree) == depth
    by_path = {path: d for path, _, d in walk_depths(tree)}
    assert [path for path, _ in walk(tree)] == list(by_path)  # the same pre-order
    assert by_path[()] == 1 and tree_depth(Terminal("identity")) == 0


def test_load_tree_skips_comment_lines(tmp_path):
    path = tmp_path / "fig3.tree"
    path.write_text("# Fig. 3 of the paper\n" + pretty(FIG3_TREE) + "\n  # trailing comment\n")
    assert load_tree(path) == FIG3_TREE


class _Scale(Operation):
    """Multiply by a float (a user operation with a float argument, for the round trip)."""

    name = "test_trees_scale"
    group = Group.COMPUTATION
    arguments = (Argument("factor", float), Argument("shape", tuple))

    def infer(self, signal, args):
        return signal


@pytest.fixture
def scale_op():
    register_op(_Scale)
    yield _Scale.name
    unregister_op(_Scale.name)


def test_terminal_then_node_round_trips():
    from einspace.grammar import parse_grammar

    grammar = parse_grammar("start S\nS -> identity M | M softmax\nM -> norm | leaky_relu M\n")
    for seed in range(20):
        tree = sample_tree(grammar, input_state((3, 4, 4)), random_seed=seed)
        assert parse_tree(to_text(tree)) == tree
        assert parse_tree(pretty(tree, width=1)) == tree


def test_sampled_float_and_tuple_arguments_round_trip(scale_op):
    from einspace.grammar import parse_grammar

    grammar = parse_grammar(
        f"start S\nS -> {scale_op}(factor = 1e-5 | 2.5e10 | .5 | 3.0, shape = (1, 0.5) | (2, (3, 4)))\n"
    )
    for seed in range(20):
        tree = sample_tree(grammar, input_state((3, 4, 4)), random_seed=seed)
        assert parse_tree(to_text(tree)) == tree
        assert from_json(json.loads(dumps_json(tree))) == tree


# ----------------------------------------------------------------------------- syntax errors

#: (malformed text, where the error is, a fragment of the message).
BAD_TEXTS = [
    ("S)", "1:1", "unexpected 'S' in tree; expected '('"),
    ("(1 identity)", "1:2", "unexpected '1' in tree; expected a symbol"),
    ("(S linear(d=))", "1:13", "unexpected ')'"),
    ("(S linear(d 3))", "1:13", "expected '='"),
    ("(S linear (d=3))", "1:13", "unexpected '='"),  # a space: linear, then a node (d ...)
    ("(S linear(d=3,))", "1:15", "expected a name"),
    ("(S [)", "1:5", "unexpected ')'"),
    ("(S [ ])", "1:6", "unexpected ']'"),
    ("(S identity*)", "1:13", "expected an integer"),
    ("(S identity*x)", "1:13", "unexpected 'x' in tree; expected an integer"),
    ("(S identity))", "1:13", "expected end of text"),
    ("(S identity)*2", "1:13", "unexpected '*'"),
    ("(S (M)\n  (C identity) ]", "2:16", "unexpected ']'"),
    ("(S\n  (M (C identity))\n  (M (C identity))", None, "unexpected end of text"),
    ("(S", None, "unexpected end of text"),
    ("", None, "unexpected end of text"),
]


@pytest.mark.parametrize("text,where,fragment", BAD_TEXTS)
def test_syntax_error_messages(text, where, fragment):
    with pytest.raises(TreeSyntaxError) as info:
        parse_tree(text, "net.tree")
    error = info.value
    message = str(error)
    assert fragment in message
    assert message.startswith(f"net.tree:{error.location.line}:{error.location.column}: ")
    if where is not None:
        assert f"{error.location.line}:{error.location.column}" == where
    if text.strip():
        # The offending source line follows, with a caret under the reported column.
        source_line, caret_line = message.splitlines()[1:3]
        assert source_line.strip() == text.splitlines()[error.location.line - 1].strip()
        assert caret_line.index("^") - 4 == error.location.column - 1
        assert caret_line.strip() == "^"


def test_load_tree_reports_the_file(tmp_path):
    path = tmp_path / "broken.tree"
    path.write_text("# comment\n(S (M (C identity))\n")
    with pytest.raises(TreeSyntaxError, match=rf"^{path}:2:"):
        load_tree(path)


# ----------------------------------------------------------------------------- check errors

IM = (3, 32, 32)

#: (tree text, grammar, input shape, node path in the message, fragment of the message).
CHECK_ERRORS = [
    # a symbol the grammar lacks
    (
        "(S (M (C identity)) (Q (C identity)))",
        "paper",
        IM,
        "S > Q#1",
        "the grammar has no symbol 'Q' (it has S, M, B, Branches, A, R1, R2, C)",
    ),
    # an operation nobody registered, with a suggestion
    (
        "(S (M (C lineer(d=16))) (M (C identity)))",
        "paper",
        IM,
        "S > M#0 > C#0 > lineer#0",
        "unknown operation 'lineer'; did you mean 'linear'?",
    ),
    # children that no alternative of the rule matches
    ("(S (M (C identity)))", "paper", IM, "S", "S cannot derive these children here; its rule is M M |"),
    ("(S (M (C identity)) (M (R1 identity)))", "paper", IM, "S > M#1", "M cannot derive these children"),
    # an argument value outside the grammar's grid (linear has d = 16 ... 2048)
    (
        "(S (M (C linear(d=3))) (M (C identity)))",
        "paper",
        IM,
        "S > M#0 > C#0 > linear#0",
        "linear(d=3) is not in the grammar's grid here; it allows linear(d=16), linear(d=32),",
    ),
    # a guard that selects a rule without the operation: col2im without an im2col
    ("(S (R1 identity) (M (C identity)) (R2 col2im))", "paper", IM, "S > R2#2", "R2 cannot derive"),
    # shapes that don't fit
    (
        "(S (R1 identity) (M (C identity)) (R2 col2im))",
        None,
        IM,
        "S > R2#2 > col2im#0",
        "col2im cannot apply to im[3x32x32]: col2im needs col mode",
    ),
    (
        "(S (R1 im2col(k=3, s=1, p=1)) (M (R1 permute(order=(2,1))) (M (C identity)) (R2 identity))"
        " (R2 col2im))",
        "paper",
        IM,
        "S > R2#2 > col2im#0",
        "the sequence length changed since the im2col (27 != 32*32)",
    ),
    (
        "(S (M (B group_dim(dim=2, b=4)) (Branches (M (C identity))*4) (A add)) (M (C identity)))",
        "paper",
        (3, 30, 30),
        "S > M#0 > B#0 > group_dim#0",
        "axis 2 of im[3x30x30] has size 30, not divisible into 4 groups",
    ),
    (
        "(S (B clone(b=2)) (Branches [(M (C linear(d=16))) (M (C identity))]) (A add))",
        "paper",
        IM,
        "S > A#2 > add#0",
        "add needs equal shapes, got im[16x32x32] and im[3x32x32]",
    ),
    # a repeat whose count is not the branching factor
    (
        "(S (B clone(b=4)) (Branches (M (C identity))*2) (A add))",
        "paper",
        IM,
        "S > Branches#1 > *2#0",
        "a repeat over 2 equal branches receives 4 x im[3x32x32]",
    ),
    # parallel branches that don't match the branching factor
    (
        "(S (B clone(b=4)) (Branches [(M (C identity)) (M (C identity))]) (A add))",
        None,
        IM,
        "S > Branches#1 > [parallel]#0",
        "2 parallel branches receive 4 x",
    ),
    # the root is not the start symbol
    ("(M (C identity))", "paper", IM, "M", "the root is M but the grammar starts at S"),
    # no rule's guard holds (the sequence grammar refuses images)
    (
        "(S (M (C identity)) (M (C identity)))",
        "sequences",
        IM,
        "S",
        "no rule for S applies to im[3x32x32] (guards: mode == col)",
    ),
    # a network that does not end in one tensor, and arguments the operation does not take
    ("(S (B clone(b=2)))", None, IM, "<root>", "the network ends in 2 branches"),
    ("(S (C linear(e=3)))", None, IM, "S > C#0 > linear#0", "bad arguments for linear"),
]


@pytest.mark.parametrize("text,grammar,shape,path,fragment", CHECK_ERRORS)
def test_check_errors_name_the_node(request, text, grammar, shape, path, fragment):
    g = None if grammar is None else request.getfixturevalue(grammar)
    with pytest.raises(TreeError) as info:
        check_tree(parse_tree(text), g, input_state(shape))
    assert info.value.path == path
    assert str(info.value).startswith(f"at node {path}: ")
    assert fragment in str(info.value)


# ----------------------------------------------------------------------------- statistics


def test_figure3_statistics_by_hand():
    """The brief's Fig. 3 block, linear(d=3) keeping the 3 channels so the skip can be added.

    d=3 is not in einspace.pcfg's grid (d = 16 ... 2048), so the grammar refuses it; its
    shapes check without a grammar. By hand, input im[3x32x32]:
      im2col(3,1,1) -> col[1024x27]; linear(d=3): params (27+1)*3 = 84,
        FLOPs (2*27+1)*3*1024 = 168,960; col2im -> im[3x32x32]
      norm: params 2*3 = 6, FLOPs 4*3072 = 12,288; leaky_relu: 3072; identity 0; add: 1*3072
      terminals 8 (clone im2col linear col2im norm leaky_relu identity add)
      non-terminals 17 (S B Branches A, 11 M/R1/R2/C in branch 1, M C in branch 2)
      depth 6 (S > Branches > M > M > M > C); one branching op, b = 2.
    """
    with pytest.raises(
        TreeError, match=r"at node S > Branches#1 > \[parallel\]#0 > M#0 > M#0 > M#1 > C#0 > linear"
    ):
        check_tree(FIG3_TREE, load_grammar("einspace"), input_state(IM))
    checked = check_tree(FIG3_TREE, None, input_state(IM))
    assert checked.stats.as_dict() == {
        "terminals": 8,
        "operations": 8,
        "nonterminals": 17,
        "depth": 6,
        "branching_factor": 2.0,
        "params": 90,
        "flops": 168_960 + 12_288 + 3072 + 3072,
        "output": "im[3x32x32]",
    }
    assert checked.stats.nodes == 8 + 17
    assert checked.stats.summary() == "params 90  FLOPs 187,392  depth 6  terminals 8  output im[3x32x32]"
    im2col = (1, 0, 0, 0, 0, 0)  # S > Branches > [parallel] > M > M > R1 > im2col
    assert node_at(FIG3_TREE, im2col) == Terminal("im2col", (("k", 3), ("s", 1), ("p", 1)))
    assert checked.facts[im2col].output == (input_state((1024, 27))._replace(folds=((32, 32),)),)


def test_figure3_with_grammar_widths_checks_against_the_paper_grammar(paper):
    """The same block with linear(d=16) on a 16-channel input is derivable from einspace.pcfg.

    linear on col[1024x144]: params 145*16 = 2320, FLOPs 289*16*1024 = 4,734,976; norm:
    params 32, FLOPs 4*16384; leaky_relu and add 16384 each.
    """
    tree = parse_tree(FIG3.replace("d=3", "d=16"))
    checked = check_tree(tree, paper, input_state((16, 32, 32)))
    assert checked.stats.as_dict() == {
        "terminals": 8,
        "operations": 8,
        "nonterminals": 17,
        "depth": 6,
        "branching_factor": 2.0,
        "params": 2320 + 32,
        "flops": 4_734_976 + 65_536 + 16_384 + 16_384,
        "output": "im[16x32x32]",
    }


def test_repeat_statistics_count_structure_once_and_costs_per_copy(paper):
    """clone(b=4), four separately weighted linear(d=16), add; input im[3x32x32]."""
    tree = parse_tree("(S (B clone(b=4)) (Branches (M (C linear(d=16)))*4) (A add))")
    checked = check_tree(tree, paper, input_state(IM))
    linear = (1, 0, 0, 0, 0)  # S > Branches > *4 > M > C > linear
    assert checked.facts[linear].copies == 4
    assert checked.facts[linear].params == (3 + 1) * 16
    assert checked.stats.as_dict() == {
        "terminals": 3,
        "operations": 6,  # clone, four copies of linear, add
        "nonterminals": 6,
        "depth": 4,
        "branching_factor": 4.0,
        "params": 4 * (3 + 1) * 16,
        "flops": 4 * (2 * 3 + 1) * 16 * 1024 + 3 * 16 * 1024,
        "output": "im[16x32x32]",
    }


def test_every_nesting_depth_parses_or_is_a_syntax_error():
    """Around Python's recursion limit either the parser or the transformer into nodes gives
    out first, depending on the depth and the stack in use: both are one clear error."""
    outcomes: list[str] = []
    depth = 300
    while outcomes[-10:] != ["refused"] * 10:  # every depth up to well past the first refusal
        depth += 1
        text = "(S " * depth + "(C identity)" + ")" * depth
        try:
            parse_tree(text)
            outcomes.append("parsed")
        except TreeSyntaxError as exc:
            assert "nested too deeply to read" in str(exc)
            outcomes.append("refused")
    assert "parsed" in outcomes

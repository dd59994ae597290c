"""The exact sampler (einspace.sampling.exact): limits at their boundaries, rejection reasons,
frequencies of tiny grammars against their probabilities by hand, and the sampler's bookkeeping.

Written in the mutation-testing round (scripts/mutation.py); fast: small grammars, a few hundred
draws each. Node and parameter counts come from the checker (`check_tree`), not the sampler.
"""

from __future__ import annotations

import random
import re
import sys

import pytest

from einspace import check_tree
from einspace.errors import SamplingError
from einspace.grammar import parse_grammar
from einspace.sampling import Limits, exact
from einspace.sampling.exact import ExactSampler
from einspace.state import FeatureState, input_state
from einspace.tree import Nonterminal, Terminal, to_text, tree_depth, walk_depths

COL = input_state((8, 16))  # a sequence of 8 tokens of 16 features
IM = input_state((2, 4, 4))


class Counting(random.Random):
    """A random stream that counts its draws."""

    draws = 0

    def random(self) -> float:
        self.draws += 1
        return super().random()


def _sampler(text: str, limits: Limits | None = None, seed: int = 0, x=COL) -> ExactSampler:
    return ExactSampler(parse_grammar(text), x, limits or Limits(max_depth=8), random_seed=seed)


def _nodes(tree) -> int:
    return sum(1 for _ in walk_depths(tree))


def _frames() -> int:
    """Frames on the stack from the caller's down (inspect.stack() would read every source file)."""
    frame, count = sys._getframe(1), 0
    while frame is not None:
        frame, count = frame.f_back, count + 1
    return count


def _frequency(sampler: ExactSampler, n: int, word: str) -> float:
    return sum(word in to_text(sampler.sample()) for _ in range(n)) / n


def test_a_tree_of_exactly_max_nodes_is_kept_and_one_more_node_is_not() -> None:
    grammar = "start S\nS -> linear(d = 4)"
    tree = _sampler(grammar).sample()
    size = _nodes(tree)
    assert size == 2  # S and its terminal
    assert to_text(_sampler(grammar, Limits(max_depth=8, max_nodes=size)).sample()) == to_text(tree)
    sampler = _sampler(grammar, Limits(max_depth=8, max_nodes=size - 1, max_attempts=1))
    with pytest.raises(
        SamplingError, match=r"^all 100 drafts .* \(100 by nodes\) within max_depth=8, max_nodes=1"
    ):
        sampler.sample()
    assert sampler.stats == {"drafts": 100, "nodes": 100}


def test_nodes_count_inner_symbols_and_terminals_alike() -> None:
    """S -> M M, M -> linear: 5 nodes; max_nodes 5 keeps it, 4 rejects it at the second terminal
    and 3 at the second symbol."""
    grammar = "start S\nS -> M M\nM -> linear(d = 4)"
    tree = _sampler(grammar).sample()
    assert _nodes(tree) == 5
    assert to_text(_sampler(grammar, Limits(max_depth=8, max_nodes=5)).sample()) == to_text(tree)
    for tight in (4, 3):
        sampler = _sampler(grammar, Limits(max_depth=8, max_nodes=tight, max_attempts=1))
        with pytest.raises(SamplingError, match=r"\(100 by nodes\)"):
            sampler.sample()


def test_max_params_is_inclusive_and_counts_every_repeated_copy() -> None:
    """A branch repeated twice carries its parameters twice: the budget is the checker's count."""
    grammar = "start S\nS -> clone(b = 2) R add\nR -> (M) * b\nM -> linear(d = 16) identity"
    tree = _sampler(grammar).sample()
    params = check_tree(tree, None, COL).params
    assert params == 2 * (16 * 16 + 16)
    assert to_text(_sampler(grammar, Limits(max_depth=8, max_params=params)).sample()) == to_text(tree)
    sampler = _sampler(grammar, Limits(max_depth=8, max_params=params - 1, max_attempts=1))
    with pytest.raises(SamplingError, match=r"\(100 by params\)"):
        sampler.sample()
    assert sampler.stats["params"] == 100


def test_repeated_branches_must_be_equal_or_the_draft_is_rejected() -> None:
    """(L, L) gives two branches of widths drawn independently; `(M) * b` needs them equal, so half
    of the drafts are rejected (by shapes), and the kept ones are the equal pairs, equally often."""
    grammar = (
        "start S\nS -> clone(b = 2) P R add\nP -> (L, L)\nL -> linear(d = 4 | 8)\nR -> (M) * b\nM -> identity"
    )
    sampler = _sampler(grammar, seed=3)
    trees = [to_text(sampler.sample()) for _ in range(400)]
    assert all(t.count("d=4") in (0, 2) for t in trees)
    share = sum("d=4" in t for t in trees) / len(trees)
    assert 0.4 < share < 0.6  # 1/2; 5 standard deviations are 0.125
    assert sampler.stats["accepted"] == 400 and 0.3 < sampler.stats["shapes"] / sampler.stats["drafts"] < 0.7
    assert set(sampler.stats) == {"drafts", "accepted", "shapes"}


def test_branches_of_operations_that_do_not_add_up_are_rejected_by_shapes() -> None:
    """Operations drawn directly in a parallel item, then `add`: the unequal pairs are rejected
    when `add` is applied (shapes), the equal ones kept with the parameters of both branches."""
    grammar = "start S\nS -> clone(b = 2) P add\nP -> (linear(d = 4 | 8), linear(d = 4 | 8))"
    sampler = _sampler(grammar, seed=0)
    trees = [sampler.sample() for _ in range(200)]
    assert all(to_text(t).count("d=4") in (0, 2) for t in trees)
    assert set(sampler.stats) == {"drafts", "accepted", "shapes"} and sampler.stats["shapes"] > 50
    budget = 2 * (16 * 4 + 4)  # both branches of width 4
    narrow = _sampler(grammar, Limits(max_depth=8, max_params=budget), seed=0)
    assert all("d=8" not in to_text(narrow.sample()) for _ in range(20)) and narrow.stats["params"] > 0


def test_rejections_of_several_kinds_are_all_named() -> None:
    sampler = _sampler(
        "start S\nS -> M\nM -> M M @ 0.5 | identity @ 0.5",
        Limits(max_depth=6, min_depth=4, max_nodes=5, max_attempts=1),
    )
    with pytest.raises(
        SamplingError, match=r"\((\d+ by min_depth, \d+ by nodes|\d+ by nodes, \d+ by min_depth)\)"
    ):
        sampler.sample()


def test_frequencies_follow_the_alternatives_and_the_argument_grid() -> None:
    """P(linear) = 0.8 x 1/4 per width, P(identity) = 0.2: 2000 draws within 5 standard deviations."""
    sampler = _sampler("start S\nS -> linear(d = 2 | 4 | 8 | 16) @ 0.8 | identity @ 0.2", seed=5)
    counts: dict[str, int] = {}
    for _ in range(2000):
        text = to_text(sampler.sample())
        counts[text] = counts.get(text, 0) + 1
    assert len(counts) == 5
    p = 0.2  # identity 0.2, each width 0.8 / 4 = 0.2: five equally likely trees
    assert all(abs(count / 2000 - p) < 5 * (p * (1 - p) / 2000) ** 0.5 for count in counts.values()), counts


def test_dead_ends_are_never_drafted() -> None:
    """`clone` alone ends in two branches, never a tree: the alternatives that complete keep their
    relative probabilities (identity 0.125 / (0.125 + 0.375) = 1/4) and no draft is wasted."""
    grammar = "start S\nS -> clone(b = 2) @ 0.5 | identity @ 0.125 | linear(d = 4) @ 0.375"
    sampler = _sampler(grammar, seed=2)
    share = _frequency(sampler, 2000, "identity")
    assert abs(share - 0.25) < 5 * (0.25 * 0.75 / 2000) ** 0.5
    assert sampler.stats["drafts"] == sampler.stats["accepted"] == 2000  # clone is never drafted


def test_several_roots_of_different_modes_are_all_drawn() -> None:
    """An image input: `identity` ends in im mode, `im2col` in col mode: two root plans."""
    grammar = "start S\nS -> identity @ 0.25 | im2col(k = 1, s = 1, p = 0) @ 0.75"
    sampler = _sampler(grammar, seed=1, x=input_state((2, 4, 4)))
    assert len(sampler._roots) == 2
    share = _frequency(sampler, 2000, "identity")
    assert abs(share - 0.25) < 5 * (0.25 * 0.75 / 2000) ** 0.5


def test_forced_choices_draw_no_random_numbers() -> None:
    """One root, one alternative, one argument: nothing is drawn; each real choice draws one."""
    grammar = parse_grammar("start S\nS -> M M\nM -> linear(d = 4)")
    rng = Counting(0)
    sampler = ExactSampler(grammar, COL, Limits(max_depth=8), rng=rng)
    sampler.sample()
    assert rng.draws == 0
    chosen = parse_grammar("start S\nS -> M M\nM -> linear(d = 4 | 8)")
    rng = Counting(0)
    ExactSampler(chosen, COL, Limits(max_depth=8), rng=rng).sample()
    assert rng.draws == 2


def test_min_depth_rejects_whole_shallow_drafts() -> None:
    grammar = "start S\nS -> M\nM -> M M @ 0.5 | identity @ 0.5"
    sampler = _sampler(grammar, Limits(max_depth=6, min_depth=4), seed=0)
    depths = [tree_depth(sampler.sample()) for _ in range(100)]
    assert min(depths) == 4 and max(depths) <= 6
    assert sampler.stats["min_depth"] > 0
    assert sampler.stats["drafts"] == sampler.stats["accepted"] + sampler.stats["min_depth"]


def test_minimum_costs_reject_under_their_own_names() -> None:
    grammar = "start S\nS -> linear(d = 4 | 64)"
    sampler = _sampler(grammar, Limits(max_depth=8, min_params=16 * 64), seed=0)
    assert all("d=64" in to_text(sampler.sample()) for _ in range(20))
    assert sampler.stats["min_params"] > 0 and "min_flops" not in sampler.stats
    sampler = _sampler(grammar, Limits(max_depth=8, min_flops=10**9, max_attempts=1), seed=0)
    with pytest.raises(SamplingError, match=r"^all 100 drafts .* \(100 by min_flops\)"):
        sampler.sample()


def test_the_give_up_message_counts_only_this_call() -> None:
    """Reasons are those of the failed call, not earlier ones; drafts are max_attempts x 100."""
    grammar = "start S\nS -> linear(d = 4 | 64)"
    sampler = _sampler(grammar, Limits(max_depth=8, max_params=100, max_attempts=2), seed=0)
    sampler.sample()  # d = 4 (80 parameters) fits
    rejected_before = sampler.stats["params"]
    sampler.limits = Limits(max_depth=8, max_params=10, max_attempts=2)
    with pytest.raises(SamplingError) as error:
        sampler.sample()
    assert str(error.value) == (
        "all 200 drafts of a tree for input col[8x16] were rejected (200 by params) within "
        "max_depth=8, max_nodes=2000, min_depth=0, max_params=10, min_params=0, min_flops=0, max_flops=None, "
        "max_operations=None; the limits may be too tight"
    )
    assert sampler.stats["params"] == rejected_before + 200
    assert exact.DRAFTS_PER_ATTEMPT == 100


def test_a_grammar_that_derives_nothing_names_the_symbol_input_and_depth() -> None:
    sampler = _sampler("start S\nS if mode == im -> identity", Limits(max_depth=5))
    with pytest.raises(SamplingError) as error:
        sampler.sample()
    assert str(error.value) == (
        "the grammar derives no tree of S for input col[8x16] within max_depth=5: no derivation's "
        "guards, modes and branch counts fit"
    )


def test_leaves_and_preterminals_are_shared_values() -> None:
    """Equal leaves are one object; a pre-terminal is one object per (symbol, leaf)."""
    sampler = _sampler("start S\nS -> M M M\nM -> linear(d = 4) | identity", seed=4)
    trees = [sampler.sample() for _ in range(30)]
    kids = [kid for tree in trees for kid in tree.children]
    by_text: dict[str, Nonterminal] = {}
    for kid in kids:
        assert kid is by_text.setdefault(to_text(kid), kid)
        assert isinstance(kid.children[0], Terminal)
    assert len(by_text) == 2


def test_deep_trees_raise_the_recursion_limit_only_while_sampling() -> None:
    """Trees deeper than the recursion limit allows (one frame per level here): the sampler raises
    the limit while it draws and restores it afterwards."""
    previous = sys.getrecursionlimit()
    limit = _frames() + 50  # 50 frames left: a draft 150 levels deep needs more
    grammar = "start S\nS -> M\nM -> M identity @ 0.99 | identity @ 0.01"
    sampler = _sampler(grammar, Limits(max_depth=200, min_depth=150), seed=0)
    sys.setrecursionlimit(limit)
    try:
        tree = sampler.sample()
        assert sys.getrecursionlimit() == limit
    finally:
        sys.setrecursionlimit(previous)
    assert tree_depth(tree) >= 150, sampler.stats


@pytest.mark.parametrize(
    "abstract, out, shown",
    [
        (("col", 2), (COL,), "col[8x16]"),  # the branch count is not the predicted one
        (("im", 1), (COL,), "col[8x16]"),  # nor the mode
        (("col", 2), (COL, IM), "2 x (col[8x16], im[2x4x4])"),  # branches of different modes
        (("col", 1), (FeatureState((8, 16, 2), "col"),), "col[8x16x2]"),  # a rank not the mode's
    ],
)
def test_an_operation_breaking_its_abstract_contract_is_an_error(
    monkeypatch: pytest.MonkeyPatch, abstract: tuple[str, int], out: tuple, shown: str
) -> None:
    """The tables trust `abstract`; an operation whose result it does not predict is reported."""
    op = exact.get_op("identity")
    monkeypatch.setattr(op, "abstract", lambda mode, b, kwargs: abstract)
    monkeypatch.setattr(op, "transfer", lambda signal, kwargs: out)
    message = (
        rf"^operation identity with \{{\}} on col\[8x16\] gives {re.escape(shown)}, which its abstract\(\) "
        rf"contract does not predict \({re.escape(repr(abstract))}\); the exact sampling mode relies on it$"
    )
    with pytest.raises(SamplingError, match=message):
        exact._apply("identity", (), (COL,))


def test_a_contract_that_holds_gives_the_output_and_parameters() -> None:
    assert exact._apply("linear", (("d", 4),), (COL,)) == ((FeatureState((8, 4), "col"),), 16 * 4 + 4)
    assert exact._apply("add", (), (COL,)) is None  # an aggregation of one branch: infeasible


def test_the_memo_of_operation_results_is_cleared_past_its_limit() -> None:
    sampler = _sampler("start S\nS -> linear(d = 4)")
    for size, kept in ((exact._CACHE_LIMIT, True), (exact._CACHE_LIMIT + 1, False)):
        sampler._infer.clear()
        sampler._infer.update({("x", (), (i,)): None for i in range(size)})
        sampler.sample()
        assert (len(sampler._infer) > size) is kept


def test_stack_depth_counts_the_frames_below() -> None:
    def deeper() -> int:
        return exact._stack_depth()

    # one frame more from one call deeper; at least the caller's frames (mutmut's wrappers add some)
    assert deeper() == exact._stack_depth() + 1
    assert exact._stack_depth() > _frames()

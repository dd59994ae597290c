"""The sampler: reproducibility, renormalisation over feasible options, backtracking, limits, failing fast."""

from __future__ import annotations

import collections
import time

import pytest

from einspace import check_tree, load_grammar
from einspace.errors import EinspaceError, SamplingError
from einspace.grammar import parse_grammar
from einspace.sampling import Limits, Sampler, sample_tree
from einspace.state import input_state
from einspace.tree import Nonterminal, Terminal, to_text, walk

IMAGE = input_state((3, 32, 32))


@pytest.fixture(scope="module")
def paper():
    return load_grammar("grammars/einspace.pcfg")


def terminals(tree):
    return [node for _, node in walk(tree) if isinstance(node, Terminal)]


def test_same_random_seed_same_tree(paper):
    first = [to_text(sample_tree(paper, IMAGE, random_seed=s)) for s in range(20)]
    again = [to_text(sample_tree(paper, IMAGE, random_seed=s)) for s in range(20)]
    assert first == again
    assert len(set(first)) > 10  # and different seeds give different trees


def test_a_sampler_continues_its_stream(paper):
    a = Sampler(paper, IMAGE, random_seed=3)
    b = Sampler(paper, IMAGE, random_seed=3)
    assert [to_text(a.sample()) for _ in range(5)] == [to_text(b.sample()) for _ in range(5)]


def test_probabilities_are_followed():
    grammar = parse_grammar("start S\nS -> leaky_relu @ 0.7 | softmax @ 0.2 | norm")
    sampler = Sampler(grammar, IMAGE, random_seed=0)
    counts = collections.Counter(terminals(sampler.sample())[0].op for _ in range(4000))
    assert counts["leaky_relu"] / 4000 == pytest.approx(0.7, abs=0.03)
    assert counts["softmax"] / 4000 == pytest.approx(0.2, abs=0.03)
    assert counts["norm"] / 4000 == pytest.approx(0.1, abs=0.03)


def test_infeasible_options_are_renormalised_away():
    # On a 6x6 input the 8x8 kernel can never apply: the other two kernels share its mass.
    grammar = parse_grammar(
        "start S\nS -> im2col((k, s, p) = (8, 8, 0) | (3, 1, 1) | (1, 1, 0)) linear(d = 16) col2im"
    )
    sampler = Sampler(grammar, input_state((3, 6, 6)), random_seed=0)
    counts = collections.Counter(dict(terminals(sampler.sample())[0].args)["k"] for _ in range(2000))
    assert set(counts) == {1, 3}
    assert counts[3] / 2000 == pytest.approx(0.5, abs=0.04)


def test_argument_grid_is_uniform_per_axis():
    grammar = parse_grammar("start S\nS -> group_dim(dim = 1 | 2 | 3, b = 2 | 4) add")
    sampler = Sampler(grammar, input_state((8, 8, 8)), random_seed=0)
    counts = collections.Counter(terminals(sampler.sample())[0].args for _ in range(3000))
    assert len(counts) == 6
    assert all(c / 3000 == pytest.approx(1 / 6, abs=0.03) for c in counts.values())


def test_backtracking_revisits_the_latest_decision():
    # Only concat along the channel axis fits after these branches; add and the other concats
    # fail, so the aggregation's choice is revisited until one fits.
    grammar = parse_grammar(
        """
        start S
        S -> clone(b = 2) (X, Y) A
        X -> linear(d = 16)
        Y -> linear(d = 32)
        A -> add | concat(dim = 1 | 2 | 3, b = 2)
        """
    )
    for seed in range(20):
        tree = sample_tree(grammar, IMAGE, random_seed=seed)
        assert to_text(tree).endswith("(A concat(dim=1, b=2)))")


def test_guards_choose_rules_by_attributes(paper):
    for seed in range(200):
        tree = sample_tree(paper, IMAGE, random_seed=seed)
        checked = check_tree(tree, paper, IMAGE)
        for path, node in walk(tree):
            if isinstance(node, Nonterminal) and node.symbol == "R1":
                if checked.facts[path].input[0].mode == "col":
                    assert node.children[0].op in ("identity", "permute")


def test_impossible_grammar_fails_fast_with_a_message():
    grammar = parse_grammar("start S\nS -> im2col((k, s, p) = (16, 16, 0)) linear(d = 16) col2im")
    started = time.process_time()
    with pytest.raises(SamplingError, match="found no tree of S"):
        sample_tree(grammar, input_state((3, 8, 8)), random_seed=0)
    assert time.process_time() - started < 1.0


def test_step_budget_bounds_a_hopeless_search():
    # Every derivation is feasible until the very last item, which never is: a search that
    # would enumerate forever instead stops at the step budget and says so.
    grammar = parse_grammar(
        """
        start S
        S -> M col2im
        M -> M M | leaky_relu | norm | softmax
        """
    )
    limits = Limits(max_depth=30, max_nodes=500, max_steps=2000, max_attempts=3)
    started = time.process_time()
    with pytest.raises(SamplingError, match="in 3 attempts"):
        sample_tree(grammar, IMAGE, random_seed=0, limits=limits)
    assert time.process_time() - started < 5.0


@pytest.mark.parametrize("max_depth,max_nodes", [(3, 2000), (8, 20), (40, 60)])
def test_limits_hold(paper, max_depth, max_nodes):
    limits = Limits(max_depth=max_depth, max_nodes=max_nodes)
    for seed in range(50):
        stats = check_tree(sample_tree(paper, IMAGE, seed, limits), paper, IMAGE).stats
        assert stats.depth <= max_depth
        assert stats.nodes <= max_nodes


def test_min_depth_and_parameter_budget(paper):
    limits = Limits(min_depth=6, max_params=50_000)
    sampler = Sampler(paper, IMAGE, limits, random_seed=1)
    for _ in range(30):
        stats = check_tree(sampler.sample(), paper, IMAGE).stats
        assert stats.depth >= 6
        assert stats.params <= 50_000


def test_bad_limits_are_refused():
    with pytest.raises(EinspaceError, match="min_depth"):
        Limits(min_depth=10, max_depth=5)
    with pytest.raises(EinspaceError, match="max_nodes"):
        Limits(max_nodes=0)

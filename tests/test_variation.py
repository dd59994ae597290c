"""Mutation and crossover keep trees valid, within limits, and never return the parent."""

from __future__ import annotations

import random

import pytest

from einspace import Limits, Variation, check_tree, load_grammar, parse_tree, sample_tree
from einspace.errors import VariationError
from einspace.state import input_state
from einspace.tree import Nonterminal, walk

IMAGE = input_state((3, 32, 32))


@pytest.fixture(scope="module")
def paper():
    return load_grammar("grammars/einspace.pcfg")


def test_mutation_chain_stays_valid_and_changes(paper):
    limits = Limits(max_depth=12, max_nodes=150)
    variation = Variation(paper, IMAGE, limits, rng=random.Random(0))
    tree = sample_tree(paper, IMAGE, random_seed=0, limits=limits)
    for _ in range(200):
        child = variation.mutate(tree)
        assert child != tree
        check_tree(child, paper, IMAGE)
        tree = child


def test_mutation_is_reproducible(paper):
    tree = sample_tree(paper, IMAGE, random_seed=5)
    runs = []
    for _ in range(2):
        variation = Variation(paper, IMAGE, rng=random.Random(42))
        runs.append([variation.mutate(tree) for _ in range(10)])
    assert runs[0] == runs[1]


def test_mutation_of_a_minimal_tree(paper):
    # The smallest tree: S -> M M with two computation modules. Every mutation still differs.
    tree = parse_tree("(S (M (C identity)) (M (C identity)))")
    variation = Variation(paper, IMAGE, rng=random.Random(1))
    children = {variation.mutate(tree) for _ in range(30)}
    assert tree not in children
    assert len(children) > 10


def test_crossover_exchanges_matching_subtrees(paper):
    a = parse_tree("(S (M (C norm)) (M (C leaky_relu)))")
    b = parse_tree("(S (M (M (C softmax)) (M (C identity))) (M (C pos_enc)))")
    variation = Variation(paper, IMAGE, rng=random.Random(0))
    children = {variation.crossover(a, b) for _ in range(40)}
    for child in children:
        check_tree(child, paper, IMAGE)
        assert child != a
    # Both sites of `a` can take any shape-preserving M of `b`.
    assert parse_tree("(S (M (M (C softmax)) (M (C identity))) (M (C leaky_relu)))") in children
    assert parse_tree("(S (M (C norm)) (M (C pos_enc)))") in children


def test_crossover_without_compatible_subtrees_says_so(paper):
    a = parse_tree("(S (M (C norm)) (M (C leaky_relu)))")
    b = parse_tree("(S (R1 im2col(k=4, s=4, p=0)) (M (C norm)) (R2 identity))")
    variation = Variation(paper, IMAGE, rng=random.Random(0))
    # b's only modules work on col features, a's on im features: nothing receives the same signal.
    with pytest.raises(VariationError, match="no exchangeable subtrees"):
        variation.crossover(a, b)


def test_crossover_respects_limits(paper):
    limits = Limits(max_depth=6, max_nodes=40)
    variation = Variation(paper, IMAGE, limits, rng=random.Random(3))
    trees = [sample_tree(paper, IMAGE, random_seed=s, limits=limits) for s in range(30)]
    made = 0
    for a, b in zip(trees, trees[1:], strict=False):
        try:
            child = variation.crossover(a, b)
        except VariationError:
            continue
        made += 1
        nodes = sum(isinstance(n, Nonterminal) for _, n in walk(child))
        assert nodes <= 40
    assert made > 5

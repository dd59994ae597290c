"""The limit `max_operations` on the network's terminal operations, each Repeat copy counted
(`CheckedTree.operations`): the count against an independent expansion of the tree, the boundary
in every sampling mode and in mutation, the exact mode's early rejection, and a limit no tree
meets. (Bad values, an experiment, `einspace sample` and a search under every cost limit at once:
tests/test_min_limits.py.)"""

from __future__ import annotations

import random

import pytest

from einspace import check_tree, load_grammar
from einspace.errors import SamplingError, VariationError
from einspace.grammar import parse_grammar
from einspace.sampling import Limits, make_sampler
from einspace.sampling.rejection import RejectionSampler
from einspace.sampling.variation import Variation, limit_violation
from einspace.state import input_state
from einspace.tree import Node, Parallel, Terminal, parse_tree, to_text, walk

#: Two trees: a linear layer and an activation (2 operations), or clone(b=4), four separately
#: weighted linear layers and add (1 + 4 + 1 = 6 operations; 8 derivation nodes).
GRAMMAR = """start S
S -> linear(d = 16) leaky_relu
   | B Branches A
B -> clone(b = 4)
Branches if b == 4 -> (M) * b
M -> linear(d = 16)
A -> add
"""
X = input_state((3, 8, 8))
SMALL = parse_tree("(S linear(d=16) leaky_relu)")
LARGE = parse_tree("(S (B clone(b=4)) (Branches (M linear(d=16))*4) (A add))")


def _expanded(node: Node) -> Node:
    """The tree with every Repeat written out as a Parallel of its copies."""
    if node.kind == "terminal":
        return node
    if node.kind == "repeat":
        return Parallel((_expanded(node.child),) * node.times)
    return node.with_children(tuple(_expanded(child) for child in node.children))


def _terminals(tree: Node) -> int:
    return sum(isinstance(node, Terminal) for _, node in walk(tree))


def _samplers(limits: Limits):
    grammar = parse_grammar(GRAMMAR)
    yield "paper", make_sampler(grammar, X, limits, "paper", random_seed=0)
    yield "exact", make_sampler(grammar, X, limits, "exact", random_seed=0)
    yield "rejection", RejectionSampler(grammar, X, limits, random_seed=0)


def test_operations_count_each_repeat_copy():
    grammar = parse_grammar(GRAMMAR)
    small, large = check_tree(SMALL, grammar, X), check_tree(LARGE, grammar, X)
    assert (small.operations, large.operations) == (2, 6)
    assert (large.stats.terminals, large.stats.operations, large.stats.nodes) == (3, 6, 8)


def test_operations_equal_the_terminals_of_the_expanded_tree_on_the_bundled_grammar():
    """Nested repeats multiply: 80 samples of the bundled grammar, against the terminals of the
    tree with each Repeat written out (some samples hold hundreds of copies)."""
    grammar, x = load_grammar("einspace"), input_state((1, 8, 8))
    sampler = make_sampler(grammar, x, Limits(max_depth=16, max_nodes=150), "paper", random_seed=3)
    counts = []
    for _ in range(80):
        tree = sampler.sample()
        counts.append(check_tree(tree, grammar, x).operations)
        assert counts[-1] == _terminals(_expanded(tree)), to_text(tree)
    assert max(counts) > 4 * 150  # repeats do multiply here: more operations than max_nodes allows nodes


def test_a_tree_of_exactly_the_limit_is_accepted_by_every_mode():
    """At 6 both trees are drawn, by every mode; at 5 (and at 2) only the small one."""
    for mode, sampler in _samplers(Limits(max_operations=6)):
        assert {to_text(sampler.sample()) for _ in range(60)} == {to_text(SMALL), to_text(LARGE)}, mode
    for limit in (5, 2):
        for mode, sampler in _samplers(Limits(max_operations=limit)):
            assert {to_text(sampler.sample()) for _ in range(30)} == {to_text(SMALL)}, (mode, limit)


def test_the_exact_mode_rejects_a_draft_as_soon_as_it_is_over(monkeypatch):
    """The draft is dropped while drawing (counted by the limit's name): only drafts within the
    limit are checked whole, once each."""
    import einspace.sampling.base as base

    checked = []
    monkeypatch.setattr(base, "check_tree", lambda *a: checked.append(1) or check_tree(*a))
    sampler = make_sampler(parse_grammar(GRAMMAR), X, Limits(max_operations=5), "exact", random_seed=1)
    for _ in range(40):
        assert sampler.sample() == SMALL
    assert sampler.stats["max_operations"] > 0 and sampler.stats["accepted"] == 40
    assert len(checked) == 40


def test_a_limit_no_tree_meets_is_refused_by_every_mode():
    limits = Limits(max_attempts=2, max_operations=1)
    for mode, sampler in _samplers(limits):
        with pytest.raises(SamplingError, match="max_operations=1"):
            sampler.sample()
        assert mode
    exact = make_sampler(parse_grammar(GRAMMAR), X, limits, "exact", random_seed=0)
    with pytest.raises(SamplingError, match=r"all 200 drafts .*\(200 by max_operations\)"):
        exact.sample()
    paper = make_sampler(parse_grammar(GRAMMAR), X, limits, "paper", random_seed=0)
    with pytest.raises(SamplingError, match="trees rejected by max_operations"):
        paper.sample()


def test_limit_violation_and_mutation_at_the_boundary():
    grammar = parse_grammar(GRAMMAR)
    checked = check_tree(LARGE, grammar, X)
    assert limit_violation(checked, Limits(max_operations=6)) is None
    assert limit_violation(checked, Limits(max_operations=5)) == "6 operations > max_operations 5"
    # the small tree's only mutation is the large one: refused at 5, made at 6
    variation = Variation(grammar, X, Limits(max_operations=5), rng=random.Random(0))
    with pytest.raises(VariationError, match="no valid mutation .*max_operations=5"):
        variation.mutate(SMALL)
    variation = Variation(grammar, X, Limits(max_operations=6), rng=random.Random(0))
    assert variation.mutate(SMALL) == LARGE


def test_einspace_sample_prints_the_operations_and_keeps_the_limit(tmp_path, capsys):
    from einspace.cli import main

    (tmp_path / "two.pcfg").write_text(GRAMMAR)
    argv = ["sample", str(tmp_path / "two.pcfg"), "--input", "3,8,8", "-n", "12", "--random-seed", "0"]
    assert main(argv) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if "operations" in line]
    assert {line.split("operations ")[1].split()[0] for line in lines} == {"2", "6"}
    assert main([*argv, "--max-operations", "5"]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if "operations" in line]
    assert len(lines) == 12 and all("terminals 2  operations 2  " in line for line in lines)

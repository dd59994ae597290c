"""The FLOP budget `max_flops` (analytic FLOPs per sample): a tree of exactly the budget is
accepted and one above refused, by every sampling mode and by mutation, and a value of the wrong
type names the key. With the training evaluator's own `max_flops` an over-budget tree fails at
once; this limit keeps it from being proposed at all. (A budget no tree meets, bad values, the
bundled grammar's mutation and crossover, an experiment and `einspace sample` under every cost
limit at once: tests/test_min_limits.py.)"""

from __future__ import annotations

import random

import pytest
from search_helpers import BASE, merge
from test_min_limits import LARGE_TREE, SMALL_TREE, TWO, X, _costs, _samplers

from einspace import check_tree
from einspace.errors import VariationError
from einspace.grammar import parse_grammar
from einspace.sampling import Limits
from einspace.sampling.variation import Variation, limit_violation
from einspace.search.config import ConfigError, parse_experiment
from einspace.tree import to_text

SMALL_FLOPS, LARGE_FLOPS = _costs(SMALL_TREE)[1], _costs(LARGE_TREE)[1]


def test_a_tree_of_exactly_the_budget_is_accepted_by_every_mode():
    """At max = the small tree's FLOPs only it is drawn, by every mode; at the large tree's both."""
    assert SMALL_FLOPS < LARGE_FLOPS
    for mode, sampler in _samplers(Limits(max_flops=SMALL_FLOPS)):
        assert {to_text(sampler.sample()) for _ in range(20)} == {to_text(SMALL_TREE)}, mode
    for mode, sampler in _samplers(Limits(max_flops=LARGE_FLOPS)):
        drawn = {to_text(sampler.sample()) for _ in range(60)}
        assert drawn == {to_text(SMALL_TREE), to_text(LARGE_TREE)}, mode


def test_limit_violation_and_mutation_at_the_boundary():
    grammar = parse_grammar(TWO)
    checked = check_tree(LARGE_TREE, grammar, X)
    assert limit_violation(checked, Limits(max_flops=LARGE_FLOPS)) is None
    message = limit_violation(checked, Limits(max_flops=LARGE_FLOPS - 1))
    assert message == f"{LARGE_FLOPS} FLOPs > max_flops {LARGE_FLOPS - 1}"
    # the small tree's only mutation is the large one: refused one below its FLOPs, allowed at them
    variation = Variation(grammar, X, Limits(max_flops=LARGE_FLOPS - 1), rng=random.Random(0))
    with pytest.raises(VariationError, match=f"no valid mutation .*max_flops={LARGE_FLOPS - 1}"):
        variation.mutate(SMALL_TREE)
    variation = Variation(grammar, X, Limits(max_flops=LARGE_FLOPS), rng=random.Random(0))
    assert variation.mutate(SMALL_TREE) == LARGE_TREE


def test_a_budget_of_the_wrong_type_names_the_key():
    with pytest.raises(ConfigError, match="limits.max_flops must be an integer or null, got str"):
        parse_experiment(merge(BASE, {"limits": {"max_flops": "many"}}), "exp.yaml")

"""The FLOP budget `max_flops` (analytic FLOPs per sample): every sampling mode and mutation keep
it, a tree of exactly the budget is accepted and one above refused, bad values are refused naming
the setting, and an experiment or `einspace sample` carries it. With the training evaluator's own
`max_flops`, an over-budget tree fails at once; this limit keeps it from being proposed at all.
(Bad values: tests/test_min_limits.py's table of bad cost limits.)"""

from __future__ import annotations

import random

import pytest
from search_helpers import BASE, merge
from test_min_limits import LARGE_TREE, SMALL_TREE, TWO, X, _costs, _samplers

from einspace import check_tree, load_grammar
from einspace.cli import main
from einspace.errors import SamplingError, VariationError
from einspace.grammar import parse_grammar
from einspace.sampling import Limits, make_sampler
from einspace.sampling.variation import Variation, limit_violation
from einspace.search.config import ConfigError, parse_experiment
from einspace.tree import parse_tree, to_text

SMALL_FLOPS, LARGE_FLOPS = _costs(SMALL_TREE)[1], _costs(LARGE_TREE)[1]


def test_a_tree_of_exactly_the_budget_is_accepted_by_every_mode():
    """At max = the small tree's FLOPs only it is drawn, by every mode; at the large tree's both."""
    assert SMALL_FLOPS < LARGE_FLOPS
    for mode, sampler in _samplers(Limits(max_flops=SMALL_FLOPS)):
        assert {to_text(sampler.sample()) for _ in range(20)} == {to_text(SMALL_TREE)}, mode
    for mode, sampler in _samplers(Limits(max_flops=LARGE_FLOPS)):
        drawn = {to_text(sampler.sample()) for _ in range(60)}
        assert drawn == {to_text(SMALL_TREE), to_text(LARGE_TREE)}, mode


def test_one_below_the_smallest_tree_is_refused_by_every_mode():
    limits = Limits(max_attempts=2, max_flops=SMALL_FLOPS - 1)
    for _, sampler in _samplers(limits):
        with pytest.raises(SamplingError, match=f"max_flops={SMALL_FLOPS - 1}"):
            sampler.sample()
    exact = make_sampler(parse_grammar(TWO), X, limits, "exact", random_seed=0)
    with pytest.raises(SamplingError, match=r"all 200 drafts .*\(200 by max_flops\)"):
        exact.sample()


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


def test_mutation_and_crossover_of_the_bundled_grammar_keep_the_budget():
    grammar, x = load_grammar("einspace"), X
    limits = Limits(max_depth=14, max_nodes=120, max_flops=300_000)
    rng = random.Random(3)
    sampler = make_sampler(grammar, x, limits, "paper", rng=rng)
    variation = Variation(grammar, x, limits, rng=rng)
    tree, other, children = sampler.sample(), sampler.sample(), 0
    for _ in range(25):
        for make in (lambda t: variation.mutate(t), lambda t: variation.crossover(t, other)):
            try:
                child = make(tree)
            except VariationError:
                continue
            assert check_tree(child, grammar, x).flops <= limits.max_flops
            tree, children = child, children + 1
    assert children >= 20


def test_a_budget_of_the_wrong_type_names_the_key():
    with pytest.raises(ConfigError, match="limits.max_flops must be an integer or null, got str"):
        parse_experiment(merge(BASE, {"limits": {"max_flops": "many"}}), "exp.yaml")


def test_an_experiment_carries_the_budget_to_its_samples():
    e = parse_experiment(merge(BASE, {"limits": {"max_flops": 200_000}}), "exp.yaml")
    assert e.limits.max_flops == 200_000 and e.to_dict()["limits"]["max_flops"] == 200_000
    space = e.space()
    sampler = space.sampler(random.Random(0))
    for _ in range(5):
        assert check_tree(sampler.sample(), space.grammar, e.input.state()).flops <= 200_000


@pytest.mark.parametrize("sampling", ["paper", "exact"])
def test_cli_sample_keeps_max_flops(sampling, capsys, tmp_path):
    argv = ["sample", "einspace", "--input", "3,8,8", "-n", "6", "--random-seed", "1", "--sampling", sampling]
    argv += ["--max-depth", "12", "--max-nodes", "100", "--max-flops", "100000", "--out", str(tmp_path)]
    assert main(argv) == 0
    capsys.readouterr()
    files = sorted(tmp_path.glob("*.tree"))
    assert len(files) == 6
    for path in files:
        assert check_tree(parse_tree(path.read_text()), load_grammar("einspace"), X).flops <= 100_000

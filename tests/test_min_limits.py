"""The minimums on a tree's costs, `min_params` and `min_flops` (no degenerate candidates): every
sampling mode and mutation keep them, a tree of exactly the minimum is accepted and one below
refused, bad values are refused naming the setting, and a sampler that cannot meet them says so.
The tests of every cost limit at once (the bundled grammar's variation, an experiment, `einspace
sample`, a search) also hold `max_flops` and `max_operations` (their boundaries:
tests/test_max_flops.py, tests/test_max_operations.py). (The exact mode's distribution under them:
tests/test_exact_sampling.py; random limits: tests/test_properties.py.)"""

from __future__ import annotations

import random

import pytest
import yaml
from search_helpers import BASE, merge

from einspace import check_tree, load_grammar
from einspace.cli import main
from einspace.errors import EinspaceError, SamplingError, VariationError
from einspace.grammar import parse_grammar
from einspace.sampling import Limits, make_sampler
from einspace.sampling.rejection import RejectionSampler
from einspace.sampling.variation import Variation, limit_violation
from einspace.search.config import ConfigError, parse_experiment
from einspace.state import input_state
from einspace.tree import parse_tree, to_text

#: Two trees only: linear(d=16) and linear(d=32) on 3x8x8 (the smaller has fewer params and FLOPs).
TWO = "start S\nS -> linear(d = 16 | 32)"
X = input_state((3, 8, 8))
SMALL_TREE = parse_tree("(S linear(d=16))")
LARGE_TREE = parse_tree("(S linear(d=32))")


def _costs(tree):
    checked = check_tree(tree, parse_grammar(TWO), X)
    return checked.params, checked.flops


def _samplers(limits: Limits, seed: int = 0):
    grammar = parse_grammar(TWO)
    yield "paper", make_sampler(grammar, X, limits, "paper", random_seed=seed)
    yield "exact", make_sampler(grammar, X, limits, "exact", random_seed=seed)
    yield "rejection", RejectionSampler(grammar, X, limits, random_seed=seed)


def _minimum(setting: str, tree) -> int:
    params, flops = _costs(tree)
    return params if setting == "min_params" else flops


@pytest.mark.parametrize("setting", ["min_params", "min_flops"])
def test_a_tree_of_exactly_the_minimum_is_accepted_by_every_mode(setting):
    """At min = the large tree's count only it is drawn, by every mode; at min = the small
    tree's count both are (the boundary is inclusive)."""
    at_large = Limits(**{setting: _minimum(setting, LARGE_TREE)})
    for mode, sampler in _samplers(at_large):
        assert {to_text(sampler.sample()) for _ in range(20)} == {to_text(LARGE_TREE)}, mode
    at_small = Limits(**{setting: _minimum(setting, SMALL_TREE)})
    for mode, sampler in _samplers(at_small):
        drawn = {to_text(sampler.sample()) for _ in range(60)}
        assert drawn == {to_text(SMALL_TREE), to_text(LARGE_TREE)}, mode


#: Per cost limit, a value no tree of TWO meets: one past the large tree's count for a minimum, one
#: below the small tree's FLOPs for the budget `max_flops` (its boundary: tests/test_max_flops.py).
UNMET = {
    "min_params": lambda: _minimum("min_params", LARGE_TREE) + 1,
    "min_flops": lambda: _minimum("min_flops", LARGE_TREE) + 1,
    "max_flops": lambda: _minimum("min_flops", SMALL_TREE) - 1,
}


@pytest.mark.parametrize("setting", list(UNMET))
def test_a_limit_no_tree_meets_is_refused_by_every_mode(setting):
    """No tree meets it: each mode gives up naming the limit."""
    limits = Limits(max_attempts=2, **{setting: UNMET[setting]()})
    for _, sampler in _samplers(limits):
        with pytest.raises(SamplingError, match=f"{setting}={getattr(limits, setting)}"):
            sampler.sample()
    exact = make_sampler(parse_grammar(TWO), X, limits, "exact", random_seed=0)
    with pytest.raises(SamplingError, match=rf"all 200 drafts .*\(200 by {setting}\)"):
        exact.sample()
    paper = make_sampler(parse_grammar(TWO), X, limits, "paper", random_seed=0)
    with pytest.raises(SamplingError, match=f"trees rejected by {setting}"):
        paper.sample()


@pytest.mark.parametrize("setting", ["min_params", "min_flops"])
def test_limit_violation_at_the_boundary(setting):
    grammar = parse_grammar(TWO)
    checked = check_tree(LARGE_TREE, grammar, X)
    count = _minimum(setting, LARGE_TREE)
    assert limit_violation(checked, Limits(**{setting: count})) is None
    message = limit_violation(checked, Limits(**{setting: count + 1}))
    assert message is not None and f"< {setting} {count + 1}" in message


@pytest.mark.parametrize("setting", ["min_params", "min_flops"])
def test_mutation_keeps_the_minimums_at_the_boundary(setting):
    """The large tree's only mutation is the small one: allowed at min = the small tree's count,
    refused one above it; from the small tree, min = the large tree's count is met exactly."""
    grammar = parse_grammar(TWO)
    small = _minimum(setting, SMALL_TREE)
    variation = Variation(grammar, X, Limits(**{setting: small}), rng=random.Random(0))
    assert variation.mutate(LARGE_TREE) == SMALL_TREE
    variation = Variation(grammar, X, Limits(**{setting: small + 1}), rng=random.Random(0))
    with pytest.raises(VariationError, match=f"no valid mutation .*{setting}={small + 1}"):
        variation.mutate(LARGE_TREE)
    at_large = Limits(**{setting: _minimum(setting, LARGE_TREE)})
    variation = Variation(grammar, X, at_large, rng=random.Random(0))
    assert variation.mutate(SMALL_TREE) == LARGE_TREE


def test_mutation_and_crossover_of_the_bundled_grammar_keep_the_cost_limits():
    grammar, x = load_grammar("einspace"), input_state((3, 16, 16))
    costs = {"min_params": 2_000, "min_flops": 200_000, "max_flops": 3_000_000, "max_operations": 40}
    limits = Limits(max_depth=14, max_nodes=120, **costs)
    rng = random.Random(5)
    sampler = make_sampler(grammar, x, limits, "paper", rng=rng)
    variation = Variation(grammar, x, limits, rng=rng)
    tree, other, children = sampler.sample(), sampler.sample(), 0
    for _ in range(25):
        for make in (lambda t: variation.mutate(t), lambda t: variation.crossover(t, other)):
            try:
                child = make(tree)
            except VariationError:
                continue
            checked = check_tree(child, grammar, x)
            assert checked.params >= limits.min_params and limits.min_flops <= checked.flops <= 3_000_000
            assert checked.operations <= 40
            tree, children = child, children + 1
    assert children >= 20


# ----------------------------------------------------------------------------- bad values

BAD_LIMITS = [
    ({"min_params": -1}, "min_params must be non-negative, got -1"),
    ({"min_flops": -5}, "min_flops must be non-negative, got -5"),
    ({"min_params": 500, "max_params": 100}, "min_params 500 exceeds max_params 100"),
    ({"max_flops": -1}, "max_flops must be non-negative, got -1"),
    ({"min_flops": 500, "max_flops": 100}, "min_flops 500 exceeds max_flops 100"),
    ({"max_operations": 0}, "limit max_operations must be at least 1, got 0"),
]


@pytest.mark.parametrize("values, message", BAD_LIMITS, ids=[m for _, m in BAD_LIMITS])
def test_bad_cost_limits_are_refused_naming_the_setting(values, message, tmp_path, capsys):
    with pytest.raises(EinspaceError, match=message):
        Limits(**values)
    with pytest.raises(ConfigError, match=f"^exp.yaml: .*{message}"):
        parse_experiment(merge(BASE, {"limits": values}), "exp.yaml")
    (tmp_path / "bad.yaml").write_text(yaml.safe_dump(merge(BASE, {"limits": values})))
    assert main(["search", str(tmp_path / "bad.yaml")]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    flags = [f"--{key.replace('_', '-')}={value}" for key, value in values.items()]
    assert main(["sample", "einspace", "--input", "3,8,8", *flags]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err and "Traceback" not in err


def test_cost_limits_of_the_wrong_type_name_the_key():
    for key in ("min_params", "min_flops"):
        with pytest.raises(ConfigError, match=f"limits.{key} must be an integer, got str"):
            parse_experiment(merge(BASE, {"limits": {key: "many"}}), "exp.yaml")
    with pytest.raises(ConfigError, match="limits.max_operations must be an integer or null, got float"):
        parse_experiment(merge(BASE, {"limits": {"max_operations": 2.5}}), "exp.yaml")


# ----------------------------------------------------------------------------- experiment and CLI


def test_experiment_limits_carry_the_cost_limits_to_the_search_space(tmp_path):
    limits = {"min_params": 1_000, "min_flops": 50_000, "max_flops": 1_000_000, "max_operations": 30}
    e = parse_experiment(merge(BASE, {"run_dir": str(tmp_path), "limits": limits}), "exp.yaml")
    assert (e.limits.min_params, e.limits.min_flops, e.limits.max_flops) == (1_000, 50_000, 1_000_000)
    assert e.limits.max_operations == 30 and e.to_dict()["limits"]["max_operations"] == 30
    assert e.to_dict()["limits"]["min_params"] == 1_000
    space = e.space()
    assert space.limits.min_params == 1_000
    sampler = space.sampler(random.Random(0))
    for _ in range(5):
        checked = check_tree(sampler.sample(), space.grammar, e.input.state())
        assert checked.params >= 1_000 and 50_000 <= checked.flops <= 1_000_000
        assert checked.operations <= 30


@pytest.mark.parametrize("sampling", ["paper", "exact"])
def test_cli_sample_keeps_the_cost_limits(sampling, capsys, tmp_path):
    argv = ["sample", "einspace", "--input", "3,8,8", "-n", "6", "--random-seed", "1", "--sampling", sampling]
    argv += ["--max-depth", "12", "--max-nodes", "100", "--min-params", "500", "--min-flops", "20000"]
    argv += ["--max-flops", "400000", "--max-operations", "25"]
    argv += ["--out", str(tmp_path)]
    assert main(argv) == 0
    capsys.readouterr()
    files = sorted(tmp_path.glob("*.tree"))
    assert len(files) == 6
    for path in files:
        checked = check_tree(parse_tree(path.read_text()), load_grammar("einspace"), X)
        assert checked.params >= 500 and 20_000 <= checked.flops <= 400_000
        assert checked.operations <= 25


@pytest.mark.parametrize("sampling", ["paper", "exact"])
def test_a_search_proposes_no_candidate_outside_the_cost_limits(sampling, tmp_path):
    """Regularised evolution (sampled, mutated and crossed-over candidates) under the minimums
    and `max_operations`: every tree the run evaluated meets them."""
    from search_helpers import experiment

    from einspace.search.loop import open_store, run_search

    e = experiment(
        tmp_path,
        sampling=sampling,
        limits={"min_params": 2_000, "min_flops": 100_000, "max_operations": 30},
        strategy={
            "name": "regularised_evolution",
            "settings": {"evaluations": 24, "population": 6, "tournament": 3, "crossover": 0.3},
        },
    )
    store = open_store(e)
    try:
        assert run_search(e, e.make_executor(), store).finished
        history = store.history()
    finally:
        store.close()
    grammar, x = load_grammar("einspace"), e.input.state()
    assert len(history) == 24 and {r.origin for r in history} >= {"sampled", "mutation"}
    for record in history:
        checked = check_tree(parse_tree(record.tree), grammar, x)
        assert checked.params >= 2_000 and checked.flops >= 100_000, record.origin
        assert checked.operations <= 30, record.origin

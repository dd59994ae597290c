"""The exact sampling mode draws the PCFG conditioned on validity: checked against exhaustive
enumeration on small grammars and against blind rejection sampling on the bundled ones, with
fixed seeds; the same checks reject the paper mode, so they can fail."""

from __future__ import annotations

import math
import random
from collections import Counter

import pytest

from einspace import check_tree, load_grammar
from einspace.cli import main
from einspace.errors import EinspaceError, Infeasible, SamplingError
from einspace.grammar import parse_grammar
from einspace.grammar.model import Grammar, OpItem, ParallelItem, SymbolItem
from einspace.ops.registry import get_op, list_ops
from einspace.sampling import Limits, Sampler, make_sampler, sample_tree
from einspace.sampling.exact import ExactSampler
from einspace.sampling.inside import abstract_of, inside_tables
from einspace.sampling.rejection import RejectionSampler
from einspace.sampling.variation import limit_violation
from einspace.state import FeatureState, input_state
from einspace.testing.distribution import FEATURES, compare_samples, features
from einspace.tree import Nonterminal, Parallel, Repeat, Terminal, to_text, tree_depth

#: One significance level for every test here; with fixed seeds each outcome is deterministic.
ALPHA = 0.001

#: Two M branches that must agree for `add`, and a recursive M: the paper mode's local repairs
#: distort this (it keeps the first branch as drawn and forces the second to match).
SMALL = """
start S
S -> M | B Branches A
M -> M M @ 0.2 | C @ 0.8
B -> clone(b = 2) | group_dim(dim = 1, b = 2)
Branches -> (M, M)
A -> add | concat(dim = 1, b = 2)
C -> linear(d = 2 | 4) | identity | norm
"""


# ----------------------------------------------------------------------------- exhaustive reference


def enumerate_valid(grammar: Grammar, input: FeatureState, max_depth: int) -> dict[str, float]:
    """Every valid tree of height <= max_depth with its PCFG probability, by brute force over
    concrete signals (nothing shared with the inside tables): tree text -> probability."""

    def symbol(name, signal, depth):
        rule = grammar.rule_for(name, signal) if depth >= 1 else None
        for alt in rule.alternatives if rule else ():
            for kids, out, p in sequence(alt.items, signal, depth - 1):
                yield Nonterminal(name, kids), out, alt.probability * p

    def sequence(items, signal, depth):
        if not items:
            yield (), signal, 1.0
            return
        for kid, middle, p in item(items[0], signal, depth):
            for rest, out, q in sequence(items[1:], middle, depth):
                yield (kid, *rest), out, p * q

    def item(it, signal, depth):
        if isinstance(it, SymbolItem):
            yield from symbol(it.name, signal, depth)
        elif isinstance(it, OpItem):
            for args in it.choices:
                try:
                    out = get_op(it.name).transfer(signal, dict(args))
                except Infeasible:
                    continue
                yield Terminal(it.name, args), out, 1 / len(it.choices)
        elif isinstance(it, ParallelItem):
            if len(signal) == len(it.items):
                for kids, outs, p in branches(it.items, signal, depth):
                    yield Parallel(kids), outs, p
        else:
            times = len(signal) if it.times is None else it.times
            if len(signal) == times and all(s == signal[0] for s in signal):
                for kid, out, p in item(it.item, signal[:1], depth):
                    if len(out) == 1:
                        yield Repeat(kid, times), out * times, p

    def branches(items, signal, depth):
        if not items:
            yield (), (), 1.0
            return
        for kid, out, p in item(items[0], signal[:1], depth):
            if len(out) == 1:
                for rest, outs, q in branches(items[1:], signal[1:], depth):
                    yield (kid, *rest), out + outs, p * q

    trees = {to_text(t): p for t, out, p in symbol(grammar.start, (input,), max_depth) if len(out) == 1}
    total = sum(trees.values())
    return {text: p / total for text, p in trees.items()}


def chi_square_rejects(counts: Counter, expected: dict[str, float], n: int) -> tuple[bool, float, float]:
    """Goodness of fit of `counts` (n draws) to `expected` probabilities: (rejected at ALPHA,
    statistic, critical value). Categories expected fewer than 5 times are pooled into one."""
    small = [k for k, p in expected.items() if p * n < 5]
    cells = [(counts[k], p * n) for k, p in expected.items() if p * n >= 5]
    cells.append(
        (
            sum(counts[k] for k in small) + sum(v for k, v in counts.items() if k not in expected),
            sum(expected[k] for k in small) * n,
        )
    )
    statistic = sum((o - e) ** 2 / e for o, e in cells if e > 0)
    df = len([c for c in cells if c[1] > 0]) - 1
    z = 3.0902  # the standard normal's 1 - ALPHA quantile; Wilson-Hilferty for the chi-square one
    critical = df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3
    return statistic > critical, statistic, critical


@pytest.fixture(scope="module")
def small():
    return parse_grammar(SMALL)


def test_enumeration_reference_is_a_distribution_over_valid_trees(small):
    x = input_state((2, 4, 4))
    reference = enumerate_valid(small, x, 4)
    assert 30 < len(reference) < 5000 and math.isclose(sum(reference.values()), 1.0)
    for text in list(reference)[:50]:
        from einspace.tree import parse_tree

        check_tree(parse_tree(text), small, x)  # every enumerated tree is valid


@pytest.mark.parametrize("max_depth", [3, 4])
def test_exact_mode_matches_exhaustive_enumeration(small, max_depth):
    x = input_state((2, 4, 4))
    reference = enumerate_valid(small, x, max_depth)
    n = 3000
    sampler = ExactSampler(small, x, Limits(max_depth=max_depth), random_seed=1)
    counts = Counter(to_text(sampler.sample()) for _ in range(n))
    rejected, statistic, critical = chi_square_rejects(counts, reference, n)
    assert not rejected, f"chi-square {statistic:.1f} > {critical:.1f}"


def test_the_enumeration_test_rejects_the_paper_mode(small):
    """The same goodness-of-fit test, on the paper mode: it keeps the first branch as drawn and
    repairs the second, so matched branches of rare shapes are over-represented."""
    x = input_state((2, 4, 4))
    reference = enumerate_valid(small, x, 4)
    n = 3000
    sampler = Sampler(small, x, Limits(max_depth=4), random_seed=1)
    counts = Counter(to_text(sampler.sample()) for _ in range(n))
    rejected, statistic, critical = chi_square_rejects(counts, reference, n)
    assert rejected, (
        f"chi-square {statistic:.1f} <= {critical:.1f}: the test did not see the paper mode's bias"
    )


def _costs(grammar: Grammar, x: FeatureState, texts) -> dict[str, tuple[int, int]]:
    from einspace.tree import parse_tree

    return {t: (lambda c: (c.params, c.flops))(check_tree(parse_tree(t), grammar, x)) for t in texts}


def _conditioned(reference: dict[str, float], keep) -> dict[str, float]:
    kept = {t: p for t, p in reference.items() if keep(t)}
    total = sum(kept.values())
    return {t: p / total for t, p in kept.items()}


@pytest.mark.parametrize("setting", ["min_params", "min_flops"])
def test_exact_mode_under_a_minimum_is_the_enumeration_conditioned_on_it(small, setting):
    """`min_params` / `min_flops` condition exactly: the exact mode's frequencies under a minimum
    match the unrestricted distribution (exhaustive enumeration) restricted to the trees that
    meet it and renormalised; the same counts against the unrestricted one are rejected, so the
    test can fail."""
    x = input_state((2, 4, 4))
    reference = enumerate_valid(small, x, 4)
    costs = _costs(small, x, reference)
    index = 0 if setting == "min_params" else 1
    values = sorted({c[index] for c in costs.values()})
    minimum = values[len(values) // 2]  # a median cost: about half the trees fall below
    conditioned = _conditioned(reference, lambda t: costs[t][index] >= minimum)
    assert 0.05 < sum(reference[t] for t in conditioned) < 0.95 and len(conditioned) > 10
    n = 3000
    sampler = ExactSampler(small, x, Limits(max_depth=4, **{setting: minimum}), random_seed=1)
    counts = Counter(to_text(sampler.sample()) for _ in range(n))
    assert set(counts) <= set(conditioned)
    assert sampler.stats[setting] > 0  # drafts below the minimum were drawn and rejected whole
    rejected, statistic, critical = chi_square_rejects(counts, conditioned, n)
    assert not rejected, f"chi-square {statistic:.1f} > {critical:.1f}"
    assert chi_square_rejects(counts, reference, n)[0]


# ----------------------------------------------------------------------------- bundled grammars

#: (grammar, input, limits): small enough for blind rejection sampling; together they exercise
#: every limit the exact mode handles by rejection (nodes, parameters, minimum depth, minimum
#: parameters and FLOPs) and col mode.
CONFIGS = [
    ("einspace", (3, 8, 8), Limits(max_depth=10, max_nodes=100)),
    ("einspace", (3, 8, 8), Limits(max_depth=10, max_nodes=40, min_depth=5)),
    ("einspace_1d", (16, 32), Limits(max_depth=10, max_nodes=100)),
    ("einspace_plus", (16, 8, 8), Limits(max_depth=9, max_nodes=100, max_params=20_000)),
    ("einspace", (3, 8, 8), Limits(max_depth=10, max_nodes=100, min_params=300, min_flops=20_000)),
]


def _features(sampler, n: int) -> list:
    return [features(check_tree(sampler.sample(), sampler.grammar, sampler.input)) for _ in range(n)]


@pytest.mark.parametrize(
    "name,shape,limits", CONFIGS, ids=lambda v: str(v) if not isinstance(v, Limits) else ""
)
def test_exact_mode_matches_rejection_sampling(name, shape, limits):
    grammar, x = load_grammar(name), input_state(shape)
    exact = _features(ExactSampler(grammar, x, limits, random_seed=7), 800)
    blind = _features(RejectionSampler(grammar, x, limits, random_seed=8), 800)
    p = compare_samples(exact, blind, permutations=400)
    assert min(p.values()) > ALPHA * 10 / len(FEATURES), p  # Bonferroni over the features at 1%


def test_the_rejection_comparison_rejects_the_paper_mode():
    name, shape, limits = CONFIGS[0]
    grammar, x = load_grammar(name), input_state(shape)
    paper = _features(Sampler(grammar, x, limits, random_seed=7), 800)
    blind = _features(RejectionSampler(grammar, x, limits, random_seed=8), 800)
    p = compare_samples(paper, blind, permutations=1000)
    assert min(p.values()) < ALPHA * 10 / len(FEATURES), p


@pytest.mark.parametrize(
    "name,shape,limits", CONFIGS, ids=lambda v: str(v) if not isinstance(v, Limits) else ""
)
def test_exact_trees_check_and_keep_every_limit(name, shape, limits):
    grammar, x = load_grammar(name), input_state(shape)
    sampler = ExactSampler(grammar, x, limits, random_seed=3)
    for _ in range(200):
        checked = check_tree(sampler.sample(), grammar, x)
        assert limit_violation(checked, limits) is None
        assert tree_depth(checked.tree) >= limits.min_depth
    assert sampler.stats["accepted"] == 200 and sampler.stats["drafts"] >= 200


def test_no_draft_is_rejected_where_shapes_cannot_conflict():
    """Guards, branch counts and depth are handled exactly: with operations that keep shapes,
    every draft is a tree (no restarts, no dead ends)."""
    grammar = parse_grammar(
        "start S\nS -> M\nM -> M M | B Branches A | C @ 0.5\nB -> clone(b = 2 | 4 | 8)\n"
        "Branches if b == 2 -> (M, M)\nBranches if b in (4, 8) -> (M) * b\n"
        "A if b == 2 -> add\nA if b == 8 -> add\nC -> identity | leaky_relu | norm"
    )
    sampler = ExactSampler(grammar, input_state((3, 8, 8)), Limits(max_depth=12), random_seed=0)
    trees = [sampler.sample() for _ in range(300)]
    assert sampler.stats["drafts"] == sampler.stats["accepted"] == 300
    assert not any("clone(b=4)" in to_text(t) for t in trees)  # A has no rule for b = 4
    assert max(tree_depth(t) for t in trees) <= 12


def test_plans_carry_the_inside_probabilities(small):
    """Each symbol plan's total weight is the inside probability of its (modes, height, target)."""
    x = input_state((2, 4, 4))
    sampler = ExactSampler(small, x, Limits(max_depth=5), random_seed=0)
    for _ in range(50):
        sampler.sample()
    tables = inside_tables(small, abstract_of((x,)), 5)
    plans = sampler._plan.__self__.plans  # the sampler's shared plan book
    assert len(plans) >= 10
    for (name, modes, height, target), plan in plans.items():
        assert math.isclose(plan.cumulative[-1], tables.symbol(name, modes, height)[target], rel_tol=1e-12)


def test_inside_probabilities_grow_with_height_to_the_unbounded_value():
    grammar = parse_grammar("start S\nS -> M\nM -> M M @ 0.4 | identity @ 0.6")
    tables = inside_tables(grammar, ("im",), 60)
    z = [tables.symbol("M", ("im",), h).get(("im",), 0.0) for h in range(1, 61)]
    assert z[0] == pytest.approx(0.6) and all(a <= b for a, b in zip(z, z[1:], strict=False))
    assert z[-1] == pytest.approx(1.0, abs=1e-6)  # subcritical: z = 0.4 z^2 + 0.6 has root 1


def test_same_seed_same_trees_and_streams_continue():
    grammar, x = load_grammar("einspace"), input_state((3, 16, 16))
    first = [to_text(sample_tree(grammar, x, s, sampling="exact")) for s in range(10)]
    assert first == [to_text(sample_tree(grammar, x, s, sampling="exact")) for s in range(10)]
    assert len(set(first)) > 5
    a, b = ExactSampler(grammar, x, random_seed=4), ExactSampler(grammar, x, rng=random.Random(4))
    assert [to_text(a.sample()) for _ in range(5)] == [to_text(b.sample()) for _ in range(5)]


# ----------------------------------------------------------------------------- contracts and errors


def _signals() -> list[tuple]:
    im = [FeatureState((c, h, w), "im") for c in (1, 3, 16, 32) for h, w in ((8, 8), (6, 4), (1, 1))]
    col = [FeatureState((s, d), "col") for s, d in ((16, 8), (9, 27), (64, 64))]
    folded = [FeatureState((16, 8), "col", ((4, 4),))]
    singles = [(s,) for s in im + col + folded]
    return singles + [(s, s) for s in im[:4] + col] + [(s,) * 4 for s in im[:3]] + [(im[0], col[0])]


def _grids() -> dict[str, set]:
    grids: dict[str, set] = {}
    for name in ("einspace", "einspace_1d", "einspace_plus"):
        for rule in load_grammar(name).rules:
            for alt in rule.alternatives:
                for item in alt.items:
                    for op in item.items if isinstance(item, ParallelItem) else (item,):
                        if isinstance(op, OpItem):
                            grids.setdefault(op.name, set()).update(op.choices)
    return grids


@pytest.mark.parametrize("name", sorted(_grids()))
def test_abstract_contract_holds_where_the_exact_mode_relies_on_it(name):
    """The tables trust `abstract(mode, b, args)`: wherever an operation applies, it must predict
    the output's mode and branch count, and no operation takes branches of different modes."""
    op = get_op(name)
    assert name in list_ops()
    for args in _grids()[name]:
        for signal in _signals():
            try:
                out = op.transfer(signal, dict(args))
            except Infeasible:
                continue
            modes = {s.mode for s in signal}
            assert len(modes) == 1, f"{name}{args} took mixed modes {signal}"
            assert op.abstract(signal[0].mode, len(signal), dict(args)) == (out[0].mode, len(out))
            assert {s.mode for s in out} == {out[0].mode}


def test_a_grammar_that_derives_nothing_says_so():
    grammar = parse_grammar("start S\nS if mode == col -> identity")
    with pytest.raises(SamplingError, match="derives no tree"):
        ExactSampler(grammar, input_state((3, 8, 8))).sample()


def test_impossible_limits_give_up_with_the_reasons():
    grammar = parse_grammar("start S\nS -> linear(d = 16 | 32)")
    sampler = ExactSampler(
        grammar, input_state((3, 8, 8)), Limits(max_params=10, max_attempts=1), random_seed=0
    )
    with pytest.raises(SamplingError, match=r"all 100 drafts .* \(100 by params\)"):
        sampler.sample()


def test_unknown_sampling_mode_is_an_error_naming_the_modes():
    with pytest.raises(EinspaceError, match="unknown sampling mode 'fast' .*paper, exact"):
        make_sampler(load_grammar("einspace"), input_state((3, 8, 8)), sampling="fast")


def test_cli_samples_in_exact_mode(capsys):
    argv = [
        "sample",
        "einspace",
        "--input",
        "3,16,16",
        "-n",
        "3",
        "--random-seed",
        "2",
        "--sampling",
        "exact",
    ]
    assert main(argv) == 0
    first = capsys.readouterr().out
    assert main(argv) == 0
    assert capsys.readouterr().out == first and first.count("# tree") == 3
    grammar, x = load_grammar("einspace"), input_state((3, 16, 16))
    sampler = ExactSampler(grammar, x, random_seed=2)
    assert to_text(sampler.sample()) in first


def test_experiment_files_select_the_mode(tmp_path):
    from einspace.search.config import ConfigError, parse_experiment

    raw = {"input": {"shape": [3, 8, 8]}, "evaluator": {"name": "training"}, "run_dir": str(tmp_path)}
    space = parse_experiment({**raw, "sampling": "exact"}).space()
    assert space.sampling == "exact" and isinstance(space.sampler(random.Random(0)), ExactSampler)
    assert isinstance(parse_experiment(raw).space().sampler(random.Random(0)), Sampler)
    with pytest.raises(ConfigError, match="sampling must be 'paper' or 'exact', got 'fast'"):
        parse_experiment({**raw, "sampling": "fast"})


def test_skip_and_convolution_features_are_recognised():
    from einspace.tree import parse_tree

    grammar, x = load_grammar("einspace"), input_state((3, 8, 8))
    residual = parse_tree(
        "(S (M (B clone(b=2)) (Branches [(M (C norm)) (M (C identity))]) (A add)) (M (C norm)))"
    )
    conv = parse_tree("(S (R1 im2col(k=3, s=1, p=1)) (M (C linear(d=16))) (R2 col2im))")
    f_res, f_conv = features(check_tree(residual, grammar, x)), features(check_tree(conv, grammar, x))
    assert f_res.skip and not f_res.convolution and f_res.root == "M M" and f_res.branching == Counter({2: 1})
    assert f_conv.convolution and not f_conv.skip and f_conv.nodes == 8  # S R1 im2col M C linear R2 col2im

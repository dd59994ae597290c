"""Rule probabilities learned from trees: the grammar writer's round trip, the counts and the estimate
against hand counts, consistency kept by shrinking, `einspace learn-probabilities` on a real run, and
the online estimation-of-distribution strategy."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from search_helpers import experiment

from einspace import load_grammar
from einspace.cli import main
from einspace.errors import EinspaceError
from einspace.grammar import parse_grammar
from einspace.grammar.analysis import analyse
from einspace.grammar.learning import learn_probabilities, rule_counts, with_probabilities
from einspace.grammar.writer import format_grammar
from einspace.sampling import Limits
from einspace.search.strategy import SearchSpace, get_strategy
from einspace.state import input_state
from einspace.tree import parse_tree

X = input_state((3, 16, 16))


@pytest.mark.parametrize("name", ["einspace", "einspace_1d", "einspace_plus"])
def test_written_grammars_parse_back_equal(name):
    grammar = load_grammar(name)
    text = format_grammar(grammar, "first line\nsecond line")
    assert text.startswith("# first line\n# second line\n\nstart S\n")
    again = parse_grammar(text, "<written>")
    assert again.start == grammar.start and again.rules == grammar.rules  # probabilities included


def test_linked_and_product_grids_are_written_as_such():
    grammar = parse_grammar(
        "start S\nS -> group_dim(dim = 1 | 2, b = 2 | 4) im2col((k, s, p) = (3, 1, 1) | (1, 2, 0))"
    )
    text = format_grammar(grammar)
    assert "group_dim(dim = 1 | 2, b = 2 | 4)" in text and "im2col((k, s, p) = (3, 1, 1) | (1, 2, 0))" in text
    assert parse_grammar(text).rules == grammar.rules


#: S -> M M; M -> C (three times), M -> M M (once); C -> identity, norm, leaky_relu.
TREE = "(S (M (C identity)) (M (M (C norm)) (M (C leaky_relu))))"


def test_rule_counts_are_the_choices_the_trees_made():
    grammar = load_grammar("einspace")
    counts = rule_counts(grammar, X, [parse_tree(TREE)] * 2)
    by_symbol = {rule.symbol: row for rule, row in zip(grammar.rules, counts, strict=True) if not rule.guard}
    assert by_symbol["S"] == [2, 0, 0]  # M M | B Branches A | R1 M R2
    assert by_symbol["M"] == [2, 0, 0, 6]  # M M | B Branches A | R1 M R2 | C
    assert by_symbol["C"] == [2, 0, 2, 2, 0, 0]  # identity | linear | norm | leaky_relu | softmax | pos_enc


def test_guarded_rules_and_repeats_are_counted_per_rule_once():
    grammar = load_grammar("einspace")
    tree = parse_tree("(S (M (B clone(b=4)) (Branches (M (C norm))*4) (A add)) (M (C identity)))")
    counts = rule_counts(grammar, X, [tree])
    rows = {(r.symbol, tuple(map(str, r.guard))): row for r, row in zip(grammar.rules, counts, strict=True)}
    assert rows[("A", ("b in (4, 8)",))] == [1, 0] and rows[("A", ("b == 2",))] == [0, 0, 0]
    assert rows[("Branches", ("b in (4, 8)",))] == [1]
    assert rows[("C", ())] == [1, 0, 1, 0, 0, 0]  # the repeated (C norm) is one derivation


def test_estimate_is_counts_plus_prior():
    grammar = load_grammar("einspace")
    learned = learn_probabilities(grammar, X, [parse_tree(TREE)] * 2, prior_strength=4.0)
    m = next(i for i, r in enumerate(grammar.rules) if r.symbol == "M")
    old = [a.probability for a in grammar.rules[m].alternatives]
    new = [a.probability for a in learned.grammar.rules[m].alternatives]
    assert learned.shrink == 0.0
    assert new == pytest.approx([(n + 4 * p) / (8 + 4) for n, p in zip([2, 0, 0, 6], old, strict=True)])
    unused = next(i for i, r in enumerate(grammar.rules) if r.symbol == "R2")
    assert learned.grammar.rules[unused] == grammar.rules[unused]


def test_an_estimate_past_the_bound_is_shrunk_toward_the_original():
    grammar = load_grammar("einspace").with_probability("M", 3, 0.6)  # rho well below 0.9
    leaves = "(M (C identity))"
    for _ in range(5):  # a full binary tree of M -> M M: its M nodes have 2 - 2/32 children on average
        leaves = f"(M {leaves} {leaves})"
    tree = parse_tree(f"(S {leaves} (M (C norm)))")
    raw = learn_probabilities(grammar, X, [tree], prior_strength=1.0, max_rho=0.99, modes=("im",))
    learned = learn_probabilities(grammar, X, [tree], prior_strength=1.0, max_rho=0.9, modes=("im",))
    assert analyse(grammar, "im").spectral_radius < 0.9
    assert raw.shrink == 0.0 and raw.spectral_radius["im"] > 0.9  # what the counts alone say
    assert 0 < learned.shrink < 1 and learned.spectral_radius["im"] <= 0.9
    assert analyse(learned.grammar, "im").spectral_radius == pytest.approx(learned.spectral_radius["im"])


def test_bad_probability_tables_are_refused():
    grammar = load_grammar("einspace")
    rows = [[a.probability for a in r.alternatives] for r in grammar.rules]
    rows[0] = [0.5, 0.5, 0.0]
    with pytest.raises(EinspaceError, match="positive probabilities summing to 1"):
        with_probabilities(grammar, rows)
    with pytest.raises(EinspaceError, match="prior strength must be positive"):
        learn_probabilities(grammar, X, [], prior_strength=0)


# ----------------------------------------------------------------------------- the command


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory) -> Path:
    """A random search of 24 evaluations with the analytic `test_params` evaluator."""
    from einspace.search.executors import InProcessExecutor
    from einspace.search.loop import open_store, run_search

    run_dir = tmp_path_factory.mktemp("run")
    exp = experiment(run_dir, strategy={"name": "random_search", "settings": {"evaluations": 24}})
    store = open_store(exp, run_dir)
    try:
        run_search(exp, InProcessExecutor(1, exp.plugins), store)
    finally:
        store.close()
    return run_dir


def test_learn_probabilities_writes_a_grammar_check_accepts(finished_run, tmp_path, capsys):
    from einspace.search.loop import SearchRun
    from einspace.search.report import best_records

    out = tmp_path / "learned.pcfg"
    assert main(["learn-probabilities", str(finished_run), "--out", str(out), "--top", "5"]) == 0
    printed = capsys.readouterr().out
    assert f"wrote {out}" in printed and "rule: alternative old -> new" in printed
    text = out.read_text()
    assert text.startswith("# Learned by `einspace learn-probabilities` from the run in")
    assert "its 5 fittest of" in text
    with SearchRun.open(finished_run) as run:
        best = best_records(run.store.history(), 5)
    expected = learn_probabilities(load_grammar("einspace"), X, [parse_tree(r.tree) for r in best])
    assert parse_grammar(text).rules == expected.grammar.rules
    assert main(["check", str(out)]) == 0
    capsys.readouterr()


def test_learn_probabilities_errors_name_the_problem(tmp_path, capsys):
    assert main(["learn-probabilities", str(tmp_path), "--out", str(tmp_path / "x.pcfg")]) == 2
    assert "is not a search run directory" in capsys.readouterr().err


# ----------------------------------------------------------------------------- the strategy


def _linear_share(text: str) -> float:
    """A fitness the grammar's rules can learn: the share of terminals that are `linear`."""
    terminals = (
        text.count("(C ") + text.count("(R1 ") + text.count("(R2 ") + text.count("(B ") + text.count("(A ")
    )
    return text.count("linear(") / max(1, terminals)


def test_estimation_of_distribution_learns_what_is_rewarded():
    space = SearchSpace(load_grammar("einspace"), X, Limits(max_depth=12, max_nodes=80), sampling="exact")
    settings = {"evaluations": 120, "elite": 10, "warmup": 30, "update_every": 15}
    strategy = get_strategy("estimation_of_distribution", space, 0, settings)
    scores: dict[str, list[float]] = {"sampled": [], "learned": []}
    while (candidate := strategy.ask()) is not None:
        fitness = _linear_share(candidate.tree)
        scores[candidate.origin.split(":")[0]].append(fitness)
        strategy.tell(candidate.id, fitness)
    assert strategy.done and strategy.updates == 7 and len(scores["sampled"]) == 30
    c = next(i for i, r in enumerate(space.grammar.rules) if r.symbol == "C")
    assert strategy.grammar.rules[c].alternatives[1].probability > 0.5 > 1 / 6  # C -> linear
    mean = {k: sum(v) / len(v) for k, v in scores.items()}
    assert mean["learned"] > 2 * mean["sampled"], mean


def test_estimation_of_distribution_round_trips_after_learning():
    import json

    space = SearchSpace(load_grammar("einspace"), X, Limits(max_depth=12, max_nodes=80))
    settings = {"evaluations": 30, "elite": 3, "warmup": 4, "update_every": 4}
    a = get_strategy("estimation_of_distribution", space, 1, settings)
    for _ in range(10):
        c = a.ask()
        a.tell(c.id, _linear_share(c.tree))
    assert a.probabilities is not None and a.updates == 2
    b = get_strategy("estimation_of_distribution", space, 99, settings)
    b.load_state_dict(json.loads(json.dumps(a.state_dict())))
    assert [b.ask().tree for _ in range(5)] == [a.ask().tree for _ in range(5)]
    assert math.isclose(sum(b.probabilities[0]), 1.0)


def test_estimation_of_distribution_settings_are_checked():
    space = SearchSpace(load_grammar("einspace"), X)
    with pytest.raises(EinspaceError, match="'max_rho' must be below 1"):
        get_strategy("estimation_of_distribution", space, 0, {"max_rho": 1.5})
    with pytest.raises(EinspaceError, match="'elite' must be an integer >= 1"):
        get_strategy("estimation_of_distribution", space, 0, {"elite": 0})

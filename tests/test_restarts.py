"""Regularised evolution's restarts (`restart_after`): a population whose results stopped beating
its best is emptied and filled again with fresh samples."""

from __future__ import annotations

import json

import pytest
from search_helpers import experiment, run_to_the_end
from test_search_strategies import drive

from einspace import Limits, input_state, load_grammar
from einspace.errors import EinspaceError
from einspace.search.evolution import RegularisedEvolution
from einspace.search.loop import SearchRun
from einspace.search.report import report
from einspace.search.strategy import SearchSpace, get_strategy
from einspace.seeds import load_seed
from einspace.tree import to_text

GRAMMAR = load_grammar("einspace")
INPUT = input_state((3, 16, 16))
LIMITS = Limits(max_depth=12, max_nodes=80)


def make(
    restart_after: float,
    population: int = 4,
    seeds: list | None = None,
    random_seed: int = 0,
    growth: int = 1,
    keep: int = 0,
) -> RegularisedEvolution:
    """RE (tournament 2) restarting after `restart_after` x `population` results without a new best,
    keeping its `keep` best."""
    space = SearchSpace(GRAMMAR, INPUT, LIMITS, seeds or [])
    settings = {
        "evaluations": 60,
        "population": population,
        "tournament": 2,
        "restart_after": restart_after,
        "restart_growth": growth,
        "restart_keep": keep,
    }
    return get_strategy("regularised_evolution", space, random_seed, settings)


def one_at_a_time(strategy: RegularisedEvolution, fitness, count: int) -> list[str]:
    """Ask and tell `count` candidates one at a time (fitness(id) as the result); their origins."""
    origins = []
    for _ in range(count):
        c = strategy.ask()
        origins.append(c.origin)
        strategy.tell(c.id, fitness(c.id))
    return origins


def test_a_population_that_stops_improving_is_filled_again_with_fresh_samples():
    s = make(restart_after=0.75)
    # the first result sets the best; three that do not beat it restart the population of 4
    assert one_at_a_time(s, lambda i: 0.0, 4) == ["sampled"] * 4
    assert s.restart.count == 1 and s.population == [] and s.live_parents() == set()
    assert one_at_a_time(s, lambda i: 0.0, 4) == ["sampled"] * 4
    assert s.restart.count == 2


def test_without_restarts_the_same_population_goes_on_to_children():
    s = make(restart_after=0)
    origins = one_at_a_time(s, lambda i: 0.0, 12)
    assert origins[:4] == ["sampled"] * 4
    assert set(origins[4:]) == {"mutation"} and s.restart.count == 0


def test_a_population_that_keeps_improving_is_never_restarted():
    s = make(restart_after=0.5)
    origins = one_at_a_time(s, lambda i: float(i), 30)
    assert set(origins[4:]) == {"mutation"} and s.restart.count == 0


def test_results_that_tie_the_best_count_towards_a_restart():
    s = make(restart_after=1.25)
    one_at_a_time(s, lambda i: 1.0 if i == 0 else 0.5, 5)
    assert s.restart.count == 0  # four results below the first
    one_at_a_time(s, lambda i: 1.0, 1)
    assert s.restart.count == 1  # a fifth that only ties it


def test_the_count_restarts_after_an_improvement():
    s = make(restart_after=0.75)
    scores = {0: 1.0, 1: 0.0, 2: 0.0, 3: 2.0, 4: 0.0, 5: 0.0}
    one_at_a_time(s, scores.get, 6)
    assert s.restart.count == 0  # two below 1.0, then 2.0, then two below it
    one_at_a_time(s, lambda i: 0.0, 1)
    assert s.restart.count == 1


def test_no_restart_while_the_population_is_still_being_filled():
    s = make(restart_after=0.25)
    one_at_a_time(s, lambda i: 0.0, 3)  # two results below the best, but one sample still to come
    assert s.restart.count == 0 and len(s.population) == 3
    one_at_a_time(s, lambda i: 0.0, 1)
    assert s.restart.count == 1


def test_failures_never_beat_the_best():
    s = make(restart_after=0.75)
    one_at_a_time(s, lambda i: 0.0 if i == 0 else float("-inf"), 4)
    assert s.restart.count == 1


def test_seeds_start_only_the_first_population():
    seeds = [("resnet18", to_text(load_seed("resnet18", GRAMMAR, INPUT)))]
    s = make(restart_after=2 / 3, population=3, seeds=seeds)
    first = one_at_a_time(s, lambda i: 0.0, 3)
    assert first == ["seed:resnet18"] * 3 and s.restart.count == 1
    assert one_at_a_time(s, lambda i: 0.0, 3) == ["sampled"] * 3


def test_children_in_flight_join_the_restarted_population():
    s = make(restart_after=1, population=2)
    a, b = s.ask(), s.ask()
    s.tell(a.id, 1.0)
    s.tell(b.id, 0.0)
    child_1, child_2 = s.ask(), s.ask()
    assert child_1.origin == child_2.origin == "mutation"
    s.tell(child_1.id, 0.0)  # the second result in a row below 1.0: restart
    assert s.restart.count == 1 and s.population == []
    s.tell(child_2.id, 0.5)
    assert [m for m, _, _ in s.population] == [child_2.id]
    assert s.ask().origin == "sampled"  # the restarted population still needs a fresh sample


@pytest.mark.parametrize("in_flight", [1, 3])
@pytest.mark.parametrize("growth, keep", [(1, 0), (2, 0), (2, 2)])
def test_state_round_trip_across_restarts(in_flight, growth, keep):
    a = make(restart_after=0.75, growth=growth, keep=keep)
    drive(a, in_flight, stop_after=14)
    assert a.restart.count >= 1
    state = json.loads(json.dumps(a.state_dict(), allow_nan=False))
    b = make(restart_after=0.75, random_seed=999, growth=growth, keep=keep)  # all from the state
    b.load_state_dict(state)
    assert b.state_dict() == a.state_dict()
    assert drive(b, in_flight) == drive(a, in_flight)


def test_a_checkpoint_from_before_restarts_resumes_as_the_first_population():
    a = make(restart_after=0)
    one_at_a_time(a, lambda i: 0.0, 2)  # two of the four initial samples told
    state = a.state_dict()
    del state["restart"]
    b = make(restart_after=0)
    b.load_state_dict(state)
    assert one_at_a_time(b, lambda i: 0.0, 10) == one_at_a_time(a, lambda i: 0.0, 10)


def test_each_restart_grows_the_population_and_tournament():
    s = make(restart_after=0.5, growth=2)  # two results below the best, counted from a population of 4
    assert one_at_a_time(s, lambda i: 0.0, 4) == ["sampled"] * 4
    assert (s.restart.count, s.population_size, s.tournament_size) == (1, 8, 4)
    # eight fresh samples now; the count restarts, and four results below the best restart it
    assert one_at_a_time(s, lambda i: 0.0, 8) == ["sampled"] * 8
    assert (s.restart.count, s.population_size, s.tournament_size) == (2, 16, 8)


def test_a_grown_population_ages_out_at_its_new_size():
    s = make(restart_after=0.5, growth=2)
    one_at_a_time(s, lambda i: 0.0, 4)
    one_at_a_time(s, lambda i: float(i), 12)  # eight fresh samples, then four children, all improving
    assert s.restart.count == 1 and len(s.population) == 8
    assert [m for m, _, _ in s.population] == list(range(8, 16))


def ids(members: list) -> list[int]:
    return [m for m, _, _ in members]


#: Member 0 is the best; 1-3 do not beat it (a population of 4 restarts after them, at 0.75 x 4);
#: the fresh samples after the restart, 4 on, improve one after another.
STALLS_THEN_IMPROVES = {0: 0.9, 1: 0.0, 2: 0.0, 3: 0.0}.get


def test_a_restart_keeps_the_best_which_rejoins_as_the_youngest_once_the_fresh_samples_are_in():
    s = make(restart_after=0.75, keep=1)
    one_at_a_time(s, lambda i: STALLS_THEN_IMPROVES(i, i / 100), 4)
    assert s.restart.count == 1 and s.population == [] and ids(s._kept) == [0]
    assert s.live_parents() == {0}  # its weights stay for the children it may have
    assert one_at_a_time(s, lambda i: i / 100, 4) == ["sampled"] * 4
    child = s.ask()
    assert child.origin == "mutation" and ids(s.population) == [4, 5, 6, 7, 0] and s._kept == []
    s.tell(child.id, 0.5)
    assert ids(s.population) == [6, 7, 0, child.id]  # back to 4 members, the oldest gone


def test_without_restart_keep_a_restart_keeps_no_one():
    s = make(restart_after=0.75)
    one_at_a_time(s, lambda i: STALLS_THEN_IMPROVES(i, i / 100), 8)
    assert s.restart.count == 1 and s.live_parents() == set(range(4, 8))
    s.ask()
    assert ids(s.population) == [4, 5, 6, 7]


def test_a_restart_keeps_the_highest_rung_first_and_hears_its_promotions_while_it_waits():
    s = make(restart_after=0.75, keep=2)
    c = [s.ask() for _ in range(4)]
    for candidate, fitness in zip(c, (0.9, 0.1, 0.0, 0.2), strict=True):
        s.tell(candidate.id, fitness)
        if candidate.id == 1:
            s.hear_promotion(1, 3, 0.3)  # a result at rung 3 outranks any at rung 0
    assert s.restart.count == 1 and ids(s._kept) == [1, 0]
    s.hear_promotion(0, 8, 0.95)
    assert s._kept[1][2] == 0.95 and s.rung_of == {1: 3, 0: 8}


def test_a_second_restart_before_the_kept_rejoined_ranks_them_with_the_new_population():
    s = make(restart_after=0.25, keep=1)  # a result below the best restarts a population of 4
    one_at_a_time(s, lambda i: 0.9 if i == 0 else 0.0, 4)
    assert s.restart.count == 1 and ids(s._kept) == [0]
    one_at_a_time(s, lambda i: 0.5, 4)  # four fresh samples, ties: a restart before any child
    assert s.restart.count == 2 and ids(s._kept) == [0] and s.live_parents() == {0}


def test_a_checkpoint_while_the_kept_wait_resumes_with_them():
    a = make(restart_after=0.75, keep=2)
    one_at_a_time(a, lambda i: STALLS_THEN_IMPROVES(i, i / 100), 6)
    assert ids(a._kept) == [0, 1] and len(a.population) == 2
    state = json.loads(json.dumps(a.state_dict(), allow_nan=False))
    b = make(restart_after=0.75, keep=2)
    b.load_state_dict(state)
    assert b._kept == a._kept and b.live_parents() == a.live_parents()
    assert one_at_a_time(b, lambda i: i / 100, 6) == one_at_a_time(a, lambda i: i / 100, 6)
    assert b.population == a.population


def test_the_report_says_how_many_a_restart_keeps():
    from einspace.search.report import _restart_rows

    state = {"after": 2.0, "restarts": 1, "population": 8, "tournament": 4}
    for keep, said in ((0, "without a new best);"), (2, "without a new best, keeping the best 2);")):
        [(_, text)] = _restart_rows({"base": {"restart": {**state, "keep": keep}}})
        assert f"1 (after 2 x population results {said} population now 8, tournament 4" == text


@pytest.mark.parametrize(
    "setting, value",
    [
        ("restart_after", -1),
        ("restart_after", "often"),
        ("restart_after", True),
        ("restart_after", float("inf")),
        ("restart_growth", 0),
        ("restart_growth", 1.5),
        ("restart_keep", -1),
        ("restart_keep", 0.5),
        ("restart_keep", True),
    ],
)
def test_a_bad_restart_setting_is_named(setting, value):
    settings = {"restart_after": 1.0, "growth": 1}
    settings[{"restart_growth": "growth", "restart_keep": "keep"}.get(setting, "restart_after")] = value
    with pytest.raises(EinspaceError, match=setting):
        make(**settings)


@pytest.mark.parametrize("setting", [{"growth": 2}, {"keep": 1}])
def test_shaping_restarts_that_never_happen_is_refused(setting):
    with pytest.raises(EinspaceError, match="'restart_after' is 0 \\(never restart\\): set it too"):
        make(restart_after=0, **setting)
    make(restart_after=1, **setting)


def test_a_search_restarts_resumes_with_its_count_and_reports_it(tmp_path):
    """A real search (the cheap test evaluator) that restarts, interrupted and resumed: the resumed
    run goes on as one uninterrupted run does, and the report says how often it restarted."""
    strategy = {"settings": {"evaluations": 60, "population": 5, "restart_after": 1, "restart_growth": 2}}

    whole, uninterrupted = run_to_the_end(experiment(tmp_path / "whole", strategy=strategy))
    resumed, interrupted = run_to_the_end(experiment(tmp_path / "resumed", strategy=strategy), stop_after=23)
    restart = uninterrupted.restart
    assert restart.count >= 1 and resumed == whole and interrupted.restart == restart
    text = report(tmp_path / "whole", plot=False)
    assert f"population restarts: {restart.count} (after 1 x population" in text
    assert f"population now {5 * 2**restart.count}" in text and "keeping" not in text
    plain = experiment(tmp_path / "plain", strategy={"settings": {"evaluations": 12}})
    with SearchRun.start(plain) as run:
        run.run(plain.make_executor())
    assert "population restarts" not in report(tmp_path / "plain", plot=False)

"""Regularised evolution's random immigrants (`immigrants`): after the initial population, a share
of the candidates are fresh samples instead of children."""

from __future__ import annotations

import json

import pytest
from search_helpers import experiment, run_to_the_end
from test_search_strategies import drive, fitness

from einspace import Limits, input_state, load_grammar
from einspace.errors import EinspaceError
from einspace.search.evolution import RegularisedEvolution
from einspace.search.strategy import SearchSpace, get_strategy

SPACE = SearchSpace(load_grammar("einspace"), input_state((3, 16, 16)), Limits(max_depth=12, max_nodes=80))


def make(
    immigrants: float, random_seed: int = 0, strategy: str = "regularised_evolution", **settings
) -> RegularisedEvolution:
    """RE (or `strategy`) of population 4 and tournament 2 with `immigrants`."""
    base = {"evaluations": 400, "population": 4, "tournament": 2, "immigrants": immigrants}
    return get_strategy(strategy, SPACE, random_seed, base | settings)


def origins_after_the_first_population(s: RegularisedEvolution, count: int) -> list[str]:
    """Ask and tell one at a time; the origins of the `count` candidates after the first four."""
    origins = []
    for _ in range(4 + count):
        c = s.ask()
        origins.append(c.origin)
        s.tell(c.id, fitness(c.tree))
    assert origins[:4] == ["sampled"] * 4
    return origins[4:]


@pytest.mark.parametrize("share", [0.1, 0.25, 0.5])
def test_the_share_of_fresh_samples_after_the_first_population_is_the_setting(share):
    """Binomial over 300 candidates: the count is within 4 standard deviations of 300 x share."""
    origins = origins_after_the_first_population(make(share), 300)
    sampled = origins.count("sampled")
    sd = (300 * share * (1 - share)) ** 0.5
    assert abs(sampled - 300 * share) < 4 * sd
    assert set(origins) == {"sampled", "mutation"}


@pytest.mark.parametrize("strategy", ["regularised_evolution", "pareto_evolution"])
@pytest.mark.parametrize("share, expected", [(0.0, {"mutation"}), (1.0, {"sampled"})])
def test_the_bounds_mean_no_immigrant_and_only_immigrants(strategy, share, expected):
    """Pareto evolution takes the setting as RE does (its tournaments are NSGA-II's)."""
    assert set(origins_after_the_first_population(make(share, strategy=strategy), 40)) == expected


def test_an_immigrant_joins_the_population_and_the_oldest_dies():
    s = make(1.0)
    origins_after_the_first_population(s, 2)  # ids 4 and 5: fresh samples
    assert [m for m, _, _ in s.population] == [2, 3, 4, 5]


def test_without_immigrants_the_random_stream_is_what_it_was():
    """No draw is made for immigrants at 0, so an older run resumes exactly: the default and an
    explicit 0 ask the same trees, and a share too small ever to bring an immigrant, whose draws
    move the random stream, asks others."""
    streams = []
    for settings in ({}, {"immigrants": 0}, {"immigrants": 1e-12}):
        base = {"evaluations": 30, "population": 4, "tournament": 2}
        s = get_strategy("regularised_evolution", SPACE, 0, base | settings)
        streams.append([tree for _, tree, _ in drive(s, 1)])
    assert streams[0] == streams[1] != streams[2]


@pytest.mark.parametrize("in_flight", [1, 3])
def test_state_round_trip_with_immigrants(in_flight):
    a = make(0.3, evaluations=40)
    drive(a, in_flight, stop_after=15)
    state = json.loads(json.dumps(a.state_dict(), allow_nan=False))
    b = make(0.3, random_seed=999, evaluations=40)  # all from the state
    b.load_state_dict(state)
    assert drive(b, in_flight) == drive(a, in_flight)


@pytest.mark.parametrize("bad", [-0.1, 1.5, True, "0.2", None])
def test_a_share_that_is_no_probability_is_refused_naming_the_setting(bad):
    with pytest.raises(EinspaceError, match=r"'immigrants' must be a probability in \[0, 1\]"):
        make(bad)


def test_a_search_with_immigrants_resumes_exactly(tmp_path):
    """Killed after 13 results and resumed, a run with immigrants records what a whole run does,
    fresh samples after its first population of 4 included."""
    strategy = {"settings": {"evaluations": 30, "population": 4, "immigrants": 0.3}}

    whole, _ = run_to_the_end(experiment(tmp_path / "whole", strategy=strategy))
    resumed, _ = run_to_the_end(experiment(tmp_path / "resumed", strategy=strategy), stop_after=13)
    assert resumed == whole
    assert "sampled" in [origin for _, origin in whole[4:]]


def test_an_experiment_with_a_share_that_is_no_probability_is_refused(tmp_path):
    with pytest.raises(EinspaceError, match="test.yaml: strategy setting 'immigrants' must be a probability"):
        experiment(tmp_path, strategy={"settings": {"evaluations": 8, "immigrants": 2}})

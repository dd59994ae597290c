"""Screening that weighs cost (`regularised_evolution`'s `screen_cost`): the surrogate's model of
log seconds, learnt from measured evaluations only, and the screen's trade of predicted fitness
against predicted cost."""

from __future__ import annotations

import json
import math
import random
import statistics

import pytest
from search_helpers import SCREENED, experiment, run_to_the_end
from test_surrogate import SPACE, seconds
from test_surrogate import run as screened_run

from einspace.errors import EinspaceError
from einspace.search.report import report
from einspace.search.store import SQLiteStore, Status
from einspace.search.strategy import get_strategy
from einspace.search.surrogate import Surrogate, rank_correlation


def run(screen_cost: float, seed: int = 0, evaluations: int = 80, measured: bool = True, **kwargs):
    """Screening 6 proposals per child with cost weighed by `screen_cost`, each scored result's
    `seconds` told where `measured`."""
    timing = seconds if measured else None
    return screened_run(6, seed, evaluations, seconds=timing, screen_cost=screen_cost, **kwargs)


def test_the_cost_model_learns_log_seconds_from_measured_results_only():
    """Rows without seconds (the cache, warm starts) and failures are not cost data: below
    `min_results` measured rows there is no cost model, however many results there are."""
    rng = random.Random(0)
    s = Surrogate(min_results=10, cost=True)
    for i in range(30):
        x = rng.uniform(0, 3)
        s.add({"x": x}, rng.random(), seconds=10**x if i < 9 else None)
    s.predict([{"x": 1.0}])
    assert s.predict_log_seconds([{"x": 1.0}]) is None  # 9 measured
    for _ in range(11):
        x = rng.uniform(0, 3)
        s.add({"x": x}, rng.random(), seconds=10**x)
    s.predict([{"x": 1.0}])
    low, mid, high = s.predict_log_seconds([{"x": 0.2}, {"x": 1.5}, {"x": 2.8}])
    assert low < mid < high and low == pytest.approx(0.2, abs=0.5) and high == pytest.approx(2.8, abs=0.5)
    # a clock's zero is its resolution, not free; a failure's seconds are no cost
    s.add({"x": 0.0}, 0.5, seconds=0.0)
    assert s.log_seconds[-1] == -3
    s.add({"x": 3.0}, -math.inf, seconds=1000.0)
    assert s.log_seconds[-1] is None
    assert Surrogate(min_results=10).models_cost is False  # not asked for: never fitted


def test_the_spread_is_the_standard_deviation_of_the_scored_results_as_fitted():
    s = Surrogate(min_results=3)
    for i, f in enumerate((0.2, 0.4, -math.inf, 0.9, 0.5)):
        s.add({"x": i}, f)
    s.predict([{"x": 0.0}])
    assert s.spread == pytest.approx(statistics.pstdev([0.2, 0.4, 0.9, 0.5]))
    warm = Surrogate(min_results=3)
    for f in (10.0, 20.0, 30.0):  # an earlier run's range, mapped onto this run's [0.2, 0.4]
        warm.add({"x": f}, f, source=1)
    for f in (0.2, 0.4):
        warm.add({"x": f}, f)
    warm.predict([{"x": 0.0}])
    assert warm.spread == pytest.approx(statistics.pstdev([0.2, 0.3, 0.4, 0.2, 0.4]))


def test_weighing_cost_trains_cheaper_children():
    """Children after the surrogate is ready: the heavier the weight, the cheaper; without a
    weight, the seconds heard change nothing."""
    costs = {}
    for weight in (0, 2):  # one seed may go either way; three went 0.5 decades cheaper on average
        logs = [math.log10(seconds(c.tree)) for seed in range(3) for c in run(weight, seed)[1][30:]]
        costs[weight] = statistics.mean(logs)
    assert costs[2] < costs[0] - 0.3
    s, _ = run(2)  # the cost model, judged on the children it predicted before they were measured
    assert len(s.surrogate.cost_pairs) > 40 and rank_correlation(s.surrogate.cost_pairs) > 0.8
    _, plain = run(0, measured=False)
    _, heard = run(0)
    assert [c.tree for c in heard] == [c.tree for c in plain]


class Foretold:
    """A surrogate stand-in that predicts given fitness and log10 seconds for the proposals."""

    def __init__(self, fitness: list[float], log_seconds: list[float], spread: float):
        self.fitness, self.log_seconds, self.spread = fitness, log_seconds, spread
        self.pairs, self.cost_pairs = [], []

    def state_dict(self):
        return {}

    def predict(self, features):
        return self.fitness

    def predict_log_seconds(self, features):
        return self.log_seconds


@pytest.mark.parametrize(("gain", "chosen"), [(0.19, 0), (0.21, 1)])
def test_a_tenfold_cost_must_be_predicted_weight_times_spread_fitter(gain, chosen):
    """Weight 2, spread 0.1: a proposal ten times costlier wins only if predicted more than 0.2
    fitter."""
    s = get_strategy("regularised_evolution", SPACE, 0, {"screen": 2, "screen_cost": 2})
    proposals = [(s.sampler.sample(), "sampled", (), None) for _ in range(2)]
    s.screening.surrogate = Foretold([0.5, 0.5 + gain], [-1.0, 0.0], spread=0.1)
    assert s.screening.pick(proposals, 7) is proposals[chosen]
    assert s.screening.state_dict()["predicted_cost"] == [(7, [-1.0, 0.0][chosen])]


def test_cost_counts_only_once_enough_evaluations_were_measured():
    """Unmeasured, a weighed screen is the plain one; measured, it departs from it once the
    surrogate is ready (the 15th result) and not before."""
    _, plain = run(0)
    _, unmeasured = run(2, measured=False)
    _, weighed = run(2)
    assert [c.tree for c in unmeasured] == [c.tree for c in plain]
    assert [c.tree for c in weighed[:16]] == [c.tree for c in plain[:16]]
    assert [c.tree for c in weighed] != [c.tree for c in plain]


def test_a_checkpoint_from_before_cost_was_modelled_loads():
    s, _ = run(1, evaluations=60, stop_after=50)
    s.ask()  # in flight at the checkpoint, with its predicted seconds
    state = json.loads(json.dumps(s.state_dict()))
    assert state["surrogate"]["cost_pairs"] and state["surrogate"]["predicted_cost"]
    for key in ("log_seconds", "cost_pairs"):
        del state["surrogate"][key]
    del state["surrogate"]["predicted_cost"]
    settings = {"evaluations": 60, "population": 12, "screen": 6, "screen_cost": 1}
    resumed = get_strategy("regularised_evolution", SPACE, 0, settings)
    resumed.load_state_dict(state)
    assert resumed.surrogate.log_seconds == [None] * 50 and resumed.surrogate.cost_pairs == []
    assert resumed.screening.state_dict()["predicted_cost"] == []


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"screen": 4, "screen_cost": -0.5}, "'screen_cost' must be a number >= 0"),
        ({"screen": 4, "screen_cost": True}, "'screen_cost' must be a number >= 0"),
        ({"screen": 4, "screen_cost": "high"}, "'screen_cost' must be a number >= 0"),
        ({"screen": 4, "screen_cost": math.inf}, "'screen_cost' must be a number >= 0"),
        ({"screen_cost": 0.5}, "'screen' is 1 \\(nothing screened\\): set 'screen' above 1 too"),
    ],
)
def test_bad_cost_weights_are_refused_naming_the_setting(settings, message):
    with pytest.raises(EinspaceError, match=message):
        get_strategy("regularised_evolution", SPACE, 0, settings)


def test_the_search_loop_tells_measured_seconds_of_scored_evaluations_only(tmp_path):
    """What the strategy learns cost from: each scored evaluation's measured seconds, in the
    order told; failures and results served from the cache tell none. The report prints how
    well the cost model ranked the screened children's seconds."""
    settings = {**SCREENED["settings"], "screen_cost": 1.0, "evaluations": 30}
    e = experiment(
        tmp_path / "run",
        {**SCREENED, "settings": settings},
        evaluator={"name": "test_faulty", "settings": {"every": 4}},
        seeds=["resnet_small"],  # the initial population is the seed again and again: cached
    )
    _, strategy = run_to_the_end(e)
    records = SQLiteStore(tmp_path / "run" / "search.sqlite").history()
    assert {r.status for r in records} == {Status.FAILED, Status.OK, Status.CACHED}
    told = [math.log10(max(r.seconds, 1e-3)) if r.status == Status.OK else None for r in records]
    assert strategy.surrogate.log_seconds == told
    pairs = strategy.surrogate.cost_pairs
    assert pairs and all(measured in told for _, measured in pairs)
    rho = rank_correlation(pairs)
    value = "not yet (fewer than 3 screened results)" if math.isnan(rho) else f"{rho:.2f}"
    expected = f"its cost model's rank correlation (Spearman, seconds): {value} over {len(pairs)}"
    assert expected in report(tmp_path / "run", plot=False)

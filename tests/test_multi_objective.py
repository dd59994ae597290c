"""Multi-objective search end to end with the instant `test_params` evaluator: the front against
brute force over the history, limits refused before training, resume, the report, bad input."""

from __future__ import annotations

import json
import time

import pytest
import yaml
from search_helpers import BASE, experiment, history_key, merge

from einspace.cli import main
from einspace.sampling import Limits
from einspace.search.config import ConfigError, parse_experiment
from einspace.search.loop import SearchRun
from einspace.search.multi_objective import Objectives, Term
from einspace.search.report import report
from einspace.search.store import Record, Status

BASE_LIMITS = Limits(max_depth=20, max_nodes=200, max_params=50_000)

PARETO = {"name": "pareto_evolution", "settings": {"evaluations": 30, "population": 8, "tournament": 3}}
LIMIT = 20_000
OBJECTIVES = {
    "objectives": [{"name": "fitness"}, {"name": "params", "direction": "min"}],
    "constraints": [{"name": "params", "max": LIMIT}],
    "reference": [-5, 30_000],
}


def _search(run_dir, strategy=PARETO, max_results=None, **changes):
    e = experiment(run_dir, strategy=strategy, multi_objective=OBJECTIVES, **changes)
    with SearchRun.start(e) as run:
        summary = run.run(e.make_executor(), max_results=max_results)
        return e, summary, run.store.history()


def _objectives(e) -> Objectives:
    space = e.space()
    objectives = Objectives.of(e.multi_objective, space.grammar, space.input)
    assert objectives is not None
    return objectives


@pytest.fixture(scope="module")
def searched(tmp_path_factory):
    return _search(tmp_path_factory.mktemp("pareto"))


def test_the_front_is_the_non_dominated_feasible_results(searched):
    e, summary, history = searched
    assert summary.finished and len(history) == 30
    objectives = _objectives(e)
    params = {r.id: objectives.analytic(r.tree)["params"] for r in history}
    feasible = [
        (r.fitness, params[r.id]) for r in history if r.status != Status.FAILED and params[r.id] <= LIMIT
    ]

    def beaten(p):  # brute force: another point at least as good in both, better in one
        return any(q[0] >= p[0] and q[1] <= p[1] and q != p for q in feasible)

    expected = sorted({p for p in feasible if not beaten(p)}, key=lambda p: -p[0])
    assert [values for _, values in objectives.front(history)] == expected


def test_a_tree_over_an_analytic_limit_is_refused_before_training(searched):
    e, _, history = searched
    objectives = _objectives(e)
    over = [r for r in history if objectives.analytic(r.tree)["params"] > LIMIT and r.status != Status.CACHED]
    assert over, "the sampler should propose some trees over the limit"
    for r in over:
        assert r.status == Status.FAILED and r.error.startswith("infeasible before training: params")
        assert r.worker is None and not r.metrics  # never reached an evaluator
    assert all(r.status == Status.OK for r in history if r.status != Status.CACHED and r not in over)


def test_the_report_prints_the_front(searched):
    e, _, history = searched
    text = report(e.directory, top=1, plot=False, trust_plugins=True)
    assert "Pareto front: " in text and "hypervolume " in text
    table = text[text.index("Pareto front") :].splitlines()[3:]
    front_ids = [r.id for r, _ in _objectives(e).front(history)]
    assert [int(line.split()[0]) for line in table[: len(front_ids)]] == front_ids


def test_the_html_report_plots_the_front_and_draws_its_trees(searched, tmp_path, monkeypatch):
    from einspace.search import pareto_report
    from einspace.search.html_report import write_html_report

    monkeypatch.setattr(pareto_report, "DRAWN", 2)  # drawing trees is the slow part

    e, _, history = searched
    page = write_html_report(e.directory, tmp_path / "r.html", top=1, trust_plugins=True).read_text()
    assert "<h2>Pareto front</h2>" in page and 'alt="hypervolume over compute"' in page
    front = _objectives(e).front(history)
    assert len(front) > 2 and page.count("<h3>front: id") == 2
    assert f"{len(front) - 2} more front members are in the table above" in page


def test_stop_and_resume_gives_the_same_history(tmp_path, searched):
    _, _, reference = searched
    e, first, _ = _search(tmp_path, max_results=11)
    assert not first.finished
    _, second, history = _search(tmp_path)
    assert second.finished and history_key(history) == history_key(reference)


def test_random_search_keeps_the_front_of_what_it_sampled(tmp_path):
    e, summary, history = _search(
        tmp_path, strategy={"name": "random_search", "settings": {"evaluations": 12}}
    )
    assert summary.finished and _objectives(e).front(history)


def _record(i: int, fitness: float, size: float, seconds: float = 1.0) -> Record:
    return Record(
        i,
        "t",
        str(i),
        "sampled",
        status=Status.OK,
        fitness=fitness,
        metrics={"size": size},
        cost={"cpu_seconds": seconds},
    )


def test_hypervolume_over_compute_by_hand(searched):
    e, _, _ = searched
    space = e.space()
    objectives = Objectives(
        [Term("fitness", "max"), Term("metric:size", "min")], [], (0.0, 40.0), 1, space.grammar, space.input
    )
    history = [_record(0, 0.5, 10), _record(1, 0.4, 30, 2.0), _record(2, 0.8, 20)]
    # [0, 0.5] x [10, 40] = 15, then + [0.5, 0.8] x [20, 40] = 6; the second adds nothing
    curve = objectives.hypervolume_over_compute(history)
    assert [c for c, _ in curve] == [1.0, 3.0, 4.0]
    assert [h for _, h in curve] == pytest.approx([15.0, 15.0, 21.0])


def test_a_cached_copy_of_a_failure_has_no_point(searched):
    e, _, _ = searched
    objectives = _objectives(e)
    copy = Record(0, "t", "0", "sampled", status=Status.CACHED, fitness=float("-inf"), cached_from=3)
    assert objectives.score(copy) is None and objectives.values(copy) is None
    strategy = e.make_strategy()
    candidate = strategy.ask()
    strategy.tell(candidate.id, [0.0, float("-inf"), -5.0])  # never kept: its checkpoint must be JSON
    assert strategy.population[-1][2] is None
    json.dumps(strategy.state_dict(), allow_nan=False)


def test_a_constraint_kept_as_an_objective_is_its_excess(searched):
    e, _, _ = searched
    space = e.space()
    section = e.multi_objective.__class__(
        objectives=({"name": "fitness"},),
        constraints=({"name": "metric:size", "max": 15, "kind": "objective"},),
    )
    objectives = Objectives.of(section, space.grammar, space.input)
    assert objectives.labels == ["fitness", "metric:size beyond max 15"]
    assert objectives.values(_record(0, 0.5, 10)) == (0.5, 0.0)
    assert objectives.values(_record(0, 0.5, 25)) == (0.5, 10.0)
    assert objectives.score(_record(0, 0.5, 25)) == [0.0, 0.5, -10.0]


def test_the_pareto_tournament_prefers_lower_fronts_then_the_less_crowded(searched):
    e, _, _ = searched
    strategy = e.make_strategy()
    strategy.population = [
        (0, "a", [0.0, 1.0, 1.0]),  # dominated by 1
        (1, "b", [0.0, 2.0, 2.0]),
        (2, "c", [0.0, 3.0, 0.0]),  # front 0 with 1 and 3
        (3, "d", [0.0, 0.0, 3.0]),
        (4, "e", [1.0, 9.0, 9.0]),  # best values, but breaks a limit
        (5, "f", None),  # failed
    ]
    order = strategy._population_order()
    assert order[2] == order[3] == (0, -float("inf")) and order[1][0] == 0 and order[1][1] > -float("inf")
    assert order[0][0] == 1 and order[4][0] == 2 and order[5][0] > 2
    strategy.tournament_size = 50  # every member is drawn: a front-0 extreme wins
    assert strategy._tournament()[0] in (2, 3)


def test_latency_is_the_median_of_timed_passes_after_warm_up():
    import torch
    from torch import nn

    from einspace.evaluators._runtime import Runtime
    from einspace.evaluators.latency import TIMED_PASSES, WARMUP_PASSES, forward_latency_ms

    class Sleepy(nn.Module):
        calls = 0

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            Sleepy.calls += 1
            time.sleep(0.004 if x.shape == (2, 1, 8, 8) else 1.0)
            return x

    ms = forward_latency_ms(Sleepy(), Runtime("cpu", False, False, False), (1, 8, 8), 2)
    assert Sleepy.calls == WARMUP_PASSES + TIMED_PASSES and 4.0 <= ms < 100.0


BAD = [
    ({"objectives": [{"name": "acuracy"}]}, "multi_objective.objectives[0].name: unknown quantity 'acuracy'"),
    ({"objectives": [{"name": "params", "direction": "down"}]}, "multi_objective.objectives[0].direction"),
    ({"objectives": [{"name": "metric:x"}]}, "multi_objective.objectives[0].direction"),
    (
        {"objectives": [{"name": "fitness"}, {"name": "params"}], "reference": [0]},
        "multi_objective.reference must be 2",
    ),
    (
        {"objectives": [{"name": "fitness"}], "constraints": [{"name": "size", "max": 1}]},
        "multi_objective.constraints[0].name: unknown quantity 'size'",
    ),
    (
        {"objectives": [{"name": "fitness"}], "constraints": [{"name": "params"}]},
        "multi_objective.constraints[0] must give",
    ),
    (
        {"objectives": [{"name": "fitness"}], "constraints": [{"name": "params", "max": 1, "kind": "soft"}]},
        "multi_objective.constraints[0].kind",
    ),
    ({"objectives": [{"name": "fitness"}, {"name": "latency_ms"}]}, "evaluator.settings.latency_batch_size"),
    ({"objectives": [{"name": "fitness"}, {"name": "fitness"}]}, "multi_objective.objectives[1].name"),
    ({"objectives": [{"name": "fitness", "weight": 2}]}, "unknown key multi_objective.objectives[0].weight"),
    ({"constraints": [{"name": "params", "max": 1}]}, "need multi_objective.objectives"),
]


@pytest.mark.parametrize(("section", "message"), BAD)
def test_bad_multi_objective_settings_name_the_key(tmp_path, section, message):
    raw = merge(BASE, {"run_dir": str(tmp_path), "multi_objective": section})
    raw["strategy"] = PARETO
    with pytest.raises(ConfigError, match="test.yaml: .*") as info:
        parse_experiment(raw, "test.yaml")
    assert message in str(info.value)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"strategy": PARETO}, "strategy.name 'pareto_evolution' needs multi_objective.objectives"),
        ({"multi_objective": OBJECTIVES}, "strategy.name 'regularised_evolution' climbs the fitness alone"),
        (
            {
                "strategy": PARETO,
                "multi_objective": OBJECTIVES,
                "multi_fidelity": {"scheduler": "successive_halving"},
            },
            "multi_fidelity.scheduler 'successive_halving' promotes by one fitness",
        ),
    ],
)
def test_strategies_and_schedulers_that_cannot_rank_by_objectives_are_refused(tmp_path, changes, message):
    raw = merge(BASE, {"run_dir": str(tmp_path), **changes})
    with pytest.raises(ConfigError, match=message):
        parse_experiment(raw, "test.yaml")


def test_the_search_command_exits_2_before_searching(tmp_path, capsys):
    raw = merge(
        BASE,
        {
            "run_dir": str(tmp_path / "run"),
            "multi_objective": {"objectives": [{"name": "fitness", "direction": "up"}]},
        },
    )
    raw["strategy"] = PARETO
    path = tmp_path / "exp.yaml"
    path.write_text(yaml.safe_dump(raw))
    code = main(["search", str(path)])
    err = capsys.readouterr().err
    assert code == 2 and "multi_objective.objectives[0].direction" in err and str(path) in err
    assert "Traceback" not in err and not (tmp_path / "run").exists()


def test_the_training_evaluator_measures_latency_only_when_asked():
    import random

    from einspace import input_state, load_grammar
    from einspace.evaluators.base import Task, run_task
    from einspace.sampling import make_sampler
    from einspace.tree import to_text

    grammar, state = load_grammar("einspace"), input_state((1, 8, 8), "im")
    tree = to_text(make_sampler(grammar, state, BASE_LIMITS, "paper", rng=random.Random(1)).sample())
    settings = {"epochs": 1, "train_subset": 32, "valid_subset": 32, "threads": 1, "batch_size": 16}
    timed = run_task(
        Task(tree, "einspace", (1, 8, 8), "training", {**settings, "latency_batch_size": 4}, "im")
    )
    plain = run_task(Task(tree, "einspace", (1, 8, 8), "training", settings, "im"))
    assert timed.ok and plain.ok, (timed.error, plain.error)
    assert timed.metrics["latency_ms"] > 0 and "latency_ms" not in plain.metrics

"""einspace.search.compute: what each evaluation cost, the incumbent across fidelities, best so far
against cumulative compute, and compute wasted on failures -- on hand-made histories."""

from __future__ import annotations

import math

import pytest

from einspace.evaluators.base import Cost, EvaluationFailed, Task, run_task
from einspace.search.compute import best_so_far, compute_of, incumbent, summarise, wasted
from einspace.search.store import Record


def rec(i, status="ok", fitness=0.5, fidelity=None, cpu=1.0, gpu=0.0, wall=2.0, partial=False, cost=True):
    costs = {"cpu_seconds": cpu, "gpu_seconds": gpu, "wall_seconds": wall} if cost else {}
    fit = -math.inf if status == "failed" else fitness
    return Record(i, f"t{i}", f"h{i}", "sampled", (), "finished", status, fit, seconds=wall, seq=i + 1,
                  fidelity=fidelity, partial=partial, cost=costs)  # fmt: skip


@pytest.mark.parametrize(
    ("record", "compute"),
    [
        (rec(0, cpu=3.0, gpu=0.0, wall=5.0), 3.0),  # CPU: the process's CPU seconds
        (rec(0, cpu=3.0, gpu=1.5, wall=5.0), 1.5),  # a GPU trained: its seconds
        (rec(0, cpu=0.0, gpu=0.0, wall=5.0), 5.0),  # killed worker: only the executor's clock saw it
        (rec(0, status="cached", cpu=3.0), 0.0),  # a duplicate served from the store costs nothing
        (rec(0, wall=4.0, cost=False), 4.0),  # a record of a store from before compute accounting
    ],
)
def test_compute_of_each_kind_of_record(record, compute):
    assert compute_of(record) == compute


def test_the_incumbent_is_the_best_at_the_highest_fidelity_reached():
    history = [
        rec(0, fitness=0.9, fidelity=1),
        rec(1, fitness=0.7, fidelity=3),
        rec(2, fitness=0.95, fidelity=1),
    ]
    assert incumbent(history).id == 1  # 0.95 at one epoch does not beat 0.7 at three
    assert (
        incumbent([*history, rec(3, fitness=0.6, fidelity=None)]).id == 3
    )  # None: the evaluator's own, the top
    assert incumbent([rec(0, status="failed"), rec(1, fitness=0.1)]).id == 1
    assert incumbent([rec(0, status="failed")]) is None
    assert incumbent([rec(0, fitness=0.5), rec(1, fitness=0.5)]).id == 0  # ties keep the earlier


def test_best_so_far_and_wasted_against_cumulative_compute():
    history = [
        rec(0, status="failed", cpu=4.0),
        rec(1, fitness=0.3, fidelity=1, cpu=1.0),
        rec(2, fitness=0.2, fidelity=3, cpu=3.0),
        rec(3, status="cached", fitness=0.9, fidelity=1, cpu=7.0),
        rec(4, fitness=0.4, fidelity=3, cpu=3.0, partial=True),
    ]
    assert best_so_far(history) == [(4.0, None), (5.0, 0.3), (8.0, 0.2), (8.0, 0.2), (11.0, 0.4)]
    assert wasted(history) == 4.0
    summary = summarise(history)
    assert (summary.total, summary.wasted, summary.partial, summary.incumbent_at) == (11.0, 4.0, 1, 11.0)
    assert summary.wasted_share == pytest.approx(4 / 11)
    assert summary.by_fidelity == {None: (1, 4.0), 1: (1, 1.0), 3: (2, 6.0)}  # cached not counted


def test_run_task_accounts_the_cost_of_successes_and_failures(monkeypatch):
    """The evaluator's progress metrics become the Cost; process CPU and wall time are measured;
    a failure keeps the progress it reports; `partial` leaves the metrics for Result.partial."""
    from einspace.evaluators import base

    class Stub(base.Evaluator):
        name = "stub"
        outcome: dict | Exception = {}

        def evaluate(self, checked, random_seed):
            if isinstance(Stub.outcome, Exception):
                raise Stub.outcome
            sum(i * i for i in range(200_000))  # some CPU time to measure
            return Stub.outcome

    base.EVALUATORS.register(Stub)
    try:
        task = Task(
            "(S (R1 permute(order=(1,3,2))) (M (C norm)) (R2 identity))", "einspace", (3, 8, 8), "stub"
        )
        Stub.outcome = {"fitness": 0.5, "epochs": 2.5, "steps": 7.0, "partial": 1.0}
        ok = run_task(task)
        assert ok.ok and ok.partial and "partial" not in ok.metrics and ok.metrics["epochs"] == 2.5
        assert (ok.cost.epochs, ok.cost.steps, ok.cost.gpu_seconds) == (2.5, 7, 0.0)
        assert 0 < ok.cost.cpu_seconds and 0 < ok.cost.wall_seconds == ok.seconds
        Stub.outcome = EvaluationFailed("too slow", {"epochs": 0.25, "steps": 3, "gpu_seconds": 1.5})
        failed = run_task(task)
        assert not failed.ok and failed.error == "too slow" and not failed.partial
        assert (failed.cost.epochs, failed.cost.steps, failed.cost.compute_seconds) == (0.25, 3, 1.5)
        Stub.outcome = RuntimeError("boom")
        crashed = run_task(task)
        assert crashed.error.startswith("evaluator crashed") and crashed.cost.wall_seconds > 0
    finally:
        base.EVALUATORS.unregister("stub")


def test_a_cost_round_trips_and_ignores_unknown_keys():
    cost = Cost(cpu_seconds=1.0, gpu_seconds=2.0, wall_seconds=3.0, epochs=0.5, steps=4)
    assert Cost.from_json({**cost.to_json(), "joules": 9.0}) == cost
    assert Cost.from_json(None) == Cost()

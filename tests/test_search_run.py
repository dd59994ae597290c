"""End-to-end searches, in-process executor: results, duplicates, resume after stop, crash, kill -9; CLI."""

from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from search_helpers import BASE, PLUGIN, experiment, finished_count, history_key, merge, wait_for

from einspace.cli import main
from einspace.errors import EinspaceError
from einspace.search.loop import STORE_NAME, SearchRun, open_store, run_search


def run(e, **kw):
    store = open_store(e)
    try:
        summary = run_search(e, e.make_executor(), store, **kw)
        return summary, store.history()
    finally:
        store.close()


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """An uninterrupted run, the history every resumed run must reproduce."""
    e = experiment(tmp_path_factory.mktemp("reference"))
    summary, history = run(e)
    assert summary.finished
    return history


def test_search_completes_with_every_evaluation_recorded(reference):
    assert len(reference) == 40
    assert [r.id for r in reference] == list(range(40))  # N = 1: finishing order = asking order
    assert {r.origin for r in reference} >= {"sampled", "mutation"}
    assert all(r.status in ("ok", "cached") and math.isfinite(r.fitness) for r in reference)
    ok = [r.fitness for r in reference if r.status == "ok"]
    assert max(ok[10:]) >= max(ok[:10])  # evolution never loses the best it could reach


def test_duplicates_are_cached_not_reevaluated(tmp_path):
    e = experiment(tmp_path, seeds=["resnet18", "vit"])
    summary, history = run(e)
    seeds = [r for r in history if r.origin.startswith("seed:")]
    assert len(seeds) == 10
    assert [r.status for r in seeds[:2]] == ["ok", "ok"]
    assert all(r.status == "cached" and r.cached_from in (0, 1) for r in seeds[2:])
    assert summary.cached >= 8 and summary.evaluated == 40 - summary.cached
    assert len({r.hash for r in history if r.status == "ok"}) == summary.evaluated  # none twice


def test_stop_and_resume_gives_the_same_history(tmp_path, reference):
    e = experiment(tmp_path)
    with SearchRun.start(e) as started:
        first = started.run(e.make_executor(), max_results=13)
    assert not first.finished and first.results == 13
    with SearchRun.start(e) as resumed:
        assert resumed.strategy.next_id >= 13  # restored from its checkpoint
        second = resumed.run(e.make_executor())
    assert second.finished
    with SearchRun.open(tmp_path) as finished:  # read-only, as reports see it
        assert finished.experiment == e and finished.strategy.done
        history = finished.store.history()
        assert history_key(history) == history_key(reference)
        assert finished.check(history[-1].tree).params > 0


def test_crash_between_commit_and_checkpoint_replays_from_the_store(tmp_path, reference, monkeypatch):
    """A result committed but never told (the process died in between) is told on resume, not re-run."""
    from einspace.search.store import SQLiteStore

    e = experiment(tmp_path)
    calls = {"n": 0}
    real = SQLiteStore.save_checkpoint

    def dying(self, state):
        calls["n"] += 1
        if calls["n"] == 17:
            raise SystemExit("simulated crash")
        real(self, state)

    monkeypatch.setattr(SQLiteStore, "save_checkpoint", dying)
    with pytest.raises(SystemExit):
        run(e)
    monkeypatch.setattr(SQLiteStore, "save_checkpoint", real)
    summary, history = run(e)
    assert summary.replayed == 1 and summary.finished
    assert history_key(history) == history_key(reference)


_CHILD = """
import sys
from einspace.search.loop import open_store, run_search
from search_helpers import experiment
e = experiment(sys.argv[1], evaluator={"name": "test_params", "settings": {"sleep": 0.05}})
store = open_store(e)
run_search(e, e.make_executor(), store)
"""


def test_kill_9_and_resume_gives_the_same_history(tmp_path, reference):
    run_dir = tmp_path / "killed"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parent)}
    child = subprocess.Popen([sys.executable, "-c", _CHILD, str(run_dir)], env=env)
    try:
        wait_for(lambda: finished_count(run_dir / STORE_NAME) >= 15, 60, "15 evaluations of the child search")
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    e = experiment(run_dir, evaluator={"name": "test_params", "settings": {"sleep": 0.05}})
    store = open_store(e)
    assert 15 <= len(store.history()) < 40
    store.close()
    summary, history = run(e)
    assert summary.finished
    # The evaluator's settings differ from the reference's only by a sleep: same fitness, same history.
    assert history_key(history) == history_key(reference)


def test_async_in_flight_run_completes(tmp_path):
    summary, history = run(experiment(tmp_path, executor={"max_in_flight": 4}))
    assert summary.finished and len(history) == 40 and [r.seq for r in history] == list(range(1, 41))


def test_a_run_dir_of_another_experiment_is_refused(tmp_path):
    run(experiment(tmp_path, strategy={"settings": {"evaluations": 12}}))
    with pytest.raises(EinspaceError, match=r"(?s)different experiment.*\n  random_seed: 3 -> 4\n"):
        open_store(experiment(tmp_path, random_seed=4, strategy={"settings": {"evaluations": 12}}))
    # executor resources may change between a run and its resumption
    open_store(
        experiment(tmp_path, executor={"max_in_flight": 2}, strategy={"settings": {"evaluations": 12}})
    )


@pytest.mark.parametrize("strategy", ["random_search", "random_sampling"])
def test_random_strategies_end_to_end(tmp_path, strategy):
    from einspace.search.report import report

    summary, history = run(experiment(tmp_path, strategy={"name": strategy, "settings": {"evaluations": 8}}))
    assert summary.finished and len(history) == 8 and {r.origin for r in history} == {"sampled"}
    text = report(tmp_path, plot=False)  # random sampling's result is the mean of its samples
    assert ("random sampling: mean fitness" in text) == (strategy == "random_sampling")
    assert f"strategy {strategy}, evaluator test_params" in text and "finished 8 of 8" in text


def test_cli_search_then_report(tmp_path, capsys):
    raw = merge(BASE, {"run_dir": str(tmp_path / "run"), "strategy": {"settings": {"evaluations": 15}}})
    (tmp_path / "exp.yaml").write_text(yaml.safe_dump(raw))
    assert main(["search", str(tmp_path / "exp.yaml")]) == 0
    assert "done: 15 evaluated" in capsys.readouterr().err
    assert main(["search", str(tmp_path / "exp.yaml"), "--quiet"]) == 0  # already complete: nothing to do
    assert main(["report", str(tmp_path / "run"), "--top", "2"]) == 0
    out = capsys.readouterr().out
    assert "finished 15 of 15" in out and "#1  fitness" in out and "#3" not in out and "params" in out
    assert (tmp_path / "run" / "fitness.png").read_bytes()[:4] == b"\x89PNG"
    lines = (tmp_path / "run" / "evaluations.csv").read_text().splitlines()
    assert lines[0].startswith("seq,id,status,fitness") and len(lines) == 16


def test_cli_search_ends_with_best_tree_seed_comparison_and_report_location(tmp_path, capsys):
    raw = merge(
        BASE,
        {
            "run_dir": str(tmp_path / "run"),
            "seeds": ["resnet_small"],
            "strategy": {"settings": {"evaluations": 15}},
        },
    )
    (tmp_path / "exp.yaml").write_text(yaml.safe_dump(raw))
    assert main(["search", str(tmp_path / "exp.yaml")]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("best: fitness ") and out[1].strip().startswith("params ")
    assert out[2].strip().startswith("(S ")
    assert out[3].startswith("seed resnet_small: fitness ") and "(id 0); the best is +" in out[3]
    assert out[4].startswith(f"report: `einspace report {tmp_path / 'run'}`") and "fitness.png" in out[4]
    assert main(["search", str(tmp_path / "exp.yaml")]) == 0  # already complete: the same summary
    assert capsys.readouterr().out.splitlines() == out


def test_final_summary_compares_validation_accuracy_with_the_seeds_own_evaluation(tmp_path):
    from einspace.search.report import final_summary
    from einspace.search.store import Record, SQLiteStore

    store = SQLiteStore(tmp_path / STORE_NAME, writer=True)
    store.set_meta("config", "{}")
    rows = [
        (0, "seed:resnet_small", "ok", 0.5),
        (1, "seed:resnet_small", "cached", 0.5),
        (2, "mutation", "ok", 0.8),
    ]
    for i, origin, status, acc in rows:
        store.submit(Record(i, f"(S t{i})", f"h{i}", origin))
        metrics = {"valid_accuracy": acc}
        store.finish(Record(i, f"(S t{i})", f"h{i}", origin, status=status, fitness=acc, metrics=metrics))
    store.close()
    text = final_summary(tmp_path)
    assert text.startswith("best: validation accuracy 0.8000 (id 2, mutation, evaluation 3 of 3)")
    assert "seed resnet_small: validation accuracy 0.5000 (id 0); the best is +0.3000" in text
    assert "(statistics unavailable" in text  # no grammar in this config; the summary still prints
    with SearchRun.open(tmp_path) as unreadable:
        assert unreadable.experiment is None and len(unreadable.store.history()) == 3
        with pytest.raises(EinspaceError, match=r"cannot be read: .*missing key 'input.shape'"):
            unreadable.check("(S t0)")


def test_cli_errors_exit_2_without_traceback(tmp_path, capsys):
    (tmp_path / "bad.yaml").write_text(yaml.safe_dump(merge(BASE, {"executor": {"num_gpu": 1}})))
    assert main(["search", str(tmp_path / "bad.yaml")]) == 2
    assert "unknown key 'executor.num_gpu'" in capsys.readouterr().err
    assert main(["report", str(tmp_path / "nothing")]) == 2
    assert "not a search run directory" in capsys.readouterr().err


def test_plugin_path_is_absolute_in_config(tmp_path):
    assert experiment(tmp_path).plugins == (PLUGIN,)


def test_async_stop_requeues_in_flight_and_evaluates_nothing_twice(tmp_path):
    e = experiment(tmp_path, executor={"max_in_flight": 4}, seeds=["resnet18", "vit"])
    first, _ = run(e, max_results=13)
    assert not first.finished
    second, history = run(e)
    assert second.finished and second.requeued >= 1
    assert sorted(r.id for r in history) == list(range(40))
    evaluated = [r.hash for r in history if r.status != "cached"]
    assert len(evaluated) == len(set(evaluated))  # each distinct tree evaluated once, in flight or not
    seeds = [r for r in history if r.origin.startswith("seed:")]
    assert sum(r.status == "ok" for r in seeds) == 2  # duplicates of an in-flight seed waited for it


def test_ctrl_c_stops_cleanly_and_the_rerun_resumes(tmp_path):
    slow = {"name": "test_params", "settings": {"sleep": 0.05}}
    raw = merge(BASE, {"run_dir": str(tmp_path / "run"), "evaluator": slow})
    (tmp_path / "exp.yaml").write_text(yaml.safe_dump(raw))
    code = "import sys; from einspace.cli import main; sys.exit(main(sys.argv[1:]))"
    child = subprocess.Popen(
        [sys.executable, "-c", code, "search", str(tmp_path / "exp.yaml")],
        stderr=subprocess.PIPE,
        text=True,
    )
    # one finished evaluation: the search loop, and its signal handlers, are running
    wait_for(lambda: finished_count(tmp_path / "run" / STORE_NAME) >= 1, 60, "the child's first evaluation")
    child.send_signal(signal.SIGINT)
    _, err = child.communicate(timeout=60)
    assert child.returncode == 130 and "again to resume" in err and "Traceback" not in err
    assert main(["search", str(tmp_path / "exp.yaml"), "--quiet"]) == 0
    e = experiment(tmp_path / "run", evaluator=slow)
    s = open_store(e)
    assert len(s.history()) == 40 and not s.running()


def test_report_groups_auxiliary_and_architecture_metrics():
    from einspace.search.report import metric_lines

    metrics = {
        "fitness": 0.9,
        "valid_accuracy": 0.9,
        "params": 1200.0,
        "aux/complexity": 0.04,
        "complexity/flops_effective": 1.5e6,
        "complexity/flops_nominal": 3e6,
        "arch/backbone.2/width": 20.0,
        "arch/backbone.2/width_nominal": 32.0,
    }
    assert metric_lines(metrics) == [
        "params 1200  valid_accuracy 0.9",
        "arch/backbone.2: width 20  width_nominal 32",
        "aux: complexity 0.04",
        "complexity: flops_effective 1.5e+06  flops_nominal 3e+06",
    ]

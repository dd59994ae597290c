"""Experiment tracking: a tiny search logged to MLflow and to TensorBoard (both in the test extra,
so never skipped), read back with each library's own reader and compared with the store; a resumed
run logs nothing twice; bad settings exit 2 before the search starts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from search_helpers import BASE, experiment, merge

from einspace.cli import main
from einspace.search.compute import compute_of
from einspace.search.loop import STORE_NAME, SearchRun
from einspace.search.store import Record

TINY = {"settings": {"evaluations": 12, "population": 4, "tournament": 2}}


def _search_in_two_sessions(run_dir: Path, tracking: dict) -> tuple[list[Record], str | None]:
    """12 evaluations: 5, then a resumed session for the rest; the history, and the MLflow meta."""
    e = experiment(run_dir, strategy=TINY, tracking=tracking, seeds=["resnet18", "resnet18"])
    with SearchRun.start(e) as run:
        assert not run.run(e.make_executor(), max_results=5).finished
        stopped = json.loads(run.store.get_meta("tracking.mlflow") or "{}").get("run_id")
        if stopped is not None:  # stopped, to be resumed
            assert _mlflow_status(run.store.get_meta("tracking.mlflow")) == "KILLED"
    with SearchRun.start(e) as run:
        assert run.run(e.make_executor()).finished
        history = run.store.history()
        meta = run.store.get_meta("tracking.mlflow")
    assert len(history) == 12 and any(r.status == "cached" for r in history)
    return history, meta


def _mlflow_status(meta: str) -> str:
    from mlflow.tracking import MlflowClient

    kept = json.loads(meta)
    return MlflowClient(tracking_uri=kept["uri"]).get_run(kept["run_id"]).info.status


def test_mlflow_logs_every_evaluation_once_and_the_run(tmp_path):
    from mlflow.artifacts import load_dict
    from mlflow.tracking import MlflowClient

    history, meta = _search_in_two_sessions(tmp_path, {"mlflow": {"experiment_name": "tiny"}})
    kept = json.loads(meta)
    assert kept["uri"] == f"sqlite:///{(tmp_path / 'mlflow.db').resolve()}"
    client = MlflowClient(tracking_uri=kept["uri"])
    run = client.get_run(kept["run_id"])
    assert run.info.status == "FINISHED"
    assert run.data.params["strategy.name"] == "regularised_evolution"
    assert json.loads(run.data.params["strategy.settings.evaluations"]) == 12
    assert client.get_experiment(run.info.experiment_id).name == "tiny"

    fitness = client.get_metric_history(run.info.run_id, "fitness")
    assert sorted(m.step for m in fitness) == [r.id for r in history]  # each once, resume included
    by_step = {m.step: m.value for m in fitness}
    compute = {m.step: m.value for m in client.get_metric_history(run.info.run_id, "compute_seconds")}
    params = {m.step: m.value for m in client.get_metric_history(run.info.run_id, "metric/params")}
    best = {m.step: m.value for m in client.get_metric_history(run.info.run_id, "run/best_fitness")}
    top = float("-inf")
    for r in history:
        top = max(top, r.fitness)
        assert by_step[r.id] == pytest.approx(r.fitness)
        assert compute[r.id] == pytest.approx(compute_of(r))
        assert params[r.id] == pytest.approx(r.metrics["params"])
        assert best[r.id] == pytest.approx(top)
        logged = load_dict(f"{run.info.artifact_uri}/evaluations/{r.id:06d}.json")
        assert logged["tree"] == r.tree and logged["origin"] == r.origin and logged["status"] == r.status
        assert logged["fidelity"] == r.fidelity and logged["parents"] == list(r.parents)
    assert (tmp_path / "mlflow-artifacts").is_dir()


def test_tensorboard_logs_every_evaluation_once_and_the_run(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.util import tensor_util

    history, _ = _search_in_two_sessions(tmp_path, {"tensorboard": {"logdir": "tb"}})
    logdir = tmp_path / "tb"
    assert len(list(logdir.glob("events.out.tfevents.*"))) == 2  # one file per session
    events = EventAccumulator(str(logdir), size_guidance={"scalars": 0, "tensors": 0})
    events.Reload()
    fitness = events.Scalars("fitness")
    assert sorted(e.step for e in fitness) == [r.id for r in history]  # each once, resume included
    by_step = {e.step: e.value for e in fitness}
    compute = {e.step: e.value for e in events.Scalars("compute_seconds")}
    total = {e.step: e.value for e in events.Scalars("run/compute_seconds")}
    texts = {
        e.step: json.loads(tensor_util.make_ndarray(e.tensor_proto).item().decode())
        for e in events.Tensors("evaluation/text_summary")
    }
    spent = 0.0
    for r in history:
        spent += compute_of(r)
        assert by_step[r.id] == pytest.approx(r.fitness, rel=1e-6)
        assert compute[r.id] == pytest.approx(compute_of(r), rel=1e-5, abs=1e-6)
        assert total[r.id] == pytest.approx(spent, rel=1e-5, abs=1e-6)
        assert texts[r.id]["tree"] == r.tree and texts[r.id]["origin"] == r.origin
        assert texts[r.id]["fidelity"] == r.fidelity and texts[r.id]["status"] == r.status
    config = events.Tensors("run/config/text_summary")
    assert len(config) == 1  # once per run, not per session
    assert "regularised_evolution" in tensor_util.make_ndarray(config[0].tensor_proto).item().decode()


def _exit_code(tmp_path: Path, tracking: object, capsys) -> tuple[int, str]:
    raw = merge(BASE, {"run_dir": str(tmp_path / "run"), "tracking": tracking})
    (tmp_path / "exp.yaml").write_text(yaml.safe_dump(raw))
    code = main(["search", str(tmp_path / "exp.yaml"), "--quiet"])
    assert not (tmp_path / "run" / STORE_NAME).exists()  # refused before the search starts
    return code, capsys.readouterr().err


@pytest.mark.parametrize(
    ("tracking", "says"),
    [
        ({"mlflo": {}}, "tracking.mlflo: unknown tracker 'mlflo'; did you mean 'mlflow'?"),
        ({"tensorboard": {"log_dir": "x"}}, "tracking.tensorboard: unknown setting 'log_dir'"),
        ({"mlflow": {"tracking_uri": 3}}, "tracking.mlflow.tracking_uri must be a str, got int 3"),
        ({"mlflow": "sqlite:///x.db"}, "tracking.mlflow must be a mapping of settings"),
        (["mlflow"], "tracking must be a mapping"),
    ],
)
def test_bad_tracking_settings_exit_2_naming_the_key(tmp_path, capsys, tracking, says):
    code, err = _exit_code(tmp_path, tracking, capsys)
    assert code == 2 and says in err and "Traceback" not in err


@pytest.mark.parametrize("backend", ["mlflow", "tensorboard"])
def test_a_backend_not_installed_exits_2_with_the_install_command(tmp_path, capsys, monkeypatch, backend):
    from einspace.search.tracking import TRACKERS

    monkeypatch.setattr(TRACKERS.get(backend), "package", "einspace_no_such_package")
    code, err = _exit_code(tmp_path, {backend: {}}, capsys)
    assert code == 2
    assert f"tracking.{backend} needs the 'einspace_no_such_package' package" in err
    assert f"pip install 'einspace[{backend}]'" in err

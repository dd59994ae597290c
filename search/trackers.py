"""The built-in tracking backends: MLflow (a local SQLite store by default, no server) and
TensorBoard (event files written with torch's SummaryWriter). Their packages are imported only when
a run uses them (optional extras `einspace[mlflow]`, `einspace[tensorboard]`)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from einspace.search.store import Record
from einspace.search.tracking import (
    Tracker,
    evaluation_fields,
    evaluation_numbers,
    flat_config,
    register_tracker,
)

#: MLflow's limits per log_batch call and on a parameter's value
_MLFLOW_PARAMS_PER_BATCH = 100
_MLFLOW_PARAM_LENGTH = 6000


def _local(setting: str, directory: Path) -> Path:
    """A path setting: absolute, or relative to the run directory."""
    path = Path(setting).expanduser()
    return (path if path.is_absolute() else directory / path).resolve()


@register_tracker
class MLflowTracker(Tracker):
    """One MLflow run per einspace run, resumed with it (its id is kept in the store). The store is
    `tracking_uri`, by default the SQLite database `mlflow.db` in the run directory (MLflow refuses
    a `file:` store unless MLFLOW_ALLOW_FILE_STORE=true is set); artifacts go to
    `artifact_location` when the MLflow experiment is created. Each
    evaluation logs its numbers as metrics at step = its id, and its tree, origin, parents, fidelity
    and status as the artifact `evaluations/<id>.json`; the run's config is logged as parameters."""

    name = "mlflow"
    package = "mlflow"
    extra = "mlflow"
    SETTINGS = {
        # an MLflow URI (sqlite:///..., file:..., http://...); "": sqlite:///RUN_DIR/mlflow.db
        "tracking_uri": (str, ""),
        # where a new MLflow experiment keeps artifacts: a folder (relative: to the run directory)
        "artifact_location": (str, "mlflow-artifacts"),
        "experiment_name": (str, ""),  # "" : the einspace experiment's name
        "run_name": (str, ""),  # "" : the einspace experiment's name
    }

    def start(self, config: dict[str, Any]) -> None:
        from mlflow.entities import Param, RunTag
        from mlflow.exceptions import MlflowException
        from mlflow.tracking import MlflowClient

        uri = self.settings["tracking_uri"] or f"sqlite:///{_local('mlflow.db', self.directory)}"
        self.client = MlflowClient(tracking_uri=uri)
        kept = json.loads(self.store.get_meta("tracking.mlflow") or "{}")
        self.run_id = kept.get("run_id") if kept.get("uri") == uri else None
        if self.run_id is not None:
            try:
                self.client.update_run(self.run_id, status="RUNNING")
                return
            except MlflowException:  # deleted since: start another
                self.run_id = None
        name = self.settings["experiment_name"] or self.run_name
        found = self.client.get_experiment_by_name(name)
        if found is not None:
            experiment_id = found.experiment_id
        else:
            artifacts = _local(self.settings["artifact_location"], self.directory).as_uri()
            experiment_id = self.client.create_experiment(name, artifact_location=artifacts)
        run = self.client.create_run(
            experiment_id,
            run_name=self.settings["run_name"] or self.run_name,
            tags={"einspace.run_dir": str(self.directory.resolve())},
        )
        self.run_id = run.info.run_id
        params = [Param(k, v[:_MLFLOW_PARAM_LENGTH]) for k, v in sorted(flat_config(config).items())]
        for i in range(0, len(params), _MLFLOW_PARAMS_PER_BATCH):
            self.client.log_batch(self.run_id, params=params[i : i + _MLFLOW_PARAMS_PER_BATCH])
        self.client.log_batch(self.run_id, tags=[RunTag("einspace.experiment", config.get("name") or "")])
        self.store.set_meta("tracking.mlflow", json.dumps({"uri": uri, "run_id": self.run_id}))

    def evaluation(self, record: Record, best: Record | None, compute_total: float) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        numbers = evaluation_numbers(record, best, compute_total)
        metrics = [Metric(key, value, now, record.id) for key, value in numbers.items()]
        self.client.log_batch(self.run_id, metrics=metrics)
        self.client.log_dict(self.run_id, evaluation_fields(record), f"evaluations/{record.id:06d}.json")

    def close(self, finished: bool) -> None:
        self.client.set_terminated(self.run_id, "FINISHED" if finished else "KILLED")


@register_tracker
class TensorBoardTracker(Tracker):
    """Event files in `logdir`: each evaluation's numbers as scalars at step = its id, its tree,
    origin, parents, fidelity and status as the text `evaluation`; the run's config as the text
    `run/config`, once. A resumed run appends a new event file to the same folder."""

    name = "tensorboard"
    package = "tensorboard"
    extra = "tensorboard"
    SETTINGS = {"logdir": (str, "tensorboard")}  # relative: inside the run directory

    def start(self, config: dict[str, Any]) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.logdir = _local(self.settings["logdir"], self.directory)
        self.writer = SummaryWriter(log_dir=str(self.logdir))
        if self.store.get_meta("tracking.tensorboard") != str(self.logdir):
            text = json.dumps(config, indent=2, sort_keys=True)
            self.writer.add_text("run/config", f"```\n{text}\n```", 0)
            self.store.set_meta("tracking.tensorboard", str(self.logdir))

    def evaluation(self, record: Record, best: Record | None, compute_total: float) -> None:
        for key, value in evaluation_numbers(record, best, compute_total).items():
            self.writer.add_scalar(key, value, record.id)
        self.writer.add_text("evaluation", json.dumps(evaluation_fields(record), sort_keys=True), record.id)

    def close(self, finished: bool) -> None:
        self.writer.close()

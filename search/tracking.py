"""Experiment tracking: every committed evaluation, and the run, logged to the trackers people
already use (MLflow, TensorBoard), as the experiment's `tracking` section asks.

    tracking:
      mlflow: {tracking_uri: mlruns, experiment_name: my-search}   # a local file store, no server
      tensorboard: {logdir: tb}

Each backend is a `Tracker` registered by name, and an optional extra (`einspace[mlflow]`,
`einspace[tensorboard]`); a backend whose package is missing is refused before the search starts,
with the install command. The search loop calls `Trackers.committed` right after a result is
committed to the store, once per record, so a resumed run (which replays committed results from
the store) logs nothing twice. A crash between the commit and the log loses that one log line.
"""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, ClassVar

from einspace.errors import EinspaceError
from einspace.registry import Registry, check_setting_names
from einspace.search.compute import compute_of, incumbent
from einspace.search.store import Record, Status, Store

__all__ = ["TRACKERS", "Tracker", "Trackers", "check_tracking", "register_tracker", "tracking_available"]


class Tracker:
    """One tracking backend. `settings` are the experiment's `tracking.<name>` mapping, checked
    against `SETTINGS`; `store` holds what the tracker keeps between sessions (its meta keys)."""

    name: ClassVar[str]
    package: ClassVar[str]  # the module its backend needs
    extra: ClassVar[str]  # the einspace extra that installs it
    #: setting -> (type, default); a relative path setting resolves against the run directory
    SETTINGS: ClassVar[dict[str, tuple[type, Any]]] = {}

    def __init__(self, settings: Mapping[str, Any], run_name: str, directory: Path, store: Store):
        self.settings = {key: settings.get(key, default) for key, (_, default) in self.SETTINGS.items()}
        self.run_name, self.directory, self.store = run_name, directory, store

    def start(self, config: dict[str, Any]) -> None:
        """The run begins (or resumes): log its config once per run."""

    def evaluation(self, record: Record, best: Record | None, compute_total: float) -> None:
        """Log one committed evaluation, the incumbent after it and the compute spent so far."""
        raise NotImplementedError

    def close(self, finished: bool) -> None:
        """Flush and release what the tracker holds; `finished`: the search is done (else stopped,
        to be resumed)."""


#: Tracking backends by name (the experiment's `tracking` keys).
TRACKERS: Registry[type[Tracker]] = Registry("tracker", builtins=("einspace.search.trackers",))


def register_tracker(cls: type[Tracker]) -> type[Tracker]:
    """Class decorator: make a tracking backend available by its `name`."""
    return TRACKERS.register(cls)


def check_tracking(tracking: Any, source: str) -> None:
    """The `tracking` section's backends and settings (names and types), not whether they are
    installed (`tracking_available`)."""
    for name, settings in tracking.items():
        key = f"tracking.{name}"
        try:
            cls = TRACKERS.get(name)
        except EinspaceError as exc:
            raise _config_error(f"{source}: {key}: {exc}") from None
        if settings is None:
            settings = tracking[name] = {}
        if not isinstance(settings, dict):
            raise _config_error(f"{source}: {key} must be a mapping of settings, got {settings!r}")
        try:
            check_setting_names(f"tracker {name!r}", settings, list(cls.SETTINGS))
        except EinspaceError as exc:
            raise _config_error(f"{source}: {key}: {exc}") from None
        for setting, value in settings.items():
            kind = cls.SETTINGS[setting][0]
            if not isinstance(value, kind) or isinstance(value, bool):
                got = f"{type(value).__name__} {value!r}"
                raise _config_error(f"{source}: {key}.{setting} must be a {kind.__name__}, got {got}")


def tracking_available(tracking: Mapping[str, Any], source: str) -> None:
    """Refuse a backend whose package is not installed, naming the key and the install command."""
    for name in tracking:
        cls = TRACKERS.get(name)
        if importlib.util.find_spec(cls.package) is None:
            raise _config_error(
                f"{source}: tracking.{name} needs the {cls.package!r} package, which is not installed: "
                f"pip install 'einspace[{cls.extra}]'"
            )


def _config_error(message: str) -> EinspaceError:
    from einspace.search.config import ConfigError

    return ConfigError(message)


class Trackers:
    """The run's trackers together, with the incumbent and compute total they are told about,
    counted from the store's history when a session begins."""

    def __init__(self, trackers: list[Tracker], history: Iterable[Record]):
        self.trackers = trackers
        history = list(history)
        self.best = incumbent(history)
        self.compute = sum(map(compute_of, history))

    @classmethod
    def of(cls, experiment: Any, directory: Path, store: Store) -> Trackers | None:
        """The experiment's trackers, started (None when it asks for none)."""
        if not experiment.tracking:
            return None
        tracking_available(experiment.tracking, experiment.source)
        trackers = [
            TRACKERS.get(name)(settings or {}, experiment.name, directory, store)
            for name, settings in sorted(experiment.tracking.items())
        ]
        config = experiment.to_dict()
        for tracker in trackers:
            tracker.start(config)
        return cls(trackers, store.history())

    def committed(self, record: Record) -> None:
        """A record was just committed to the store: log it to every tracker."""
        self.compute += compute_of(record)
        self.best = incumbent([self.best, record] if self.best is not None else [record])
        for tracker in self.trackers:
            tracker.evaluation(record, self.best, self.compute)

    def close(self, finished: bool) -> None:
        for tracker in self.trackers:
            tracker.close(finished)


def evaluation_fields(record: Record) -> dict[str, Any]:
    """What is logged of an evaluation besides its numbers: its tree and where it came from."""
    return {
        "id": record.id,
        "tree": record.tree,
        "hash": record.hash,
        "origin": record.origin,
        "parents": list(record.parents),
        "fidelity": record.fidelity,
        "status": record.status,
        "error": record.error,
        "cached_from": record.cached_from,
    }


def evaluation_numbers(record: Record, best: Record | None, compute_total: float) -> dict[str, float]:
    """The numbers logged for an evaluation (at step = its id): fitness, compute, its evaluator's
    metrics under `metric/`, and the run's incumbent and compute so far under `run/`."""
    numbers: dict[str, float] = {"compute_seconds": compute_of(record), "seconds": record.seconds or 0.0}
    if record.fitness is not None:
        numbers["fitness"] = float(record.fitness)
    if record.fidelity is not None:
        numbers["fidelity"] = float(record.fidelity)
    numbers["failed"] = float(record.status == Status.FAILED)
    for key, value in sorted((record.metrics or {}).items()):
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            numbers[f"metric/{key}"] = float(value)
    if best is not None and best.fitness is not None:
        numbers["run/best_fitness"] = float(best.fitness)
    numbers["run/compute_seconds"] = compute_total
    return numbers


def flat_config(config: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    """A nested config as `a.b.c -> JSON text` pairs (trackers' parameters are flat strings)."""
    out: dict[str, str] = {}
    for key, value in config.items():
        if isinstance(value, Mapping) and value:
            out.update(flat_config(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value if isinstance(value, str) else json.dumps(value)
    return out

"""Experiment files (YAML): what to search, how to evaluate, where to run; strict, errors name the key."""

from __future__ import annotations

import copy
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from einspace.errors import EinspaceError

__all__ = ["ConfigError", "Experiment", "load_experiment", "parse_experiment"]

_REQUIRED = object()
_NUMBER = (int, float)

#: key -> (allowed types, default); a nested dict is a section. `None` in the types allows null.
_SPEC: dict[str, Any] = {
    "name": ((str, None), None),
    "run_dir": ((str, None), None),
    "random_seed": ((int,), 0),
    "grammar": ((str,), "einspace"),
    "sampling": ((str,), "paper"),  # sampling mode (einspace.sampling): paper | exact
    "allow_inconsistent": ((bool,), False),  # search a grammar with rho >= 1 all the same
    "input": {"shape": ((list,), _REQUIRED), "mode": ((str, None), None)},
    "limits": {
        "max_depth": ((int,), 40),
        "max_nodes": ((int,), 2000),
        "min_depth": ((int,), 0),
        "max_params": ((int, None), None),
        "max_steps": ((int,), 20_000),
        "max_attempts": ((int,), 100),
    },
    "evaluator": {"name": ((str,), _REQUIRED), "settings": ((dict,), {})},
    "strategy": {"name": ((str,), "regularised_evolution"), "settings": ((dict,), {})},
    "seeds": ((list,), []),
    "plugins": ((list,), []),
    "executor": {
        "kind": ((str,), "ray"),
        "max_in_flight": ((int,), 1),
        "num_cpus": (_NUMBER, 1),
        "num_gpus": (_NUMBER, 0),
        "timeout_s": ((*_NUMBER, None), None),
        "fresh_process": ((bool, None), None),
        "local_cpus": ((int, None), None),
        "packing": ((str,), "fixed"),  # fixed: num_gpus each; memory: a share from the tree's memory
        "gpu_memory_gb": ((*_NUMBER, None), None),  # memory packing: the GPUs' size (None: ask one)
    },
}

#: Sections that may change between a run and its resumption (resources, not the experiment).
_RESUMABLE_CHANGES = ("executor", "run_dir", "name")


class ConfigError(EinspaceError):
    """An experiment file that cannot be used; the message names the file and the key."""


def _type_name(types: tuple) -> str:
    names = {
        int: "an integer",
        float: "a number",
        str: "a string",
        list: "a list",
        dict: "a mapping",
        bool: "true or false",
        None: "null",
    }
    if set(types) >= {int, float}:
        types = tuple(t for t in types if t is not int)
    return " or ".join(names[t] for t in types)


def _check(data: Any, spec: dict[str, Any], where: str, source: str) -> dict[str, Any]:
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: {where or 'the file'} must be a mapping, got {type(data).__name__}")
    unknown = sorted(set(data) - set(spec))
    if unknown:
        raise ConfigError(f"{source}: unknown key {where + unknown[0]!r} (known: {', '.join(spec)})")
    out: dict[str, Any] = {}
    for key, rule in spec.items():
        path = where + key
        if isinstance(rule, dict):
            out[key] = _check(
                data.get(key, {}) if data.get(key) is not None else {}, rule, path + ".", source
            )
            continue
        types, default = rule
        if key not in data:
            if default is _REQUIRED:
                raise ConfigError(f"{source}: missing key {path!r}")
            out[key] = copy.deepcopy(default)
            continue
        value = data[key]
        allowed = tuple(type(None) if t is None else t for t in types)
        if (isinstance(value, bool) and bool not in types) or not isinstance(value, allowed):
            raise ConfigError(
                f"{source}: {path} must be {_type_name(types)}, got {type(value).__name__} {value!r}"
            )
        out[key] = value
    return out


@dataclass(frozen=True)
class Experiment:
    """A checked experiment: `data` holds every key with defaults filled in; `base` is the
    directory relative paths (grammar, seeds, plugins) were resolved against."""

    data: dict[str, Any]
    source: str = "<experiment>"

    def __getitem__(self, key: str) -> Any:
        return self.data[key]

    @property
    def run_dir(self) -> Path:
        return Path(self.data["run_dir"] or Path("runs") / self.data["name"])

    def identity(self) -> dict[str, Any]:
        """What must not change when a run is resumed: everything but the executor, names and the
        number of evaluations (raising it extends a finished search), plus the *content* of the
        grammar files and plugin files, so that editing one in place counts as a change."""
        data = {k: v for k, v in self.data.items() if k not in _RESUMABLE_CHANGES}
        settings = {k: v for k, v in data["strategy"]["settings"].items() if k != "evaluations"}
        data["strategy"] = {**data["strategy"], "settings": settings}
        data["grammar_content"] = grammar_digest(self.data["grammar"])
        data["plugin_content"] = {p: _file_digest(Path(p)) for p in self.data["plugins"] if p.endswith(".py")}
        return data

    def to_json(self) -> str:
        return json.dumps(self.data, sort_keys=True)

    def space(self):  # noqa: ANN201 - SearchSpace, imported lazily to keep config import light
        from einspace.bundled import load
        from einspace.sampler import Limits
        from einspace.search.strategy import SearchSpace
        from einspace.seeds import load_seed
        from einspace.state import input_state
        from einspace.tree import to_text

        grammar = load(self.data["grammar"])
        state = input_state(tuple(self.data["input"]["shape"]), self.data["input"]["mode"])
        limits = Limits(**self.data["limits"])
        seeds = [(Path(s).stem, to_text(load_seed(s, grammar, state))) for s in self.data["seeds"]]
        return SearchSpace(grammar, state, limits, seeds, self.data["sampling"])

    def check_evaluator(self) -> None:
        """The evaluator's own check of the task (e.g. its dataset against the input), as a
        ConfigError: run once before a search so that a problem every evaluation would hit stops
        it with one message."""
        from einspace.evaluators.base import get_evaluator
        from einspace.state import input_state

        e, i = self.data["evaluator"], self.data["input"]
        try:
            get_evaluator(e["name"], e["settings"]).check(input_state(tuple(i["shape"]), i["mode"]))
        except EinspaceError as exc:
            raise ConfigError(f"{self.source}: evaluator {e['name']!r}: {exc}") from None

    def strategy(self, space: Any = None):  # noqa: ANN201 - Strategy
        from einspace.search.strategy import get_strategy

        s = self.data["strategy"]
        return get_strategy(s["name"], space or self.space(), self.data["random_seed"], s["settings"])

    def task(self, tree: str):  # noqa: ANN201 - Task
        from einspace.evaluators.base import Task

        e = self.data["evaluator"]
        i = self.data["input"]
        return Task(
            tree,
            self.data["grammar"],
            tuple(i["shape"]),
            e["name"],
            e["settings"],
            i["mode"],
            self.data["random_seed"],
        )

    def executor(self, address: str | None = None):  # noqa: ANN201 - Executor
        from einspace.search.executors import InProcessExecutor, RayExecutor

        x = self.data["executor"]
        if x["kind"] == "in_process":
            return InProcessExecutor(x["max_in_flight"], self.data["plugins"])
        return RayExecutor(
            x["max_in_flight"],
            x["num_cpus"],
            x["num_gpus"],
            x["timeout_s"],
            address,
            x["fresh_process"],
            self.data["plugins"],
            x["local_cpus"],
            packing=x["packing"],
            gpu_memory_gb=x["gpu_memory_gb"],
        )


def grammar_digest(grammar: str) -> str:
    """SHA-256 over the text of every file a grammar is composed of (paths left out, so that a
    run can move with its files), or of the name alone when it cannot be loaded."""
    from einspace.bundled import load

    try:
        loaded = load(grammar)
    except EinspaceError:
        return hashlib.sha256(grammar.encode()).hexdigest()
    digest = hashlib.sha256()
    for file_digest in sorted(_file_digest(Path(f)) for f in loaded.files):
        digest.update(file_digest.encode())
    return digest.hexdigest()


def _file_digest(path: Path) -> str:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return "missing"


def _resolve(value: str, base: Path) -> str:
    """A relative path that exists next to the experiment file wins over a bundled name."""
    candidate = base / value
    return str(candidate.resolve()) if not Path(value).is_absolute() and candidate.is_file() else value


def parse_experiment(raw: Any, source: str = "<experiment>", base: Path | None = None) -> Experiment:
    """Check a parsed YAML document and everything it names (grammar, seeds, evaluator, strategy)."""
    from einspace.evaluators.base import get_evaluator
    from einspace.grammar.analysis import require_consistent
    from einspace.search.executors import load_plugins

    data = _check(raw, _SPEC, "", source)
    base = base or Path.cwd()
    data["name"] = data["name"] or (Path(source).stem if source != "<experiment>" else "experiment")
    data["grammar"] = _resolve(data["grammar"], base)
    for key in ("seeds", "plugins"):
        for i, item in enumerate(data[key]):
            if not isinstance(item, str):
                raise ConfigError(
                    f"{source}: {key}[{i}] must be a string, got {type(item).__name__} {item!r}"
                )
        data[key] = [_resolve(item, base) for item in data[key]]
    shape = data["input"]["shape"]
    if not shape or not all(isinstance(d, int) and not isinstance(d, bool) and d > 0 for d in shape):
        raise ConfigError(f"{source}: input.shape must be a list of positive integers, got {shape!r}")
    if data["input"]["mode"] not in (None, "im", "col"):
        raise ConfigError(f"{source}: input.mode must be 'im' or 'col', got {data['input']['mode']!r}")
    from einspace.sampling import SAMPLING_MODES

    if data["sampling"] not in SAMPLING_MODES:
        known = " or ".join(repr(m) for m in SAMPLING_MODES)
        raise ConfigError(f"{source}: sampling must be {known}, got {data['sampling']!r}")
    x = data["executor"]
    if x["kind"] not in ("ray", "in_process"):
        raise ConfigError(f"{source}: executor.kind must be 'ray' or 'in_process', got {x['kind']!r}")
    for key in ("max_in_flight", "num_cpus", "num_gpus", "timeout_s"):
        if x[key] is not None and (x[key] < 0 or (key in ("max_in_flight", "timeout_s") and x[key] <= 0)):
            raise ConfigError(f"{source}: executor.{key} must be positive, got {x[key]!r}")
    if x["packing"] not in ("fixed", "memory") or (x["packing"] == "memory" and not x["num_gpus"]):
        raise ConfigError(
            f"{source}: executor.packing must be 'fixed' or 'memory' (with num_gpus > 0, the largest "
            f"share), got {x['packing']!r} with num_gpus {x['num_gpus']!r}"
        )
    experiment = Experiment(data, source)
    try:
        load_plugins(data["plugins"])
        get_evaluator(data["evaluator"]["name"], data["evaluator"]["settings"])
        space = experiment.space()
        require_consistent(space.grammar, space.input.mode, data["allow_inconsistent"])
        experiment.strategy(space)
    except ConfigError:
        raise
    except EinspaceError as exc:
        raise ConfigError(f"{source}: {exc}") from None
    return experiment


def load_experiment(path: str | Path) -> Experiment:
    """Read and check an experiment file."""
    import yaml

    path = Path(path)
    try:
        raw = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise ConfigError(f"cannot read experiment file {str(path)!r}: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from None
    return parse_experiment(raw if raw is not None else {}, str(path), path.parent)

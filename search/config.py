"""Experiment files (YAML): what to search, how to evaluate, where to run; strict, errors name the key.

Each key is written once, as a field of `Experiment` or of one of its sections: its annotation
says which YAML values it takes and its default what an absent key means (no default: required).
A file is checked against that (`_spec`), then against what it names (grammar, seeds, plugins,
evaluator, strategy), and becomes an `Experiment` of frozen sections read by attribute.
"""

from __future__ import annotations

import copy
import hashlib
import json
import types
from collections.abc import Collection
from dataclasses import MISSING, Field, asdict, dataclass, field, fields, is_dataclass, replace
from functools import cache
from pathlib import Path
from typing import Any, Union, get_args, get_origin, get_type_hints

from einspace.bundled import bundled_files, bundled_grammars, names_bundled
from einspace.errors import EinspaceError, UnknownNameError
from einspace.sampling import Limits
from einspace.search.multi_objective import MultiObjectiveSection, check_multi_objective, check_strategy
from einspace.state import FeatureState, input_state

__all__ = [
    "ConfigError",
    "EvaluatorSection",
    "ExecutorSection",
    "Experiment",
    "InputSection",
    "MultiFidelitySection",
    "StrategySection",
    "load_experiment",
    "parse_experiment",
]

_REQUIRED = object()
#: Field metadata of a key that a file may leave out or set to null, though an experiment always
#: has a value: `parse_experiment` fills it in.
_FILLED_IN = {"filled_in": True}


#: Sections that may change between a run and its resumption (resources, not the experiment).
_RESUMABLE_CHANGES = ("executor", "run_dir", "name", "tracking")


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
    """`data` against `spec`: no unknown keys, every value of its types, defaults filled in."""
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: {where or 'the file'} must be a mapping, got {type(data).__name__}")
    unknown = sorted(set(data) - set(spec))
    if unknown:
        raise ConfigError(f"{source}: unknown key {where + unknown[0]!r} (known: {', '.join(spec)})")
    return {key: _check_key(data, key, rule, where + key, source) for key, rule in spec.items()}


def _check_key(data: dict[str, Any], key: str, rule: Any, path: str, source: str) -> Any:
    if isinstance(rule, dict):  # a section; null is an empty one
        return _check({} if data.get(key) is None else data[key], rule, path + ".", source)
    types, default = rule
    if key not in data:
        if default is _REQUIRED:
            raise ConfigError(f"{source}: missing key {path!r}")
        return copy.deepcopy(default)
    value = data[key]
    allowed = tuple(type(None) if t is None else t for t in types)
    if (isinstance(value, bool) and bool not in types) or not isinstance(value, allowed):
        got = f"{type(value).__name__} {value!r}"
        raise ConfigError(f"{source}: {path} must be {_type_name(types)}, got {got}")
    return value


def _keys(cls: type) -> list[Field]:
    """The fields of a section that are experiment keys (those that say what the experiment is)."""
    return [f for f in fields(cls) if f.compare]


def _members(hint: Any) -> tuple[Any, ...]:
    """The types of an annotation: those of a union, or the one."""
    return get_args(hint) if get_origin(hint) in (Union, types.UnionType) else (hint,)


#: What a field of a type takes in a file, where it differs from the type: any number, a list.
_IN_FILES: dict[Any, tuple] = {float: (int, float), tuple: (list,)}


def _yaml_types(hint: Any) -> tuple:
    """The values a field's annotation accepts in a file, in `_check`'s terms (None: null)."""
    bases = [get_origin(m) or m for m in _members(hint)]
    found = [t for base in bases if base is not type(None) for t in _IN_FILES.get(base, (base,))]
    return (*found, None) if type(None) in bases else tuple(found)


def _rule(key: Field, hint: Any) -> tuple[tuple, Any]:
    """(the values a key takes in a file, its default) from its field."""
    allowed = _yaml_types(hint)
    if key.metadata.get("filled_in"):
        return (*allowed, None), None
    if key.default is not MISSING:
        return allowed, list(key.default) if isinstance(key.default, tuple) else key.default
    return allowed, key.default_factory() if key.default_factory is not MISSING else _REQUIRED


def _section_spec(cls: type) -> dict[str, Any]:
    """The keys of a section, from its fields: key -> (allowed types, default), or a nested dict
    for a section. `None` in the types allows null."""
    hints = get_type_hints(cls)
    return {
        key.name: _spec(hints[key.name]) if is_dataclass(hints[key.name]) else _rule(key, hints[key.name])
        for key in _keys(cls)
    }


# cached by wrapping, not by decorating: mutmut (scripts/mutation.py) skips decorated functions
_spec = cache(_section_spec)


def _build(cls: type, data: dict[str, Any]) -> Any:
    """A section from checked data: its sections built in turn, lists made tuples."""
    hints, values = get_type_hints(cls), {}
    for key in _keys(cls):
        hint, value = hints[key.name], data[key.name]
        if is_dataclass(hint):
            value = _build(hint, value)
        elif isinstance(value, list) and any(get_origin(m) is tuple for m in _members(hint)):
            value = tuple(value)
        values[key.name] = value
    return cls(**values)


@dataclass(frozen=True)
class InputSection:
    """The network input: its shape without the batch, and its mode (None: from the rank)."""

    shape: tuple[int, ...]
    mode: str | None = None

    def state(self) -> FeatureState:
        return input_state(self.shape, self.mode)


@dataclass(frozen=True)
class EvaluatorSection:
    """A registered evaluator and its settings (its keyword arguments)."""

    name: str
    settings: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class StrategySection:
    """A registered strategy and its settings (its keyword arguments, `evaluations` among them)."""

    name: str = "regularised_evolution"
    settings: dict[str, Any] = field(default_factory=dict)

    def with_evaluations(self, evaluations: int) -> StrategySection:
        """The same strategy with another budget (extending a search changes only this)."""
        return replace(self, settings={**self.settings, "evaluations": evaluations})


@dataclass(frozen=True)
class MultiFidelitySection:
    """Multi-fidelity scheduling (README, "Spending compute where it pays"): `scheduler` none, or
    successive_halving over the rungs. A checked experiment holds the rungs and the promotion
    resolved (from min/max/eta and the evaluator's own fidelity when not given; `continue` where
    the evaluator can), so a run stores what it used."""

    scheduler: str = "none"  # none | successive_halving (einspace.search.successive_halving)
    eta: int | tuple[int, ...] = 3  # the best 1/eta of each rung is promoted (or one per rung below the top)
    window: int | None = None  # ...of its last `window` results (None: of all, as ASHA)
    min_fidelity: int = 1  # the lowest rung (epochs, for the training evaluator; 0: untrained)
    max_fidelity: int | None = None  # the top rung; None: the evaluator's own (its epochs)
    rungs: tuple[int, ...] | None = None  # explicit increasing fidelities, instead of min/max/eta
    #: continue (from the lower rung's trained state) | retrain (from scratch); None: continue
    #: where the evaluator can
    promotion: str | None = None
    #: what the strategy hears: lowest_rung | highest_rung (einspace.search.successive_halving)
    strategy_fitness: str = "lowest_rung"

    def _enabled(self) -> bool:
        return self.scheduler != "none"

    def _continues(self) -> bool:
        """Whether promotions train on from the lower rung's state (resolved sections only)."""
        return self.enabled and self.promotion == "continue"

    # properties by a call, not a decorator: mutmut (scripts/mutation.py) skips decorated functions
    enabled = property(_enabled)
    continues = property(_continues)

    def resolved(self, evaluator: Any, source: str) -> MultiFidelitySection:
        """The section with its rungs worked out for `evaluator` (an Evaluator instance), or a
        ConfigError naming the key when the evaluator has no fidelity or the rungs exceed it."""
        from einspace.search.successive_halving import default_rungs

        if not self.enabled:
            return self
        if evaluator.fidelity_setting is None:
            raise ConfigError(
                f"{source}: multi_fidelity.scheduler {self.scheduler!r} trains at increasing fidelities, "
                f"but evaluator {evaluator.name!r} has none (the training evaluator's is its epochs)"
            )
        full, setting = evaluator.full_fidelity(), f"evaluator.settings.{evaluator.fidelity_setting}"
        if self.rungs is not None:
            rungs, key = list(self.rungs), "multi_fidelity.rungs"
        else:
            top = self.max_fidelity if self.max_fidelity is not None else full
            rungs, key = default_rungs(self.min_fidelity, top, self.eta), "multi_fidelity.max_fidelity"
        if rungs[-1] > full:
            raise ConfigError(f"{source}: {key}: the top rung {rungs[-1]} is above {setting} ({full})")
        if (problem := evaluator.fidelity_problem(rungs[0])) is not None:
            low = "multi_fidelity.rungs" if self.rungs is not None else "multi_fidelity.min_fidelity"
            raise ConfigError(f"{source}: {low}: the lowest rung is {rungs[0]}, and {problem}")
        if len(rungs) < 2:
            raise ConfigError(
                f"{source}: {key}: min_fidelity {self.min_fidelity} and top rung {rungs[-1]} leave one rung "
                f"{rungs}; successive halving needs two or more (lower min_fidelity or raise {setting})"
            )
        if self.promotion == "continue" and not evaluator.continues:
            raise ConfigError(
                f"{source}: multi_fidelity.promotion 'continue' needs an evaluator that can train on "
                f"from a saved state, and {evaluator.name!r} cannot; use promotion: retrain"
            )
        promotion = self.promotion or ("continue" if evaluator.continues else "retrain")
        return replace(self, rungs=tuple(rungs), max_fidelity=rungs[-1], promotion=promotion)


@dataclass(frozen=True)
class ExecutorSection:
    """Where evaluations run and with which resources (README, "On a pool of GPUs"); these may
    change when a run is resumed."""

    kind: str = "ray"  # ray | in_process
    max_in_flight: int = 1
    num_cpus: float = 1
    num_gpus: float = 0
    timeout_s: float | None = None
    fresh_process: bool | None = None
    local_cpus: int | None = None
    packing: str = "fixed"  # fixed: num_gpus each; memory: a share from the tree's memory
    gpu_memory_gb: float | None = None  # memory packing: the GPUs' size (None: ask one)


@dataclass(frozen=True, kw_only=True)
class Experiment:
    """A checked experiment file with every key filled in (the fields below and their sections'
    are the keys, their defaults what an absent key means); relative paths (grammar, seeds,
    plugins) are resolved against the file's directory. `source` names the file in messages (it
    is not part of what the experiment is, so not a key). `to_dict()` is the file as plain data:
    the form a run stores and compares."""

    name: str = field(metadata=_FILLED_IN)  # a file without one is named after the file
    run_dir: str | None = None
    random_seed: int = 0
    grammar: str = "einspace"
    sampling: str = "paper"  # sampling mode (einspace.sampling): paper | exact
    allow_inconsistent: bool = False  # search a grammar with rho >= 1 all the same
    input: InputSection
    limits: Limits
    evaluator: EvaluatorSection
    strategy: StrategySection
    seeds: tuple[str, ...] = ()
    plugins: tuple[str, ...] = ()
    warm_start: tuple[str, ...] = ()  # run directories whose results start the surrogate (search.warm_start)
    multi_fidelity: MultiFidelitySection
    multi_objective: MultiObjectiveSection  # several objectives and limits (search.multi_objective)
    executor: ExecutorSection
    tracking: dict[str, Any] = field(default_factory=dict)  # backend -> settings (search.tracking)
    source: str = field(default="<experiment>", compare=False)

    @classmethod
    def from_dict(cls, data: dict[str, Any], source: str = "<experiment>") -> Experiment:
        """An experiment from data `_check` has passed (every key present)."""
        return replace(_build(cls, data), source=source)

    @classmethod
    def from_json(cls, text: str, source: str) -> Experiment:
        """An experiment as a run stored it (`to_json`); keys added to the format since are
        filled with their defaults."""
        return cls.from_dict(_check(json.loads(text), _spec(cls), "", source), source)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        del data["source"]
        return json.loads(json.dumps(data))  # plain JSON types: tuples become lists

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    def _directory(self) -> Path:
        """The run directory: `run_dir`, or runs/<name>."""
        return Path(self.run_dir or Path("runs") / self.name)

    directory = property(_directory)  # not decorated: mutmut (scripts/mutation.py) skips those

    def identity(self) -> dict[str, Any]:
        """What must not change when a run is resumed: everything but the executor, names and the
        number of evaluations (raising it extends a finished search), plus the *content* of the
        grammar files and plugin files, so that editing one in place counts as a change."""
        data = {k: v for k, v in self.to_dict().items() if k not in _RESUMABLE_CHANGES}
        data["strategy"]["settings"].pop("evaluations", None)
        data["grammar_content"] = grammar_digest(self.grammar)
        data["plugin_content"] = {p: _file_digest(Path(p)) for p in self.plugins if p.endswith(".py")}
        return data

    def space(self):  # noqa: ANN201 - SearchSpace, imported lazily to keep config import light
        """What the strategy draws from, made once per experiment: the grammar loaded and the seeds
        read and fitted to the input at the first call."""
        if "_space" not in self.__dict__:
            self.__dict__["_space"] = self._space()  # frozen: the cache goes round __setattr__
        return self.__dict__["_space"]

    def _space(self):  # noqa: ANN202 - SearchSpace
        from einspace.grammar.parser import load_grammar
        from einspace.search.strategy import SearchSpace
        from einspace.seeds import load_seed
        from einspace.tree import to_text

        grammar = load_grammar(self.grammar)
        state = self.input.state()
        seeds = [(Path(s).stem, to_text(load_seed(s, grammar, state))) for s in self.seeds]
        return SearchSpace(grammar, state, self.limits, seeds, self.sampling)

    def check_evaluator(self) -> None:
        """The evaluator's own check of the task (e.g. its dataset against the input), as a
        ConfigError: run once before a search so that a problem every evaluation would hit stops
        it with one message."""
        from einspace.evaluators.base import get_evaluator

        try:
            get_evaluator(self.evaluator.name, self.evaluator.settings).check(self.input.state())
        except EinspaceError as exc:
            raise ConfigError(f"{self.source}: evaluator {self.evaluator.name!r}: {exc}") from None

    def check_executor(self) -> None:
        """What the executor section asks of this machine, before a search: the in-process
        executor cannot give an evaluation a GPU share the machine lacks (Ray refuses it too)."""
        x = self.executor
        if x.kind == "in_process" and x.num_gpus > 0:
            import torch

            if not torch.cuda.is_available():
                raise ConfigError(
                    f"{self.source}: executor.num_gpus is {x.num_gpus}, but this machine has no GPU for the "
                    "in-process executor; set num_gpus: 0, or run where there is one"
                )

    def check_tracking(self) -> None:
        """The tracking backends' packages, before a search: a missing one is a ConfigError naming
        the key and the install command."""
        from einspace.search.tracking import tracking_available

        tracking_available(self.tracking, self.source)

    def make_strategy(self, space: Any = None):  # noqa: ANN201 - Strategy
        """The strategy, inside the multi-fidelity scheduler when one is on (its rungs resolved)."""
        from einspace.search.strategy import get_strategy
        from einspace.search.successive_halving import SuccessiveHalving

        s, m = self.strategy, self.multi_fidelity
        strategy = get_strategy(s.name, space or self.space(), self.random_seed, s.settings)
        if not m.enabled:
            return strategy
        if m.rungs is None:
            raise EinspaceError("the multi_fidelity rungs are not resolved: check the experiment first")
        return SuccessiveHalving(strategy, m.rungs, m.eta, m.strategy_fitness, m.window)

    def task(  # noqa: ANN201 - Task
        self, tree: str, fidelity: int | None = None, continuation: Any = None, inheritance: Any = None
    ):
        """The evaluation of `tree` at `fidelity`, a rung of a multi-fidelity search (a
        `Continuation`: going on from a saved state; an `Inheritance`: starting from a parent's
        weights)."""
        from einspace.evaluators.base import Task

        top = self.multi_fidelity.max_fidelity if fidelity is not None else None
        return Task(
            tree=tree,
            grammar=self.grammar,
            input_shape=self.input.shape,
            evaluator=self.evaluator.name,
            settings=self.evaluator.settings,
            mode=self.input.mode,
            random_seed=self.random_seed,
            fidelity=fidelity,
            top_fidelity=top,
            continuation=continuation,
            inheritance=inheritance,
        )

    def make_executor(self, address: str | None = None):  # noqa: ANN201 - Executor
        """The executor the `executor` section describes (`address`: a Ray cluster to join)."""
        from einspace.search.executors import InProcessExecutor, RayExecutor

        x = self.executor
        if x.kind == "in_process":
            return InProcessExecutor(x.max_in_flight, self.plugins)
        return RayExecutor(
            max_in_flight=x.max_in_flight,
            num_cpus=x.num_cpus,
            num_gpus=x.num_gpus,
            timeout_s=x.timeout_s,
            address=address,
            fresh_process=x.fresh_process,
            plugins=self.plugins,
            local_cpus=x.local_cpus,
            packing=x.packing,
            gpu_memory_gb=x.gpu_memory_gb,
        )


def grammar_digest(grammar: str) -> str:
    """SHA-256 over the text of every file a grammar is composed of (paths left out, so that a
    run can move with its files), or of the name alone when it cannot be loaded."""
    from einspace.grammar.parser import load_grammar

    try:
        loaded = load_grammar(grammar)
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


def _resolve(value: str, base: Path, bundled: Collection[str] = ()) -> str:
    """A bundled name as it is (the rule of `einspace.bundled.names_bundled`); a relative path that
    exists next to the experiment file, resolved against it; anything else as it is."""
    if names_bundled(value, bundled):
        return value
    candidate = base / value
    return str(candidate.resolve()) if not Path(value).is_absolute() and candidate.is_file() else value


def parse_experiment(raw: Any, source: str = "<experiment>", base: Path | None = None) -> Experiment:
    """Check a parsed YAML document and everything it names (grammar, seeds, evaluator, strategy)."""
    data = _check(raw, _spec(Experiment), "", source)
    data["name"] = data["name"] or (Path(source).stem if source != "<experiment>" else "experiment")
    _resolve_paths(data, base or Path.cwd(), source)
    _check_values(data, source)
    try:
        experiment = _check_references(Experiment.from_dict(data, source))
    except ConfigError:
        raise
    except EinspaceError as exc:
        raise ConfigError(f"{source}: {exc}") from None
    return experiment


def _resolve_paths(data: dict[str, Any], base: Path, source: str) -> None:
    """The grammar, seeds and plugins, relative paths resolved against `base`."""
    data["grammar"] = _resolve(data["grammar"], base, bundled_grammars())
    bundled = {"seeds": bundled_files("seeds", ".tree"), "plugins": {}}
    for key in ("seeds", "plugins"):
        for i, item in enumerate(data[key]):
            if not isinstance(item, str):
                got = f"{type(item).__name__} {item!r}"
                raise ConfigError(f"{source}: {key}[{i}] must be a string, got {got}")
        data[key] = [_resolve(item, base, bundled[key]) for item in data[key]]
    for i, item in enumerate(data["warm_start"]):
        if not isinstance(item, str):
            raise ConfigError(f"{source}: warm_start[{i}] must be a run directory, got {item!r}")
    data["warm_start"] = [str((base / item).resolve()) for item in data["warm_start"]]


def _check_multi_fidelity(m: dict[str, Any], source: str) -> None:
    """The scheduler's name and numbers, before anything is loaded (their fit to the evaluator's
    fidelity is `MultiFidelitySection.resolved`)."""
    from einspace.search.successive_halving import STRATEGY_FITNESS, eta_problem, rungs_problem

    choices = {"scheduler": SCHEDULERS, "promotion": PROMOTIONS, "strategy_fitness": STRATEGY_FITNESS}
    for key, names in choices.items():
        if m[key] not in names and m[key] is not None:  # None: promotion resolved later
            known = " or ".join(repr(name) for name in names)
            raise ConfigError(f"{source}: multi_fidelity.{key} must be {known}, got {m[key]!r}")
    rungs = m["rungs"]
    if rungs is not None and (problem := rungs_problem(rungs)) is not None:
        raise ConfigError(f"{source}: multi_fidelity.rungs must be {problem}, got {rungs!r}")
    if (problem := eta_problem(m["eta"], rungs)) is not None:
        raise ConfigError(f"{source}: multi_fidelity.eta must be {problem}, got {m['eta']!r}")
    most = m["eta"] if isinstance(m["eta"], int) else max(m["eta"])
    for key, least in (("min_fidelity", 0), ("max_fidelity", 1), ("window", most)):
        if m[key] is not None and m[key] < least:
            raise ConfigError(f"{source}: multi_fidelity.{key} must be an integer >= {least}, got {m[key]!r}")
    if rungs is not None and m["max_fidelity"] is not None and m["max_fidelity"] != rungs[-1]:
        raise ConfigError(
            f"{source}: multi_fidelity.max_fidelity {m['max_fidelity']} disagrees with the top of "
            f"multi_fidelity.rungs ({rungs[-1]}); give one of them"
        )


#: The multi-fidelity schedulers an experiment may name.
SCHEDULERS = ("none", "successive_halving")
#: How a promoted tree trains at its next rung: on from its lower rung's state, or from scratch.
PROMOTIONS = ("continue", "retrain")


def _check_values(data: dict[str, Any], source: str) -> None:
    """What types alone do not say: the input's shape and mode, the sampling mode, the
    multi-fidelity numbers, the executor."""
    from einspace.sampling import SAMPLING_MODES

    shape, mode = data["input"]["shape"], data["input"]["mode"]
    if not shape or not all(isinstance(d, int) and not isinstance(d, bool) and d > 0 for d in shape):
        raise ConfigError(f"{source}: input.shape must be a list of positive integers, got {shape!r}")
    if mode not in (None, "im", "col"):
        raise ConfigError(f"{source}: input.mode must be 'im' or 'col', got {mode!r}")
    if data["sampling"] not in SAMPLING_MODES:
        known = " or ".join(repr(m) for m in SAMPLING_MODES)
        raise ConfigError(f"{source}: sampling must be {known}, got {data['sampling']!r}")
    _check_multi_fidelity(data["multi_fidelity"], source)
    check_multi_objective(data, source)
    x = data["executor"]
    if x["kind"] not in ("ray", "in_process"):
        raise ConfigError(f"{source}: executor.kind must be 'ray' or 'in_process', got {x['kind']!r}")
    for key in ("max_in_flight", "num_cpus", "num_gpus", "timeout_s", "gpu_memory_gb"):
        strict = key in ("max_in_flight", "timeout_s", "gpu_memory_gb")
        if x[key] is not None and (x[key] < 0 or (strict and x[key] <= 0)):
            raise ConfigError(f"{source}: executor.{key} must be positive, got {x[key]!r}")
    if x["packing"] not in ("fixed", "memory") or (x["packing"] == "memory" and not x["num_gpus"]):
        raise ConfigError(
            f"{source}: executor.packing must be 'fixed' or 'memory' (with num_gpus > 0, the largest "
            f"share), got {x['packing']!r} with num_gpus {x['num_gpus']!r}"
        )
    from einspace.search.tracking import check_tracking

    data["tracking"] = data["tracking"] or {}
    check_tracking(data["tracking"], source)


def _check_references(experiment: Experiment) -> Experiment:
    """Load what the experiment names: plugins, evaluator (and the multi-fidelity rungs it
    allows), grammar (consistent), seeds, strategy, warm-start runs. Returns the experiment with
    its rungs resolved."""
    from einspace.evaluators.base import get_evaluator
    from einspace.grammar.analysis import require_consistent
    from einspace.search.executors import load_registries
    from einspace.search.warm_start import check_warm_start

    load_registries(experiment.plugins)
    try:  # its settings are checked here, so a bad one never starts a search whose evaluations all fail
        evaluator = get_evaluator(experiment.evaluator.name, experiment.evaluator.settings)
    except UnknownNameError:
        raise
    except EinspaceError as exc:
        raise ConfigError(f"{experiment.source}: evaluator {experiment.evaluator.name!r}: {exc}") from None
    multi_fidelity = experiment.multi_fidelity.resolved(evaluator, experiment.source)
    experiment = replace(experiment, multi_fidelity=multi_fidelity)
    space = experiment.space()
    require_consistent(space.grammar, space.input, experiment.allow_inconsistent)
    strategy = experiment.make_strategy(space)
    check_strategy(strategy, experiment.multi_objective.enabled, experiment.source)
    check_warm_start(experiment, strategy)
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

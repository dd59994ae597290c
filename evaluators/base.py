"""The evaluator contract: plain data in (tree text + settings), a result out, never an exception.

What crosses a process boundary (a Ray task, a subprocess) is a `Task` and a `Result`: JSON-able
data, never modules or pickled trees. `run_task` is the one entry point executors call; it checks
the tree once and hands the checked tree to the evaluator, and it turns every failure (a tree that
doesn't check, an evaluator that raises, a NaN fitness) into a failed `Result` with its reason, so
a search records it and goes on.
"""

from __future__ import annotations

import math
import time
import traceback
from abc import ABC, abstractmethod
from dataclasses import asdict, dataclass, field
from enum import Enum
from typing import TYPE_CHECKING, Any, ClassVar

from einspace.errors import EinspaceError
from einspace.registry import Registry
from einspace.state import FeatureState

if TYPE_CHECKING:
    from einspace.checker import CheckedTree

#: The fitness of a failed evaluation: worse than any real one (fitness is maximised).
WORST_FITNESS = -math.inf


class EvaluationFailed(EinspaceError):
    """Raised by an evaluator for an expected failure (out of memory, NaN loss, over budget).
    `progress` is how far it got, in the cost keys an evaluator reports (`PROGRESS_METRICS`:
    epochs, steps, gpu_seconds), so that a failure's compute is counted like a success's."""

    def __init__(self, reason: str, progress: dict[str, float] | None = None):
        super().__init__(reason)
        self.progress = dict(progress or {})


#: Metrics an evaluator may report about its own progress; `run_task` copies them into the
#: result's `Cost` (they stay in the metrics too). `partial` (1.0: stopped before the fidelity it
#: was asked for, e.g. by a time budget, with the score reached so far) becomes `Result.partial`.
PROGRESS_METRICS = ("epochs", "steps", "gpu_seconds")


@dataclass(frozen=True)
class Cost:
    """What one evaluation cost. `compute_seconds` is the one number reports add up: GPU seconds
    where a GPU trained, else the process's CPU seconds (all its threads), else wall seconds (an
    evaluation whose worker was killed, where only the executor's clock saw it)."""

    cpu_seconds: float = 0.0
    gpu_seconds: float = 0.0
    wall_seconds: float = 0.0
    epochs: float = 0.0  # trained, fractional when stopped part-way
    steps: int = 0

    @property
    def compute_seconds(self) -> float:
        return Cost.seconds_of(self.cpu_seconds, self.gpu_seconds, self.wall_seconds)

    @property
    def measure(self) -> str:
        """Which seconds `compute_seconds` are: "GPU", "CPU" or "wall"."""
        return Cost.measure_of(self.cpu_seconds, self.gpu_seconds)

    @staticmethod
    def seconds_of(cpu_seconds: float, gpu_seconds: float, wall_seconds: float) -> float:
        """`compute_seconds` of these fields: a report reads them from 100,000 stored costs without
        making a `Cost` of each."""
        return gpu_seconds or cpu_seconds or wall_seconds

    @staticmethod
    def measure_of(cpu_seconds: float, gpu_seconds: float) -> str:
        """`measure` of these fields."""
        return "GPU" if gpu_seconds else "CPU" if cpu_seconds else "wall"

    def to_json(self) -> dict[str, float]:
        return asdict(self)

    @staticmethod
    def from_json(data: dict[str, Any] | None) -> Cost:
        """A cost as stored; keys it does not know (a newer einspace's) are left out."""
        if data is not None and data.keys() == Cost.__dataclass_fields__.keys() and None not in data.values():
            return Cost(**data)  # as `to_json` wrote it (reports read 100,000 of them)
        known = {f: data[f] for f in Cost.__dataclass_fields__ if data and data.get(f) is not None}
        return Cost(**known)

    @staticmethod
    def measured(cpu_seconds: float, wall_seconds: float, progress: dict[str, float]) -> Cost:
        return Cost(
            cpu_seconds=cpu_seconds,
            gpu_seconds=float(progress.get("gpu_seconds", 0.0)),
            wall_seconds=wall_seconds,
            epochs=float(progress.get("epochs", 0.0)),
            steps=int(progress.get("steps", 0)),
        )


@dataclass(frozen=True)
class Continuation:
    """Training that carries on across the rungs of a multi-fidelity search. Every rung follows
    the schedule of `horizon` epochs (the top rung's), so a tree promoted to a higher rung trains
    on from the state its lower rung saved instead of from scratch, and the top rung's result is
    the one an uninterrupted training of `horizon` epochs would give. `save`: where this run's
    final state goes (None: nowhere); `load`: the state to start from (None, or a file that is not
    there: start fresh, with the same schedule)."""

    horizon: int
    save: str | None = None
    load: str | None = None


@dataclass(frozen=True)
class Inheritance:
    """Weight inheritance in evolution (`einspace.evaluators.inheritance`): the child starts from
    the weights in `parent` (a file a parent's run saved; None, or a file that is not there: fresh
    initialisation) wherever the variation left the parent's derivation unchanged, and saves its
    own trained weights to `save` (None: nowhere) for children of its own."""

    parent: str | None = None
    save: str | None = None


@dataclass(frozen=True)
class Task:
    """One evaluation to run: all plain data, so it can be sent to another process or node."""

    tree: str  # bracket text of the derivation tree
    grammar: str  # grammar file path or bundled name
    input_shape: tuple[int, ...]
    evaluator: str  # registered evaluator name
    settings: dict[str, Any] = field(default_factory=dict)
    mode: str | None = None  # input mode; None: from the rank
    random_seed: int = 0
    fidelity: int | None = None  # the evaluator's `fidelity_setting` for this run (None: its own)
    continuation: Continuation | None = None  # only for evaluators that `continues`
    inheritance: Inheritance | None = None  # only for evaluators that `inherits`
    # the top rung's fidelity, when `fidelity` is a rung's (last, so positional tasks keep their meaning)
    top_fidelity: int | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @staticmethod
    def from_json(data: dict[str, Any]) -> Task:
        c, i = data.get("continuation"), data.get("inheritance")
        return Task(
            **{
                **data,
                "input_shape": tuple(data["input_shape"]),
                "continuation": Continuation(**c) if c is not None else None,
                "inheritance": Inheritance(**i) if i is not None else None,
            }
        )


class Status(str, Enum):
    """How an evaluation ended: `ok` (a fitness), `failed` (a reason), or, in a run's store,
    `cached` (a duplicate that reuses an earlier result). The values are the plain words, so
    JSON, the SQLite store and the runs of older einspaces read the same."""

    OK = "ok"
    FAILED = "failed"
    CACHED = "cached"

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class Result:
    """The outcome of a Task. `fitness` is maximised; failed results carry WORST_FITNESS and a
    reason. `partial`: an ok result scored before the task's fidelity was reached (a time budget
    stopped training; `cost.epochs` says where)."""

    status: Status  # ok or failed
    fitness: float
    metrics: dict[str, float] = field(default_factory=dict)
    error: str | None = None
    seconds: float = 0.0
    cost: Cost = field(default_factory=Cost)
    partial: bool = False

    @property
    def ok(self) -> bool:
        return self.status == Status.OK

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @staticmethod
    def from_json(data: dict[str, Any]) -> Result:
        return Result(**{**data, "status": Status(data["status"]), "cost": Cost.from_json(data.get("cost"))})

    @staticmethod
    def failure(reason: str, seconds: float = 0.0, cost: Cost | None = None) -> Result:
        return Result(Status.FAILED, WORST_FITNESS, {}, reason, seconds, cost or Cost(wall_seconds=seconds))


class Evaluator(ABC):
    """Turns a checked tree into metrics, one of which is `fitness` (higher is better).

    Subclasses set `name`, take their settings as keyword arguments in `__init__` (raising
    EinspaceError naming a bad setting), and implement `evaluate`. Expected failures raise
    EvaluationFailed with a reason; anything else is caught by `run_task` too.
    """

    name: ClassVar[str]
    #: The integer setting a task's `fidelity` overrides (multi-fidelity search trains the same tree
    #: at increasing values of it), or None for an evaluator with no notion of fidelity.
    fidelity_setting: ClassVar[str | None] = None
    #: The setting that receives a rung's `Task.top_fidelity` (the top rung's fidelity), so that
    #: the evaluator can refuse a tree that could never be trained at the top; None: not told.
    top_fidelity_setting: ClassVar[str | None] = None
    #: Whether `evaluate_continued` can train on from a saved state (`Continuation`), so that
    #: multi-fidelity search promotes without training again from scratch.
    continues: ClassVar[bool] = False
    #: Whether `evaluate_continued` can start a child from its parent's weights (`Inheritance`).
    inherits: ClassVar[bool] = False

    def full_fidelity(self) -> int | None:
        """The value of `fidelity_setting` in this evaluator's settings: the top fidelity."""
        return None

    def fidelity_problem(self, fidelity: int) -> str | None:
        """Why this evaluator cannot run at `fidelity`, a rung's (None: it can). Fidelity 0 is
        for evaluators that can score an untrained network (the training evaluator's 0 epochs)."""
        return None if fidelity > 0 else f"evaluator {self.name!r} has no fidelity 0"

    def check(self, input: FeatureState) -> None:  # noqa: B027 - optional
        """Raise EinspaceError if no tree could be evaluated for `input` (a dataset that is missing,
        malformed or of another shape): called once before a search, so that a problem every
        evaluation would hit stops it at the start with one clear message."""

    @abstractmethod
    def evaluate(self, checked: CheckedTree, random_seed: int) -> dict[str, float]:
        """Metrics of `checked`, a tree already checked against the task's grammar and input
        (`checked.input[0]`), so it needs no checking again."""

    def evaluate_continued(
        self,
        checked: CheckedTree,
        random_seed: int,
        continuation: Continuation | None,
        inheritance: Inheritance | None = None,
    ) -> dict[str, float]:
        """`evaluate`, going on from a saved state (`continuation`: evaluators that set
        `continues`) or starting from a parent's weights (`inheritance`: evaluators that set
        `inherits`), and saving what they ask for."""
        raise EinspaceError(
            f"evaluator {self.name!r} cannot continue training from a saved state or inherit weights"
        )


#: Every evaluator class by name. The built-in ones register as their modules are imported, on
#: first look-up and not with this module, so that code needing only Task and Result (strategies,
#: stores) never imports torch. Each module declares its names: a plugin evaluator registered, or
#: another looked up, imports neither (both import torch).
EVALUATORS: Registry[type[Evaluator]] = Registry(
    "evaluator",
    builtins={
        "einspace.evaluators.training": ("training",),
        "einspace.evaluators.proxies": ("grad_norm", "naswot", "synflow"),
    },
)


def register_evaluator(cls: type[Evaluator]) -> type[Evaluator]:
    """Class decorator: make an evaluator available by its `name` (a duplicate is an error)."""
    return EVALUATORS.register(cls)


def get_evaluator(name: str, settings: dict[str, Any] | None = None) -> Evaluator:
    """An evaluator instance by registered name, built from its settings; an unknown name or
    setting is an error naming it."""
    return EVALUATORS.create(name, settings)


def list_evaluators() -> list[str]:
    return EVALUATORS.names()


def task_settings(task: Task) -> dict[str, Any]:
    """The evaluator settings of a task, its fidelity (if any) in the evaluator's fidelity setting
    and the top rung's in its top-fidelity setting (where it has one)."""
    if task.fidelity is None:
        return dict(task.settings)
    cls = EVALUATORS.get(task.evaluator)
    if cls.fidelity_setting is None:
        raise EinspaceError(f"evaluator {task.evaluator!r} has no fidelity to set to {task.fidelity}")
    top = {}
    if cls.top_fidelity_setting is not None and task.top_fidelity is not None:
        top = {cls.top_fidelity_setting: task.top_fidelity}
    return {**task.settings, cls.fidelity_setting: task.fidelity, **top}


class _Meter:
    """The wall and process CPU time since it was made, as a `Cost` with an evaluator's progress."""

    def __init__(self) -> None:
        self.wall, self.cpu = time.perf_counter(), time.process_time()

    def cost(self, progress: dict[str, float]) -> Cost:
        return Cost.measured(time.process_time() - self.cpu, time.perf_counter() - self.wall, progress)

    def failure(self, reason: str, progress: dict[str, float] | None = None) -> Result:
        cost = self.cost(progress or {})
        return Result.failure(reason, cost.wall_seconds, cost)


def run_task(task: Task) -> Result:
    """Evaluate a task; every failure becomes a failed Result with its reason and its cost (never raises)."""
    from einspace.checker import check_tree
    from einspace.grammar.parser import load_grammar
    from einspace.state import input_state
    from einspace.tree import parse_tree

    meter = _Meter()
    try:
        grammar = load_grammar(task.grammar)
        state = input_state(task.input_shape, task.mode)
        checked = check_tree(parse_tree(task.tree), grammar, state)
        evaluator = get_evaluator(task.evaluator, task_settings(task))
        if task.continuation is None and task.inheritance is None:
            metrics = evaluator.evaluate(checked, task.random_seed)
        else:
            metrics = evaluator.evaluate_continued(
                checked, task.random_seed, task.continuation, task.inheritance
            )
        fitness = float(metrics["fitness"])
    except EvaluationFailed as exc:
        return meter.failure(str(exc), exc.progress)
    except EinspaceError as exc:
        return meter.failure(str(exc))
    except Exception as exc:  # noqa: BLE001 - an evaluation must never take the search down
        detail = "".join(traceback.format_exception_only(type(exc), exc)).strip()
        return meter.failure(f"evaluator crashed: {detail}")
    clean = {k: float(v) for k, v in metrics.items()}
    partial = bool(clean.pop("partial", 0.0))
    progress = {k: clean[k] for k in PROGRESS_METRICS if k in clean}
    if not math.isfinite(fitness):
        return meter.failure(f"fitness is {fitness}", progress)
    cost = meter.cost(progress)
    return Result(Status.OK, fitness, clean, None, cost.wall_seconds, cost, partial)

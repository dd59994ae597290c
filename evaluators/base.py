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
from typing import TYPE_CHECKING, Any, ClassVar

from einspace.errors import EinspaceError
from einspace.registry import Registry
from einspace.state import FeatureState

if TYPE_CHECKING:
    from einspace.checker import CheckedTree

#: The fitness of a failed evaluation: worse than any real one (fitness is maximised).
WORST_FITNESS = -math.inf


class EvaluationFailed(EinspaceError):
    """Raised by an evaluator for an expected failure (out of memory, NaN loss, over budget)."""


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

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @staticmethod
    def from_json(data: dict[str, Any]) -> Task:
        return Task(**{**data, "input_shape": tuple(data["input_shape"])})


@dataclass(frozen=True)
class Result:
    """The outcome of a Task. `fitness` is maximised; failed results carry WORST_FITNESS and a reason."""

    status: str  # "ok" or "failed"
    fitness: float
    metrics: dict[str, float] = field(default_factory=dict)
    error: str | None = None
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @staticmethod
    def from_json(data: dict[str, Any]) -> Result:
        return Result(**data)

    @staticmethod
    def failure(reason: str, seconds: float = 0.0) -> Result:
        return Result("failed", WORST_FITNESS, {}, reason, seconds)


class Evaluator(ABC):
    """Turns a checked tree into metrics, one of which is `fitness` (higher is better).

    Subclasses set `name`, take their settings as keyword arguments in `__init__` (raising
    EinspaceError naming a bad setting), and implement `evaluate`. Expected failures raise
    EvaluationFailed with a reason; anything else is caught by `run_task` too.
    """

    name: ClassVar[str]

    def check(self, input: FeatureState) -> None:  # noqa: B027 - optional
        """Raise EinspaceError if no tree could be evaluated for `input` (a dataset that is missing,
        malformed or of another shape): called once before a search, so that a problem every
        evaluation would hit stops it at the start with one clear message."""

    @abstractmethod
    def evaluate(self, checked: CheckedTree, random_seed: int) -> dict[str, float]:
        """Metrics of `checked`, a tree already checked against the task's grammar and input
        (`checked.input[0]`), so it needs no checking again."""


#: Every evaluator class by name. The built-in ones register as their modules are imported, on
#: first look-up and not with this module, so that code needing only Task and Result (strategies,
#: stores) never imports torch.
EVALUATORS: Registry[type[Evaluator]] = Registry(
    "evaluator", builtins=("einspace.evaluators.training", "einspace.evaluators.proxies")
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


def run_task(task: Task) -> Result:
    """Evaluate a task; every failure becomes a failed Result with its reason (never raises)."""
    from einspace.bundled import load
    from einspace.checker import check_tree
    from einspace.state import input_state
    from einspace.tree import parse_tree

    started = time.perf_counter()
    try:
        grammar = load(task.grammar)
        state = input_state(task.input_shape, task.mode)
        checked = check_tree(parse_tree(task.tree), grammar, state)
        evaluator = get_evaluator(task.evaluator, task.settings)
        metrics = evaluator.evaluate(checked, task.random_seed)
        fitness = float(metrics["fitness"])
    except EinspaceError as exc:
        return Result.failure(str(exc), time.perf_counter() - started)
    except Exception as exc:  # noqa: BLE001 - an evaluation must never take the search down
        detail = "".join(traceback.format_exception_only(type(exc), exc)).strip()
        return Result.failure(f"evaluator crashed: {detail}", time.perf_counter() - started)
    if not math.isfinite(fitness):
        return Result.failure(f"fitness is {fitness}", time.perf_counter() - started)
    clean = {k: float(v) for k, v in metrics.items()}
    return Result("ok", fitness, clean, None, time.perf_counter() - started)

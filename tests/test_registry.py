"""The three registries (operations, strategies, evaluators) behave alike: one table of cases drives them."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from einspace.errors import EinspaceError, UnknownNameError, UnknownOperationError
from einspace.evaluators.base import EVALUATORS, Evaluator, get_evaluator, list_evaluators, register_evaluator
from einspace.ops.registry import OPERATIONS, Group, Operation, get_op, list_ops, register_op
from einspace.registry import Registry
from einspace.search.strategy import STRATEGIES, Strategy, get_strategy, list_strategies, register_strategy
from einspace.search.tracking import TRACKERS, Tracker, register_tracker


@dataclass(frozen=True)
class Case:
    """One registry and its public names: module, lookup, listing, decorator, a fresh entry."""

    kind: str
    registry: Registry[Any]
    location: str  # module.attribute of the registry; importing the module imports no built-in one
    lookup: Callable[[str], Any]
    listing: Callable[[], list[str]]
    register: Callable[[type], type]
    entry: Callable[[str], type]  # a new registrable class with that name
    builtin: str  # a built-in name
    typo: str  # a misspelling of it


def _operation(name: str) -> type:
    return type("Temporary", (Operation,), {"name": name, "group": Group.COMPUTATION})


def _strategy(name: str) -> type:
    return type("Temporary", (Strategy,), {"name": name, "_propose": lambda self: None})


def _evaluator(name: str) -> type:
    return type("Temporary", (Evaluator,), {"name": name, "evaluate": lambda self, *args: {"fitness": 0.0}})


def _tracker(name: str) -> type:
    return type("Temporary", (Tracker,), {"name": name, "evaluation": lambda self, *args: None})


CASES = [
    Case(
        "operation",
        OPERATIONS,
        "einspace.ops.registry.OPERATIONS",
        get_op,
        list_ops,
        register_op,
        _operation,
        "linear",
        "linaer",
    ),
    Case(
        "strategy",
        STRATEGIES,
        "einspace.search.strategy.STRATEGIES",
        lambda name: get_strategy(name, None),  # type: ignore[arg-type]  # the name fails first
        list_strategies,
        register_strategy,
        _strategy,
        "random_search",
        "random_serch",
    ),
    Case(
        "evaluator",
        EVALUATORS,
        "einspace.evaluators.base.EVALUATORS",
        get_evaluator,
        list_evaluators,
        register_evaluator,
        _evaluator,
        "training",
        "trainig",
    ),
    Case(
        "tracker",
        TRACKERS,
        "einspace.search.tracking.TRACKERS",
        TRACKERS.get,
        TRACKERS.names,
        register_tracker,
        _tracker,
        "tensorboard",
        "tensorbord",
    ),
]
IDS = [case.kind for case in CASES]


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_an_unknown_name_suggests_the_close_one(case: Case) -> None:
    with pytest.raises(UnknownNameError) as error:
        case.lookup(case.typo)
    assert str(error.value) == f"unknown {case.kind} {case.typo!r}; did you mean {case.builtin!r}?"


def test_operations_keep_their_own_error_type() -> None:
    with pytest.raises(UnknownOperationError):
        get_op("linaer")


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_an_unknown_name_without_a_close_one_lists_the_names_when_few(case: Case) -> None:
    with pytest.raises(UnknownNameError) as error:
        case.lookup("zzz_nothing_like_it")
    names = case.registry.names()
    listed = f" (registered: {', '.join(names)})" if len(names) <= 12 else ""
    assert str(error.value) == f"unknown {case.kind} 'zzz_nothing_like_it'{listed}"


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_listing_is_sorted_and_filters_by_pattern(case: Case) -> None:
    names = case.listing()
    assert case.builtin in names and names == sorted(names) == case.registry.names()
    prefix = case.builtin[:4]
    assert case.registry.names(f"{prefix}*") == [n for n in names if n.startswith(prefix)]
    assert case.builtin in case.registry and "zzz_nothing_like_it" not in case.registry


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_a_duplicate_name_is_refused_and_unregister_frees_it(case: Case) -> None:
    name = f"test_twice_{case.kind}"
    case.register(case.entry(name))
    try:
        assert case.registry.get(name).name == name
        with pytest.raises(EinspaceError, match=f"{case.kind} '{name}' is already registered"):
            case.register(case.entry(name))
        with pytest.raises(EinspaceError, match=f"{case.kind} '{case.builtin}' is already registered"):
            case.register(case.entry(case.builtin))
    finally:
        case.registry.unregister(name)
    assert name not in case.registry


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_an_entry_without_a_name_is_refused(case: Case) -> None:
    with pytest.raises(
        EinspaceError, match=f"Temporary must set a string `name` to be a registered {case.kind}"
    ):
        case.register(case.entry(""))


def test_a_builtin_name_is_refused_even_before_the_builtins_are_loaded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    registry: Registry[type] = Registry("thing", builtins=("test_registry_builtin_things",))
    monkeypatch.setitem(sys.modules, "test_registry_home", SimpleNamespace(registry=registry))
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "test_registry_builtin_things.py").write_text(
        "from test_registry_home import registry\n\n@registry.register\nclass Builtin:\n    name = 'wheel'\n"
    )

    class Mine:
        name = "wheel"

    try:
        with pytest.raises(EinspaceError, match="thing 'wheel' is already registered"):
            registry.register(Mine)
        assert registry.get("wheel").__module__ == "test_registry_builtin_things"
    finally:
        sys.modules.pop("test_registry_builtin_things", None)


@pytest.fixture(scope="module")
def imported_builtins() -> dict[str, list[bool]]:
    """For each registry, in a fresh interpreter: is any built-in module imported with the registry's
    module, and are all of them imported once the names are listed?"""
    code = "import importlib, json, sys\nseen = {}\n"
    for case in CASES:
        builtins = list(case.registry.builtins)
        module, _, attribute = case.location.rpartition(".")
        code += (
            f"registry = importlib.import_module({module!r}).{attribute}\n"
            f"before = any(m in sys.modules for m in {builtins!r})\n"
            "registry.names()\n"
            f"seen[{case.kind!r}] = [before, all(m in sys.modules for m in {builtins!r})]\n"
        )
    code += "print(json.dumps(seen))\n"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return json.loads(result.stdout)


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_builtins_are_imported_on_first_use_not_with_the_registry(
    case: Case, imported_builtins: dict[str, list[bool]]
) -> None:
    assert case.registry.builtins
    assert imported_builtins[case.kind] == [False, True]


@pytest.mark.parametrize(
    "case", [c for c in CASES if None not in c.registry.builtins.values()], ids=lambda c: c.kind
)
def test_declared_builtin_names_are_the_names_each_module_registers(case: Case) -> None:
    """A look-up, or a plugin's registration, imports only the module declaring the name: a stale
    declaration would hide a built-in (or let a plugin take its name)."""
    case.registry.names()  # every built-in module imported
    for module, declared in case.registry.builtins.items():
        entries = case.registry._entries.items()
        registered = {n for n, e in entries if getattr(e, "__module__", None) == module}
        assert registered == set(declared), module


def test_a_plugin_evaluator_imports_no_builtin_evaluator_nor_torch() -> None:
    """Registering an evaluator of another name imports none of the built-in evaluators' modules
    (they import torch: seconds at every start of a search with an instant plugin evaluator);
    taking a built-in's name imports the module declaring it and is refused there."""
    code = (
        "import sys\n"
        "from einspace.errors import EinspaceError\n"
        "from einspace.evaluators.base import EVALUATORS, Evaluator, register_evaluator\n"
        "register_evaluator(type('Mine', (Evaluator,), {'name': 'mine', 'evaluate': None}))\n"
        "print(sorted(m for m in (*EVALUATORS.builtins, 'torch') if m in sys.modules))\n"
        "try:\n"
        "    register_evaluator(type('Mine', (Evaluator,), {'name': 'naswot', 'evaluate': None}))\n"
        "except EinspaceError as exc:\n"
        "    print(exc)\n"
        "print(sorted(m for m in EVALUATORS.builtins if m in sys.modules))\n"
    )
    lines = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert lines.splitlines()[0] == "[]"
    assert "evaluator 'naswot' is already registered" in lines.splitlines()[1]
    assert lines.splitlines()[2] == "['einspace.evaluators.proxies']"


def test_a_builtin_module_that_fails_to_import_is_tried_again() -> None:
    registry: Registry[int] = Registry("thing", builtins=("einspace_no_such_module",))
    for _ in range(2):
        with pytest.raises(ModuleNotFoundError):
            registry.names()


# ---------------------------------------------------------------- building a strategy or evaluator


def _make_strategy(name: str, settings: dict[str, Any]) -> Any:
    return get_strategy(name, None, 0, settings)  # type: ignore[arg-type]  # never gets that far


@pytest.mark.parametrize(
    "kind, build, name, typo, meant",
    [
        ("strategy", _make_strategy, "random_search", "evaluatons", "evaluations"),  # by its signature
        ("evaluator", get_evaluator, "training", "epoch", "epochs"),  # by its settings dataclass
    ],
    ids=["strategy", "evaluator"],
)
def test_an_unknown_setting_is_named_alike(
    kind: str, build: Callable[..., Any], name: str, typo: str, meant: str
) -> None:
    with pytest.raises(EinspaceError) as error:
        build(name, {typo: 3})
    assert str(error.value) == f"unknown setting {typo!r} for {kind} {name!r}; did you mean {meant!r}?"


def test_what_the_caller_passes_is_not_a_setting() -> None:
    with pytest.raises(EinspaceError, match="'random_seed' is not a setting of strategy 'random_search'"):
        _make_strategy("random_search", {"random_seed": 1})


class _BuggyStrategy(Strategy):
    name = "test_buggy_strategy"

    def __init__(self, space: Any, random_seed: int = 0, width: int = 1):
        self.width = len(width)  # type: ignore[arg-type]  # the bug: a TypeError inside the constructor

    def _propose(self) -> None:
        return None


class _BuggyEvaluator(Evaluator):
    name = "test_buggy_evaluator"

    def __init__(self, width: int = 1):
        self.width = len(width)  # type: ignore[arg-type]  # the bug

    def evaluate(self, *args: Any) -> dict[str, float]:
        return {"fitness": 0.0}


@pytest.mark.parametrize(
    "registry, cls, build",
    [
        (STRATEGIES, _BuggyStrategy, lambda settings: _make_strategy("test_buggy_strategy", settings)),
        (EVALUATORS, _BuggyEvaluator, lambda settings: get_evaluator("test_buggy_evaluator", settings)),
    ],
    ids=["strategy", "evaluator"],
)
def test_a_type_error_inside_a_constructor_is_not_a_settings_error(
    registry: Registry[Any], cls: type, build: Callable[[dict[str, Any]], Any]
) -> None:
    registry.register(cls)
    try:
        with pytest.raises(TypeError, match="has no len"):
            build({"width": 2})  # a setting the class takes, with a good value
    finally:
        registry.unregister(cls.name)

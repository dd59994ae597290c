"""Shared set-up for the search tests: a small experiment over the bundled grammar with a cheap evaluator."""

from __future__ import annotations

import copy
import json
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from einspace.search.config import Experiment, parse_experiment
from einspace.search.loop import SearchRun

PLUGIN = str(Path(__file__).with_name("search_plugins.py"))
#: Counts grammar parses in each process (parse_counter.py).
PARSE_COUNTER = str(Path(__file__).with_name("parse_counter.py"))

BASE: dict[str, Any] = {
    "random_seed": 3,
    "grammar": "einspace",
    "input": {"shape": [3, 16, 16]},
    "limits": {"max_depth": 12, "max_nodes": 80},
    "evaluator": {"name": "test_params"},
    "strategy": {
        "name": "regularised_evolution",
        "settings": {"evaluations": 40, "population": 10, "tournament": 3},
    },
    "plugins": [PLUGIN],
    "executor": {"kind": "in_process"},
}


#: RE with a surrogate that screens 4 proposals per child once 10 results are in (the
#: surrogate's tests, and the warm start that feeds it).
SCREENED: dict[str, Any] = {
    "name": "regularised_evolution",
    "settings": {
        "evaluations": 24,
        "population": 6,
        "tournament": 3,
        "screen": 4,
        "surrogate_min_results": 10,
    },
}


def merge(base: dict[str, Any], changes: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for key, value in changes.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = value
    return out


def experiment(run_dir: Path, strategy: dict[str, Any] | None = None, **changes: Any) -> Experiment:
    """The base experiment with `changes` merged in (nested mappings merge key by key); a
    `strategy` given here replaces the base one whole (other strategies take other settings)."""
    raw = merge(BASE, {"run_dir": str(run_dir), **changes})
    if strategy is not None:
        raw["strategy"] = (
            strategy
            if "settings" not in strategy or "name" in strategy
            else merge(BASE["strategy"], strategy)
        )
    return parse_experiment(raw, "test.yaml")


def run_to_the_end(e: Experiment, stop_after: int | None = None) -> tuple[list[tuple[str, str]], Any]:
    """Run `e` until it finishes -- first killed after `stop_after` results and resumed, where
    given: the (tree, origin) of every record, and the strategy at the end."""
    if stop_after is not None:
        with SearchRun.start(e) as run:
            assert not run.run(e.make_executor(), max_results=stop_after).finished
    with SearchRun.start(e) as run:
        assert run.run(e.make_executor()).finished
        return [(r.tree, r.origin) for r in run.store.history()], run.strategy


def history_key(records: list) -> list[tuple]:
    """What must agree between two runs of the same seed (timings and workers may differ)."""
    return [(r.seq, r.id, r.tree, r.origin, r.parents, r.status, r.fitness, r.cached_from) for r in records]


def where_log(log: Path) -> list[dict]:
    """Every entry the `test_where` evaluator (search_plugins.py) wrote under `log`."""
    return [json.loads(line) for path in log.glob("*.jsonl") for line in path.read_text().splitlines()]


def wait_for(condition: Callable[[], Any], timeout: float, what: str, every: float = 0.05) -> Any:
    """Poll `condition` until it returns something true and return that; fail saying `what` did not
    happen within `timeout` seconds. (A fixed sleep is too short on a busy machine, too long elsewhere.)"""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"{what} did not happen within {timeout} s")
        time.sleep(every)


def finished_count(store: Path) -> int:
    """Finished evaluations in a run's store as another process sees it (0 before it exists)."""
    if not store.exists():
        return 0
    db = sqlite3.connect(store)
    try:
        return db.execute("SELECT COUNT(*) FROM evaluations WHERE state = 'finished'").fetchone()[0]
    except sqlite3.OperationalError:  # not created yet
        return 0
    finally:
        db.close()

"""Search strategies, executors, the run loop and the results store (import as einspace.search).

Strategies (ask/tell, JSON state) never see torch, Ray or the store; executors never know the
strategy; a `SearchRun` (its run loop) is the one place the three meet, and an experiment file
(`load_experiment`) says which of each to use. `einspace search` / `einspace report` are in `cli.py`.
"""

from einspace.search.config import ConfigError, Experiment, load_experiment, parse_experiment
from einspace.search.executors import Executor, Finished, InProcessExecutor, RayExecutor, load_registries
from einspace.search.loop import RunSummary, SearchRun, open_store, run_search
from einspace.search.store import Record, SQLiteStore, Store, StoreError
from einspace.search.strategy import (
    Candidate,
    SearchSpace,
    Strategy,
    get_strategy,
    list_strategies,
    register_strategy,
)

__all__ = [
    "Candidate",
    "ConfigError",
    "Executor",
    "Experiment",
    "Finished",
    "InProcessExecutor",
    "RayExecutor",
    "Record",
    "RunSummary",
    "SQLiteStore",
    "SearchRun",
    "SearchSpace",
    "Store",
    "StoreError",
    "Strategy",
    "get_strategy",
    "list_strategies",
    "load_experiment",
    "load_registries",
    "open_store",
    "parse_experiment",
    "register_strategy",
    "run_search",
]

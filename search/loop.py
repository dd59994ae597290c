"""The run loop: the one place where a strategy, an executor and a store meet.

Order of events for every candidate: ask -> (cache hit? record as cached) -> store it as running
-> submit -> result -> commit to the store -> tell the strategy -> checkpoint the strategy. After a
crash anywhere in that chain, resuming restores the last checkpoint, replays from the store any
result that was committed but not yet told, and re-submits what was still running; because the
strategy's RNG is in its checkpoint it re-asks exactly the candidates it asked before.
"""

from __future__ import annotations

import json
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from einspace.errors import EinspaceError
from einspace.search.config import Experiment
from einspace.search.executors import Executor, Finished
from einspace.search.store import Record, SQLiteStore, Store
from einspace.search.strategy import Candidate, Strategy

__all__ = ["STORE_NAME", "RunSummary", "open_store", "run_search"]

STORE_NAME = "search.sqlite"


@dataclass
class RunSummary:
    """What one call of `run_search` did (this session only; the store has the whole run)."""

    evaluated: int = 0
    cached: int = 0
    replayed: int = 0
    requeued: int = 0
    failed: int = 0
    finished: bool = False
    driver_seconds: float = 0.0  # time in ask/tell/store/checkpoint, not waiting for workers
    wall_seconds: float = 0.0
    best: Record | None = field(default=None, repr=False)


def open_store(experiment: Experiment, run_dir: Path | None = None) -> Store:
    """The run's store; a run directory holding a different experiment is refused."""
    run_dir = Path(run_dir or experiment.run_dir)
    store = SQLiteStore(run_dir / STORE_NAME, writer=True)
    new = experiment.identity()
    previous = store.get_meta("experiment")
    old = json.loads(previous) if previous is not None else new
    changes = identity_changes(old, new)
    if changes:
        store.close()
        raise EinspaceError(
            f"{run_dir} holds a run of a different experiment; changed since it started:\n  "
            + "\n  ".join(changes)
            + "\nuse another run_dir, or undo the change to resume (the executor, name and number of "
            "evaluations may change)"
        )
    store.set_meta("experiment", json.dumps(new, sort_keys=True))
    store.set_meta("config", experiment.to_json())
    return store


def identity_changes(old: dict[str, Any], new: dict[str, Any], prefix: str = "") -> list[str]:
    """`key: old -> new` for each leaf that differs; keys an older store did not record are skipped."""
    changes = []
    for key in sorted(set(old) | set(new)):
        if key not in old:
            continue
        a, b = old[key], new.get(key)
        if isinstance(a, dict) and isinstance(b, dict):
            changes += identity_changes(a, b, f"{prefix}{key}.")
        elif a != b:
            if key == "grammar_content":
                changes.append("the grammar's content: a file it is composed of was edited")
            elif prefix == "plugin_content.":
                changes.append(f"the content of plugin {key}")
            else:
                changes.append(f"{prefix}{key}: {_short(a)} -> {_short(b)}")
    return changes


def _short(value: Any) -> str:
    text = json.dumps(value)
    return text if len(text) <= 60 else text[:57] + "..."


def run_search(
    experiment: Experiment,
    executor: Executor,
    store: Store,
    strategy: Strategy | None = None,
    on_result: Callable[[Record, Strategy], None] | None = None,
    should_stop: Callable[[], bool] | None = None,
    max_results: int | None = None,
) -> RunSummary:
    """Run (or resume) a search until the strategy is done, `should_stop()` is true, or this call
    has finished `max_results` evaluations. The executor is not shut down here (the caller owns it)."""
    started = time.perf_counter()
    summary = RunSummary()
    strategy = strategy or experiment.strategy()
    checkpoint = store.load_checkpoint()
    if checkpoint is not None:
        strategy.load_state_dict(checkpoint)
    queue: deque[Candidate] = deque(strategy.pending())  # asked before the crash, never told
    in_flight: dict[int, tuple[Candidate, str]] = {}
    by_hash: dict[str, int] = {}  # hash of a tree in flight -> its candidate id
    parked: dict[str, list[Candidate]] = {}  # duplicates waiting for that evaluation
    results = 0
    driver = 0.0

    def tell(candidate: Candidate, record: Record) -> None:
        nonlocal results
        strategy.tell(candidate.id, record.fitness if record.fitness is not None else float("-inf"))
        store.save_checkpoint(strategy.state_dict())
        results += 1
        if record.status == "failed":
            summary.failed += 1
        if record.status != "failed" and record.fitness is not None:
            if summary.best is None or record.fitness > (summary.best.fitness or float("-inf")):
                summary.best = record
        if on_result is not None:
            on_result(record, strategy)

    def finish(candidate: Candidate, digest: str, **outcome: Any) -> Record:
        """Commit a candidate's finished record (before the strategy hears of it)."""
        return store.finish(
            Record(candidate.id, candidate.tree, digest, candidate.origin, candidate.parents, **outcome)
        )

    def finish_cached(candidate: Candidate, digest: str, original: Record) -> None:
        record = finish(
            candidate,
            digest,
            status="cached",
            fitness=original.fitness,
            metrics=original.metrics,
            error=original.error,
            cached_from=original.id,
            seconds=0.0,
        )
        summary.cached += 1
        tell(candidate, record)

    def dispatch(candidate: Candidate) -> None:
        existing = store.get(candidate.id)
        digest = candidate.hash
        if existing is not None and existing.hash != digest:
            raise EinspaceError(
                f"candidate {candidate.id} differs from the stored one: the strategy did not resume "
                "deterministically (was the experiment or einspace changed?)"
            )
        if existing is not None and existing.finished:
            summary.replayed += 1  # committed before a crash, never told
            tell(candidate, existing)
            return
        original = store.find_hash(digest)
        if original is not None:
            finish_cached(candidate, digest, original)
            return
        if digest in by_hash:
            parked.setdefault(digest, []).append(candidate)
            return
        if existing is not None:
            summary.requeued += 1
        store.submit(Record(candidate.id, candidate.tree, digest, candidate.origin, candidate.parents))
        executor.submit(candidate.id, experiment.task(candidate.tree))
        in_flight[candidate.id] = (candidate, digest)
        by_hash[digest] = candidate.id

    def complete(done: Finished) -> None:
        candidate, digest = in_flight.pop(done.key)
        del by_hash[digest]
        r = done.result
        record = finish(
            candidate,
            digest,
            status=r.status,
            fitness=r.fitness,
            metrics=r.metrics,
            error=r.error,
            seconds=r.seconds,
            worker=done.worker,
        )
        summary.evaluated += 1
        tell(candidate, record)
        for duplicate in parked.pop(digest, []):
            finish_cached(duplicate, digest, record)

    def stopping() -> bool:
        return (max_results is not None and results >= max_results) or bool(should_stop and should_stop())

    while not stopping():
        t0 = time.perf_counter()
        while len(in_flight) < executor.max_in_flight and not stopping():
            candidate = queue.popleft() if queue else strategy.ask()
            if candidate is None:
                break
            dispatch(candidate)
        driver += time.perf_counter() - t0
        if not in_flight:  # nothing running, nothing to ask: done (or the strategy has nothing left)
            break
        finished = executor.wait(timeout=0.5)
        t0 = time.perf_counter()
        for done in finished:
            complete(done)
        driver += time.perf_counter() - t0
    summary.finished = strategy.done
    summary.driver_seconds = driver
    summary.wall_seconds = time.perf_counter() - started
    return summary

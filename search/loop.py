"""A search run: its directory, and the loop that is the one place a strategy, an executor and a store meet.

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
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

from einspace.errors import EinspaceError
from einspace.plugins import import_plugins, is_loaded
from einspace.search.config import Experiment
from einspace.search.executors import Executor, Finished
from einspace.search.inherited_weights import InheritedWeights
from einspace.search.multi_objective import Objectives
from einspace.search.store import Record, SQLiteStore, Status, Store
from einspace.search.strategy import Candidate, Strategy
from einspace.search.successive_halving import PROMOTION
from einspace.search.tracking import Trackers
from einspace.search.trained_states import TrainedStates
from einspace.search.warm_start import warm_start

if TYPE_CHECKING:
    from einspace.checker import CheckedTree
    from einspace.grammar.model import Grammar
    from einspace.state import FeatureState

__all__ = ["STORE_NAME", "RunSummary", "SearchRun", "open_store", "run_search"]

STORE_NAME = "search.sqlite"

#: Called with each result once the strategy has heard it (progress bars, early stopping).
OnResult = Callable[[Record, Strategy], None]


@dataclass
class RunSummary:
    """What one call of `SearchRun.run` did (this session only; the store has the whole run)."""

    evaluated: int = 0
    cached: int = 0
    replayed: int = 0
    requeued: int = 0
    failed: int = 0
    finished: bool = False
    driver_seconds: float = 0.0  # time in ask/tell/store/checkpoint, not waiting for workers
    wall_seconds: float = 0.0
    best: Record | None = field(default=None, repr=False)

    def _results(self) -> int:
        """Results told to the strategy: evaluated, served from the cache, or replayed."""
        return self.evaluated + self.cached + self.replayed

    results = property(_results)  # not decorated: mutmut (scripts/mutation.py) skips those

    def count(self, record: Record) -> None:
        """Note a told result's failure, or whether it is the best yet."""
        if record.status == Status.FAILED:
            self.failed += 1
        elif record.fitness is not None and (
            self.best is None or record.fitness > (self.best.fitness or float("-inf"))
        ):
            self.best = record


class SearchRun:
    """A run directory: its store, the experiment it holds, and the search that extends it.

    `SearchRun.start(experiment)` opens the directory for writing (a new run, or one to resume or
    extend) and `run(executor)` searches; `SearchRun.open(run_dir)` reads a run for reports, with
    its plugins loaded. `experiment` is None only for a store whose config cannot be read (written
    by hand, or by a newer einspace); what needs it then raises an EinspaceError saying so. Once
    closed, what does not read the store (experiment, grammar, `check`) still answers.
    """

    def __init__(self, directory: Path, store: Store, experiment: Experiment | None, problem: str = ""):
        self.directory = directory
        self.store = store
        self.experiment = experiment
        self._problem = problem  # why `experiment` is None
        self.unloaded_plugins: tuple[str, ...] = ()  # the run's plugins not imported (see `open`)

    @classmethod
    def start(cls, experiment: Experiment, run_dir: str | Path | None = None) -> SearchRun:
        """Open an experiment's run directory (`run_dir`, else the experiment's) for writing; a
        directory holding a different experiment is refused, with a list of what changed."""
        directory = Path(run_dir or experiment.directory)
        run = cls(directory, SQLiteStore(directory / STORE_NAME, writer=True), experiment)
        try:
            run._claim(experiment)
        except EinspaceError:
            run.close()
            raise
        return run

    @classmethod
    def open(cls, run_dir: str | Path, trust_plugins: bool = False) -> SearchRun:
        """An existing run, read-only (an error if there is no run there). The plugins it was
        searched with are imported only when `trust_plugins` (an error if they no longer load):
        importing runs their code, and a run directory may come from anyone. Those not imported,
        here or before, are listed in `unloaded_plugins`."""
        path = Path(run_dir) / STORE_NAME
        if not path.is_file():
            raise EinspaceError(f"{run_dir} is not a search run directory (no {STORE_NAME} in it)")
        store = SQLiteStore(path)
        try:
            experiment, problem = Experiment.from_json(store.get_meta("config") or "{}", str(path)), ""
        except EinspaceError as exc:
            experiment, problem = None, str(exc)
        plugins = experiment.plugins if experiment else ()  # the run's operations and evaluators
        if trust_plugins:
            try:
                import_plugins(plugins)
            except EinspaceError as exc:
                store.close()
                raise EinspaceError(
                    f"{run_dir} was searched with plugins that no longer load: {exc}"
                ) from None
        run = cls(Path(run_dir), store, experiment, problem)
        run.unloaded_plugins = tuple(p for p in plugins if not is_loaded(p))
        return run

    def _claim(self, experiment: Experiment) -> None:
        """Refuse a store of another experiment; record this one's identity and config."""
        new = experiment.identity()
        previous = self.store.get_meta("experiment")
        changes = identity_changes(json.loads(previous), new) if previous is not None else []
        if changes:
            raise EinspaceError(
                f"{self.directory} holds a run of a different experiment; changed since it started:\n  "
                + "\n  ".join(changes)
                + "\nuse another run_dir, or undo the change to resume (the executor, name and number of "
                "evaluations may change)"
            )
        budget = experiment.strategy.settings.get("evaluations")
        finished = self.store.count_finished(excluding_origin=PROMOTION)  # as the budget counts
        if isinstance(budget, int) and budget < finished:
            raise EinspaceError(
                f"{self.directory} has finished {finished} evaluations, more than the {budget} asked for: "
                f"a run cannot shrink; ask for {finished} or more, or use another run_dir"
            )
        self.store.set_meta("experiment", json.dumps(new, sort_keys=True))
        self.store.set_meta("config", experiment.to_json())

    def close(self) -> None:
        self.store.close()

    def __enter__(self) -> SearchRun:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---------------------------------------------------------------- what the run holds
    def _known(self) -> Experiment:
        if self.experiment is None:
            raise EinspaceError(
                f"the experiment of the run in {self.directory} cannot be read: {self._problem}"
            )
        return self.experiment

    def _strategy(self) -> Strategy:
        """The run's strategy as of its last checkpoint (a fresh one for a new run)."""
        strategy = self._known().make_strategy()
        checkpoint = self.store.load_checkpoint()
        if checkpoint is not None:
            strategy.load_state_dict(checkpoint)
        elif self._known().warm_start:
            warm_start(strategy, self._known())
        return strategy

    def _grammar(self) -> Grammar:
        from einspace.grammar.parser import load_grammar

        with self._plugin_hint():
            return load_grammar(self._known().grammar)

    def _input(self) -> FeatureState:
        return self._known().input.state()

    # by calls, not decorators: mutmut (scripts/mutation.py) skips decorated functions
    strategy = cached_property(_strategy)
    grammar = cached_property(_grammar)
    input = property(_input)

    def check(self, tree: str) -> CheckedTree:
        """A stored tree checked against the run's grammar and input (EinspaceError if it can't be)."""
        from einspace.checker import check_tree
        from einspace.tree import parse_tree

        return check_tree(parse_tree(tree), self.grammar, self.input)

    def plugin_note(self) -> str:
        """A sentence on the run's plugins left unloaded, and how to load them ("" if none)."""
        if not self.unloaded_plugins:
            return ""
        return (
            f"the run was searched with plugins not loaded here ({', '.join(self.unloaded_plugins)}); "
            "importing them runs their code: pass --trust-plugins to import them, or --plugin for the ones "
            "you choose"
        )

    def _plugin_hint_steps(self) -> Iterator[None]:
        """An error that unloaded plugins may explain says so."""
        try:
            yield
        except EinspaceError as exc:
            if not self.unloaded_plugins:
                raise
            raise EinspaceError(f"{exc}\n({self.plugin_note()})") from None

    _plugin_hint = contextmanager(_plugin_hint_steps)  # not decorated: mutmut skips those

    # ---------------------------------------------------------------- the search
    def run(
        self,
        executor: Executor,
        on_result: OnResult | None = None,
        should_stop: Callable[[], bool] | None = None,
        max_results: int | None = None,
    ) -> RunSummary:
        """Search (or resume) until the strategy is done, `should_stop()` is true, or this call has
        finished `max_results` evaluations. The executor is not shut down here (the caller owns it)."""
        return _Session(self, executor, on_result, should_stop, max_results).run()


class _Session:
    """One call of `SearchRun.run`: the candidates in flight, the duplicates waiting for them, and
    the summary. Every result is committed to the store (and logged to the experiment's trackers)
    before the strategy hears of it."""

    def __init__(
        self,
        run: SearchRun,
        executor: Executor,
        on_result: OnResult | None,
        should_stop: Callable[[], bool] | None,
        max_results: int | None,
    ):
        self.store, self.experiment, self.strategy = run.store, run._known(), run.strategy
        self.executor, self.on_result = executor, on_result
        self.should_stop, self.max_results = should_stop, max_results
        self.queue: deque[Candidate] = deque(self.strategy.pending())  # asked before a crash, never told
        self.in_flight: dict[int, Candidate] = {}
        #: (hash, fidelity) of each evaluation in flight -> the duplicates waiting for it
        self.waiting: dict[tuple[str, int | None], list[Candidate]] = {}
        self.summary = RunSummary()
        self.states = TrainedStates.of(run.directory, self.experiment.multi_fidelity, self.strategy)
        self.weights = InheritedWeights.of(run.directory, self.experiment)
        self.hashes: dict[int, str] = {}  # evaluation id -> tree hash, of parents looked up
        self.trackers = Trackers.of(self.experiment, run.directory, self.store)
        space = self.experiment.space()
        self.objectives = Objectives.of(self.experiment.multi_objective, space.grammar, space.input)

    def run(self) -> RunSummary:
        try:
            return self._run()
        finally:
            if self.trackers is not None:
                self.trackers.close(self.strategy.done)

    def _run(self) -> RunSummary:
        started = time.perf_counter()
        while not self._stopping():
            with self._driving():
                self._fill()
            if not self.in_flight:  # nothing running, nothing to ask: done (or the strategy has nothing left)
                break
            finished = self.executor.wait(timeout=0.5)
            with self._driving():
                for done in finished:
                    self._complete(done)
        self.summary.finished = self.strategy.done
        self.summary.wall_seconds = time.perf_counter() - started
        return self.summary

    def _driving_steps(self) -> Iterator[None]:
        """Count the time inside as the driver's own (not waiting for workers)."""
        t0 = time.perf_counter()
        yield
        self.summary.driver_seconds += time.perf_counter() - t0

    _driving = contextmanager(_driving_steps)  # not decorated: mutmut skips those

    def _stopping(self) -> bool:
        if self.max_results is not None and self.summary.results >= self.max_results:
            return True
        return bool(self.should_stop and self.should_stop())

    def _fill(self) -> None:
        """Take candidates (re-queued ones first, then asked) until every in-flight slot is busy,
        or the strategy has nothing to propose yet."""
        while len(self.in_flight) < self.executor.max_in_flight and not self._stopping():
            candidate = self.queue.popleft() if self.queue else self.strategy.ask()
            if candidate is None:
                return
            self._dispatch(candidate)

    def _dispatch(self, candidate: Candidate) -> None:
        """Replay a result the store has, serve a duplicate from the store or have it wait for its
        twin in flight, or submit the candidate for evaluation."""
        existing = self._stored(candidate)
        if existing is not None and existing.finished:
            self.summary.replayed += 1  # committed before a crash, never told
            self._tell(candidate, existing)
        elif (original := self.store.find_hash(*candidate.key)) is not None:
            self._finish_cached(candidate, original)
        elif candidate.key in self.waiting:
            self.waiting[candidate.key].append(candidate)
        else:
            if existing is not None:  # running when the last session stopped
                self.summary.requeued += 1
            refusal = self.objectives.refusal(candidate.tree) if self.objectives is not None else None
            if refusal is None:
                self._submit(candidate)
            else:  # breaks a limit on an analytic quantity: never trained
                self.store.submit(_record(candidate))
                self._tell(candidate, self._commit(_record(candidate, status=Status.FAILED, error=refusal)))

    def _stored(self, candidate: Candidate) -> Record | None:
        """The store's record of the candidate's id, which must be of the same tree."""
        existing = self.store.get(candidate.id)
        if existing is not None and existing.hash != candidate.hash:
            raise EinspaceError(
                f"candidate {candidate.id} differs from the stored one: the strategy did not resume "
                "deterministically (was the experiment or einspace changed?)"
            )
        return existing

    def _submit(self, candidate: Candidate) -> None:
        self.store.submit(_record(candidate))
        continuation = self.states.continuation(candidate) if self.states is not None else None
        inheritance = None
        if self.weights is not None:
            parent = self._hash_of(candidate.parents[0]) if candidate.parents else None
            inheritance = self.weights.inheritance(candidate, parent)
        task = self.experiment.task(candidate.tree, candidate.fidelity, continuation, inheritance)
        self.executor.submit(candidate.id, task)
        self.in_flight[candidate.id] = candidate
        self.waiting[candidate.key] = []

    def _complete(self, done: Finished) -> None:
        """Commit a finished evaluation and tell it, then serve the duplicates that waited for it."""
        candidate = self.in_flight.pop(done.key)
        r = done.result
        outcome = {"fitness": r.fitness, "metrics": r.metrics, "error": r.error, "seconds": r.seconds}
        outcome.update(partial=r.partial, cost=r.cost.to_json())
        outcome.update(worker=done.worker, node=done.node)
        record = self._commit(_record(candidate, status=r.status, **outcome))
        if self.weights is not None and r.metrics.get("weights_saved") == 1.0:
            self.weights.saved(candidate.hash)
        self.summary.evaluated += 1
        self._tell(candidate, record)
        for duplicate in self.waiting.pop(candidate.key):
            self._finish_cached(duplicate, record)

    def _hash_of(self, evaluation: int) -> str | None:
        """The tree hash of an evaluation (None: not in the store)."""
        if evaluation not in self.hashes:
            record = self.store.get(evaluation)
            if record is None:
                return None
            self.hashes[evaluation] = record.hash
        return self.hashes[evaluation]

    def _live_weights(self) -> set[str]:
        """The trees whose weights may still be inherited or are being written: the parents the
        strategy may still choose, what is in flight or queued, and their first parents."""
        live = {self._hash_of(i) for i in self.strategy.live_parents()}
        for candidate in (*self.in_flight.values(), *self.queue):
            live.add(candidate.hash)
            if candidate.parents:
                live.add(self._hash_of(candidate.parents[0]))
        live.discard(None)
        return live  # type: ignore[return-value]

    def _finish_cached(self, candidate: Candidate, original: Record) -> None:
        copy = _record(
            candidate,
            status=Status.CACHED,
            fitness=original.fitness,
            metrics=original.metrics,
            error=original.error,
            cached_from=original.id,
            seconds=0.0,
            partial=original.partial,
        )
        self.summary.cached += 1
        self._tell(candidate, self._commit(copy))

    def _commit(self, record: Record) -> Record:
        """Commit a finished record to the store, then log it to the trackers: the one place a
        result is committed, so a resumed run (which replays committed results) logs none twice."""
        committed = self.store.finish(record)
        if self.trackers is not None:
            self.trackers.committed(committed)
        return committed

    def _tell(self, candidate: Candidate, record: Record) -> None:
        """Tell the strategy a committed result, then checkpoint it."""
        fitness: Any = record.fitness if record.fitness is not None else float("-inf")
        if self.objectives is not None and self.strategy.multi_objective:
            fitness = self.objectives.score(record)
        seconds = record.seconds if record.status == Status.OK else None  # a cached copy cost nothing
        self.strategy.tell(candidate.id, fitness, partial=record.partial, seconds=seconds)
        self.store.save_checkpoint(self.strategy.state_dict())
        if self.states is not None:
            self.states.prune()
        if self.weights is not None:
            self.weights.prune(self._live_weights())
        self.summary.count(record)
        if self.on_result is not None:
            self.on_result(record, self.strategy)


def _record(candidate: Candidate, **outcome: Any) -> Record:
    """The candidate's record: running without an outcome, finished with one."""
    return Record(
        candidate.id,
        candidate.tree,
        candidate.hash,
        candidate.origin,
        candidate.parents,
        fidelity=candidate.fidelity,
        **outcome,
    )


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


def open_store(experiment: Experiment, run_dir: Path | None = None) -> Store:
    """The store of `SearchRun.start(experiment, run_dir)`, for `run_search`."""
    return SearchRun.start(experiment, run_dir).store


def run_search(
    experiment: Experiment,
    executor: Executor,
    store: Store,
    on_result: OnResult | None = None,
    should_stop: Callable[[], bool] | None = None,
    max_results: int | None = None,
) -> RunSummary:
    """`SearchRun.run` over a store from `open_store` (the caller closes it, and the executor)."""
    run = SearchRun(experiment.directory, store, experiment)
    return run.run(executor, on_result, should_stop, max_results)

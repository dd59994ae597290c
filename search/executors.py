"""Executors run `Task`s somewhere (this process, or Ray workers) and hand back `Result`s; they never
know which strategy asked, so any strategy runs on any executor."""

from __future__ import annotations

import importlib
import importlib.util
import os
import socket
import sys
import time
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from hashlib import sha1
from pathlib import Path
from typing import Any

from einspace.errors import EinspaceError
from einspace.evaluators.base import Result, Task, run_task

__all__ = ["Executor", "Finished", "InProcessExecutor", "RayExecutor", "evaluate_in_worker", "load_plugins"]


@dataclass(frozen=True)
class Finished:
    """A finished evaluation: the key it was submitted under, its result, and where it ran."""

    key: int
    result: Result
    worker: str | None = None


class Executor(ABC):
    """Runs up to `max_in_flight` tasks at once. `submit` never blocks; `wait` returns the
    evaluations that finished (possibly none, after `timeout` seconds). Every submitted key comes
    back exactly once, as a success or a failed `Result` with a reason -- never as an exception."""

    max_in_flight: int = 1

    @abstractmethod
    def submit(self, key: int, task: Task) -> None: ...

    @abstractmethod
    def wait(self, timeout: float | None = None) -> list[Finished]: ...

    @property
    @abstractmethod
    def in_flight(self) -> int: ...

    def shutdown(self) -> None:  # noqa: B027 - optional
        """Stop: cancel what is still running (its candidates are re-queued on resume)."""


def load_plugins(plugins: Sequence[str]) -> None:
    """Import user modules (a dotted name or a .py file) that register evaluators or operations;
    run in the driver and in every worker, so a registry is the same everywhere. Idempotent."""
    import einspace.evaluators  # noqa: F401 - the bundled evaluators register themselves on import

    for plugin in plugins:
        if plugin.endswith(".py") or os.sep in plugin:
            path = Path(plugin).resolve()
            name = f"einspace_plugin_{path.stem}_{sha1(str(path).encode()).hexdigest()[:8]}"
            if name in sys.modules:
                continue
            spec = importlib.util.spec_from_file_location(name, path)
            if spec is None or spec.loader is None or not path.is_file():
                raise EinspaceError(f"plugin file {str(path)!r} not found")
            module = importlib.util.module_from_spec(spec)
            sys.modules[name] = module
            try:
                spec.loader.exec_module(module)
            except BaseException:
                del sys.modules[name]
                raise
        else:
            try:
                importlib.import_module(plugin)
            except ModuleNotFoundError as exc:
                raise EinspaceError(f"plugin module {plugin!r} cannot be imported: {exc}") from None


def _worker_name() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def evaluate_in_worker(task: dict[str, Any], plugins: Sequence[str]) -> dict[str, Any]:
    """The body of one Ray task: plain data in, plain data out (no pickled modules cross the wire)."""
    try:
        load_plugins(plugins)
        result = run_task(Task.from_json(task))
    except Exception as exc:  # noqa: BLE001 - a plugin that fails to import is a failed evaluation
        result = Result.failure(f"worker could not start the evaluation: {type(exc).__name__}: {exc}")
    return {"result": result.to_json(), "worker": _worker_name()}


class InProcessExecutor(Executor):
    """Evaluates in the calling process, one task per `wait`, in submission order: for debugging
    and tests. It cannot enforce timeouts or survive an evaluator that kills its process."""

    def __init__(self, max_in_flight: int = 1, plugins: Sequence[str] = ()):
        self.max_in_flight = max_in_flight
        self._queue: deque[tuple[int, Task]] = deque()
        load_plugins(plugins)

    def submit(self, key: int, task: Task) -> None:
        self._queue.append((key, task))

    def wait(self, timeout: float | None = None) -> list[Finished]:
        if not self._queue:
            return []
        key, task = self._queue.popleft()
        return [Finished(key, run_task(task), _worker_name())]

    @property
    def in_flight(self) -> int:
        return len(self._queue)

    def shutdown(self) -> None:
        self._queue.clear()


class _EvaluationWorker:
    """A Ray actor that evaluates tasks; `ready` answers once its process is up (so a timeout
    counts from when an evaluation can start, not from a process start or a queue)."""

    def ready(self) -> str:
        return _worker_name()

    def evaluate(self, task: dict[str, Any], plugins: Sequence[str]) -> dict[str, Any]:
        return evaluate_in_worker(task, plugins)


@dataclass
class _Slot:
    """One worker actor, and when it became ready (None while its process is starting)."""

    actor: Any
    created: float
    ready_at: float | None = None


@dataclass
class _Job:
    key: int
    slot: _Slot
    submitted: float


#: A worker that has not started after this long (say, it asked for a GPU no node has free) fails
#: its evaluation rather than hanging the search.
STARTUP_TIMEOUT_S = 600.0


class RayExecutor(Executor):
    """Evaluations run in Ray worker actors, each holding the configured `num_cpus`/`num_gpus`
    (fractions allowed) so Ray's scheduler places them over a pool of GPUs across nodes. Only
    tree text and settings cross the wire.

    With `fresh_process` (the default whenever GPUs are requested) each evaluation gets its own
    actor, killed when it finishes, so the GPU memory its process held is released. CPU-only
    evaluations reuse up to `max_in_flight` actors by default, which saves a process start (and a
    torch import) per evaluation. A timeout counts from when the evaluation's worker is ready; a
    timed-out worker is killed. A worker or node that dies yields a failed result with the reason,
    a new worker is started for the next evaluation, and the search goes on.
    """

    def __init__(
        self,
        max_in_flight: int = 1,
        num_cpus: float = 1,
        num_gpus: float = 0,
        timeout_s: float | None = None,
        address: str | None = None,
        fresh_process: bool | None = None,
        plugins: Sequence[str] = (),
        local_cpus: int | None = None,
    ):
        import ray

        self._ray = ray
        self.max_in_flight = max_in_flight
        self.timeout_s = timeout_s
        self.plugins = [str(Path(p).resolve()) if p.endswith(".py") else p for p in plugins]
        load_plugins(self.plugins)  # fail fast in the driver rather than in every worker
        self._owns_ray = False
        if not ray.is_initialized():
            if address:
                ray.init(address=address, include_dashboard=False, log_to_driver=False)
            else:
                # address="local": a fresh instance for this run, never a cluster found lying around
                ray.init(address="local", num_cpus=local_cpus, include_dashboard=False, log_to_driver=False)
            self._owns_ray = True
        if num_gpus > 0 and not ray.cluster_resources().get("GPU"):
            if self._owns_ray:
                ray.shutdown()
            raise EinspaceError(f"executor.num_gpus is {num_gpus:g} but the Ray cluster has no GPUs")
        self.fresh = num_gpus > 0 if fresh_process is None else fresh_process
        self._actor_class = ray.remote(_EvaluationWorker).options(
            num_cpus=num_cpus, num_gpus=num_gpus, max_restarts=0, max_task_retries=0
        )
        self._idle: list[_Slot] = []
        self._starting: dict[Any, _Slot] = {}  # ready() ref -> slot
        self._jobs: dict[Any, _Job] = {}  # evaluate() ref -> job

    def start_workers(self, wait: bool = False) -> float:
        """Start the reusable workers now, in parallel, rather than on first use; with `wait`,
        block until they are up. Returns the seconds waited (the start-up a run pays once)."""
        started = time.monotonic()
        if self.fresh:
            return 0.0
        while len(self._idle) < self.max_in_flight - len(self._jobs):
            self._idle.append(self._new_slot())
        if wait and self._starting:
            refs = list(self._starting)
            self._ray.get(refs)
            now = time.monotonic()
            for ref in refs:
                self._starting.pop(ref).ready_at = now
        return time.monotonic() - started

    def _new_slot(self) -> _Slot:
        slot = _Slot(self._actor_class.remote(), time.monotonic())
        self._starting[slot.actor.ready.remote()] = slot
        return slot

    def _retire(self, slot: _Slot, healthy: bool) -> None:
        if healthy and not self.fresh:
            self._idle.append(slot)
        else:
            self._ray.kill(slot.actor, no_restart=True)

    def submit(self, key: int, task: Task) -> None:
        slot = self._idle.pop() if self._idle else self._new_slot()
        ref = slot.actor.evaluate.remote(task.to_json(), self.plugins)
        self._jobs[ref] = _Job(key, slot, time.monotonic())

    @property
    def in_flight(self) -> int:
        return len(self._jobs)

    def _deadline(self, job: _Job) -> float:
        if job.slot.ready_at is None:
            return job.slot.created + STARTUP_TIMEOUT_S
        if self.timeout_s is None:
            return float("inf")
        return max(job.submitted, job.slot.ready_at) + self.timeout_s

    def wait(self, timeout: float | None = None) -> list[Finished]:
        if not self._jobs:
            return []
        ray = self._ray
        slack = max(0.0, min(self._deadline(j) for j in self._jobs.values()) - time.monotonic())
        timeout = slack if timeout is None else min(timeout, slack)
        refs = [*self._jobs, *self._starting]
        ready, _ = ray.wait(refs, num_returns=1, timeout=timeout)
        if ready:
            ready, _ = ray.wait(refs, num_returns=len(refs), timeout=0)
        finished = []
        for ref in ready:
            if ref in self._starting:
                slot = self._starting.pop(ref)
                slot.ready_at = time.monotonic()  # a worker that died starting fails its job below
            else:
                finished.append(self._collect(ref))
        now = time.monotonic()
        for ref, job in list(self._jobs.items()):
            if now >= self._deadline(job):
                del self._jobs[ref]
                self._retire(job.slot, healthy=False)
                if job.slot.ready_at is None:
                    reason = f"worker did not start within {STARTUP_TIMEOUT_S:g} s (resources unavailable?)"
                else:
                    reason = f"timed out after {self.timeout_s:g} s"
                finished.append(Finished(job.key, Result.failure(reason, now - job.submitted)))
        return finished

    def _collect(self, ref: Any) -> Finished:
        job = self._jobs.pop(ref)
        try:
            out = self._ray.get(ref)
        except Exception as exc:  # noqa: BLE001 - worker death, node loss, OOM kill: a failed result
            self._retire(job.slot, healthy=False)
            first = (str(exc).strip().splitlines() or [""])[0][:300]
            reason = f"worker died ({type(exc).__name__}): {first}"
            return Finished(job.key, Result.failure(reason, time.monotonic() - job.submitted))
        self._retire(job.slot, healthy=True)
        return Finished(job.key, Result.from_json(out["result"]), out["worker"])

    def shutdown(self) -> None:
        for slot in [*self._idle, *self._starting.values(), *(j.slot for j in self._jobs.values())]:
            self._ray.kill(slot.actor, no_restart=True)
        self._idle.clear()
        self._starting.clear()
        self._jobs.clear()
        if self._owns_ray:
            self._ray.shutdown()

"""Executors run `Task`s somewhere (this process, or Ray workers) and hand back `Result`s; they never
know which strategy asked, so any strategy runs on any executor."""

from __future__ import annotations

import logging
import os
import socket
import time
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

from einspace.errors import EinspaceError
from einspace.evaluators.base import Result, Task, run_task
from einspace.evaluators.worker import after_evaluation, settle, warm_up
from einspace.plugins import import_plugins
from einspace.search.packing import SMALLEST_SHARE, gpu_share, training_bytes
from einspace.search.ray_local import start_local_ray, stop_local_ray

__all__ = [
    "Executor",
    "Finished",
    "InProcessExecutor",
    "RayExecutor",
    "evaluate_in_worker",
    "load_registries",
]


@dataclass(frozen=True)
class Finished:
    """A finished evaluation: the key it was submitted under, its result, and where it ran (the
    worker process, and the Ray node: None in-process)."""

    key: int
    result: Result
    worker: str | None = None
    node: str | None = None


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


def load_registries(plugins: Sequence[str]) -> None:
    """The bundled evaluators, then the user's plugins (einspace.plugins); run in the driver and
    in every worker, so a registry is the same everywhere. Idempotent."""
    import einspace.evaluators  # noqa: F401 - the bundled evaluators register themselves on import

    import_plugins(plugins)


def _worker_name() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def evaluate_in_worker(task: dict[str, Any], plugins: Sequence[str]) -> dict[str, Any]:
    """The body of one Ray task: plain data in, plain data out (no pickled modules cross the wire).
    `recycle` says why the process should not run another evaluation (None: it may)."""
    try:
        load_registries(plugins)
        result = run_task(Task.from_json(task))
    except Exception as exc:  # noqa: BLE001 - a plugin that fails to import is a failed evaluation
        result = Result.failure(f"worker could not start the evaluation: {type(exc).__name__}: {exc}")
    recycle = after_evaluation(result.error)
    return {"result": result.to_json(), "worker": _worker_name(), "recycle": recycle}


class InProcessExecutor(Executor):
    """Evaluates in the calling process, one task per `wait`, in submission order: for debugging
    and tests. It cannot enforce timeouts or survive an evaluator that kills its process."""

    def __init__(self, max_in_flight: int = 1, plugins: Sequence[str] = ()):
        self.max_in_flight = max_in_flight
        self._queue: deque[tuple[int, Task]] = deque()
        load_registries(plugins)

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
    """A Ray actor that evaluates tasks; `ready` answers once its process is up and warmed (so a
    timeout counts from when an evaluation can start, not from a process start or a queue)."""

    def __init__(self, plugins: Sequence[str], gpu_share: float):
        self.plugins, self.gpu_share = plugins, gpu_share
        self.first = True

    def ready(self) -> str:
        """The id of the Ray node it runs on, once warmed up."""
        import ray

        try:
            warm_up(self.gpu_share or None)
            load_registries(self.plugins)
        except Exception:  # noqa: BLE001 - the first evaluation fails with the reason instead
            pass
        settle()
        return ray.get_runtime_context().get_node_id()

    def evaluate(self, task: dict[str, Any]) -> dict[str, Any]:
        out = evaluate_in_worker(task, self.plugins)
        if self.first:  # what it imported lazily is permanent too
            settle()
            self.first = False
        return out


def _gpu_memory() -> int:
    """Bytes of memory of the GPU this process sees (0 without CUDA): run as a Ray task."""
    import torch

    return torch.cuda.get_device_properties(0).total_memory if torch.cuda.is_available() else 0


@dataclass
class _Slot:
    """One worker actor, its share of a GPU, when it became ready and on which Ray node (None
    while starting, or for a worker that died starting)."""

    actor: Any
    share: float
    created: float
    ready_at: float | None = None
    node: str | None = None


@dataclass
class _Job:
    key: int
    task: Task
    slot: _Slot
    submitted: float


#: A worker that has not started after this long (say, it asked for a GPU no node has free) fails
#: its evaluation rather than hanging the search.
STARTUP_TIMEOUT_S = 600.0
#: How the GPU share of an evaluation is chosen (executor.packing).
PACKINGS = ("fixed", "memory")
#: How often one evaluation is started again after the node it ran on was lost, before it fails.
NODE_LOSS_RETRIES = 3

_log = logging.getLogger(__name__)


def _node_of(ray: Any, ready: Any) -> str | None:
    """The node a worker reported from `ready` (None: it died starting)."""
    try:
        return ray.get(ready)
    except Exception:  # noqa: BLE001 - its job fails with the reason
        return None


def _node_lost(ray: Any, slot: _Slot) -> bool:
    """Whether the node of a dead worker is gone from the cluster (the evaluation is not to
    blame): Ray reports an actor dead only once it knows why, so the node is marked by then."""
    if slot.node is None:
        return False
    return slot.node not in {n["NodeID"] for n in ray.nodes() if n["Alive"]}


class RayExecutor(Executor):
    """Evaluations run in Ray worker actors, each holding `num_cpus` and a share of a GPU, so
    Ray's scheduler places them over a pool of GPUs across nodes (it sets CUDA_VISIBLE_DEVICES
    per worker). Only tree text and settings cross the wire.

    Workers are persistent by default: up to `max_in_flight` of them are reused, each keeping its
    imports, CUDA context and cached data across evaluations (einspace.evaluators.worker cleans
    up after each). A worker that reports an out-of-memory or CUDA error, or leaked device
    memory, is replaced by a fresh process. With `fresh_process` every evaluation gets a new
    worker, killed when it finishes. A timeout counts from when the evaluation's worker is ready;
    a timed-out worker is killed. A worker that dies yields a failed result with the reason, and
    the search goes on; an evaluation whose node left the cluster (killed, preempted) is not at
    fault and runs again on another worker, up to NODE_LOSS_RETRIES times.

    GPU shares: `packing="fixed"` gives every evaluation `num_gpus` (fractions pack several on
    one GPU); `packing="memory"` sizes each evaluation's share from its tree's estimated training
    memory (einspace.search.packing), at most `num_gpus`, on GPUs of `gpu_memory_gb` (asked of a
    GPU worker when not given). Then evaluations wait in the executor until their share fits,
    and idle workers of other sizes are stopped to make room.
    """

    def __init__(
        self,
        *,
        max_in_flight: int = 1,
        num_cpus: float = 1,
        num_gpus: float = 0,
        timeout_s: float | None = None,
        address: str | None = None,
        fresh_process: bool | None = None,
        plugins: Sequence[str] = (),
        local_cpus: int | None = None,
        packing: str = "fixed",
        gpu_memory_gb: float | None = None,
    ):
        import ray

        if packing not in PACKINGS:
            raise EinspaceError(f"executor.packing must be one of {', '.join(PACKINGS)}, got {packing!r}")
        if packing == "memory" and num_gpus <= 0:
            raise EinspaceError("executor.packing memory needs executor.num_gpus > 0 (the largest share)")
        self._ray = ray
        self.max_in_flight = max_in_flight
        self.timeout_s = timeout_s
        self.num_gpus = num_gpus
        self.plugins = [str(Path(p).resolve()) if p.endswith(".py") else p for p in plugins]
        load_registries(self.plugins)  # fail fast in the driver rather than in every worker
        self._owns_ray = False
        if not ray.is_initialized():
            if address:
                ray.init(address=address, include_dashboard=False, log_to_driver=False)
            else:
                start_local_ray(num_cpus=local_cpus)
            self._owns_ray = True
        gpus = ray.cluster_resources().get("GPU", 0)
        if num_gpus > 0 and not gpus:
            self._refuse(f"executor.num_gpus is {num_gpus:g} but the Ray cluster has no GPUs")
        self.fresh = bool(fresh_process)
        self._options = {"num_cpus": num_cpus, "max_restarts": 0, "max_task_retries": 0}
        self._capacity: float | None = None  # GPUs the shares must fit in (memory packing only)
        self._device_bytes = 0
        if packing == "memory":
            self._capacity = gpus
            self._device_bytes = self._gpu_bytes(gpu_memory_gb)
        self._idle: list[_Slot] = []  # longest idle first
        self._queue: deque[tuple[int, Task, float]] = deque()  # waiting for room on the GPUs
        self._starting: dict[Any, _Slot] = {}  # ready() ref -> slot
        self._jobs: dict[Any, _Job] = {}  # evaluate() ref -> job
        self._retries: dict[int, int] = {}  # key -> times restarted after its node was lost

    def _refuse(self, message: str) -> NoReturn:
        """Stop the Ray instance this executor started, and raise."""
        if self._owns_ray:
            stop_local_ray()
        raise EinspaceError(message)

    def _gpu_bytes(self, gpu_memory_gb: float | None) -> int:
        if gpu_memory_gb:
            return int(gpu_memory_gb * 2**30)
        probe = self._ray.remote(_gpu_memory).options(num_cpus=0, num_gpus=SMALLEST_SHARE)
        total = self._ray.get(probe.remote(), timeout=STARTUP_TIMEOUT_S)
        if not total:
            self._refuse(
                "executor.packing is memory but the GPU workers see no CUDA device to measure; "
                "set executor.gpu_memory_gb"
            )
        return total

    def start_workers(self, wait: bool = False) -> float:
        """Start the reusable workers now, in parallel, rather than on first use; with `wait`,
        block until they are up. Returns the seconds waited (the start-up a run pays once).
        Nothing to start for fresh processes or memory packing (worker sizes follow the trees)."""
        started = time.monotonic()
        if self.fresh or self._capacity is not None:
            return 0.0
        while len(self._idle) < self.max_in_flight - len(self._jobs):
            self._idle.append(self._new_slot(self.num_gpus))
        if wait and self._starting:
            refs = list(self._starting)
            nodes = self._ray.get(refs)
            now = time.monotonic()
            for ref, node in zip(refs, nodes, strict=True):
                slot = self._starting.pop(ref)
                slot.ready_at, slot.node = now, node
        return time.monotonic() - started

    def _new_slot(self, share: float) -> _Slot:
        options = {**self._options, "num_gpus": share}
        actor = self._ray.remote(_EvaluationWorker).options(**options).remote(self.plugins, share)
        slot = _Slot(actor, share, time.monotonic())
        self._starting[actor.ready.remote()] = slot
        return slot

    def _share(self, task: Task) -> float:
        if self._capacity is None:
            return self.num_gpus
        try:
            needed = training_bytes(task)
        except EinspaceError:  # the worker fails it with the reason
            return min(self.num_gpus, self._capacity)
        return min(gpu_share(needed, self._device_bytes, self.num_gpus), self._capacity)

    def _held(self) -> float:
        return sum(s.share for s in self._idle) + sum(j.slot.share for j in self._jobs.values())

    def _room(self, share: float, cpus: float) -> bool:
        """Whether one more worker of this share fits beside this executor's own: its GPU share
        in the capacity (memory packing), its CPUs in the cluster's `cpus`. A worker Ray cannot
        place would wait for one of ours, which never lets go (say, after a node was lost)."""
        workers = len(self._idle) + len(self._jobs) + 1
        if workers * self._options["num_cpus"] > cpus + 1e-9:
            return False
        return self._capacity is None or self._held() + share <= self._capacity + 1e-9

    def _take(self, share: float) -> _Slot | None:
        """An idle worker of this share, else a new one if there is room for it (stopping idle
        workers of other shares, longest idle first, to make it); None: wait for a busy one."""
        for i in range(len(self._idle) - 1, -1, -1):
            if self._idle[i].share == share:
                return self._idle.pop(i)
        cpus = self._ray.cluster_resources().get("CPU", 0.0)
        while self._idle and not self._room(share, cpus):
            self._ray.kill(self._idle.pop(0).actor, no_restart=True)
        if self._jobs and not self._room(share, cpus):
            return None
        return self._new_slot(share)  # with nothing running, try: Ray's start-up timeout says why not

    def _dispatch(self) -> None:
        while self._queue:
            key, task, share = self._queue[0]
            slot = self._take(share)
            if slot is None:
                return
            self._queue.popleft()
            ref = slot.actor.evaluate.remote(task.to_json())
            self._jobs[ref] = _Job(key, task, slot, time.monotonic())

    def _retire(self, slot: _Slot, healthy: bool) -> None:
        if healthy and not self.fresh:
            self._idle.append(slot)
        else:
            self._ray.kill(slot.actor, no_restart=True)

    def submit(self, key: int, task: Task) -> None:
        self._queue.append((key, task, self._share(task)))
        self._dispatch()

    @property
    def in_flight(self) -> int:
        return len(self._jobs) + len(self._queue)

    def _deadline(self, job: _Job) -> float:
        if job.slot.ready_at is None:
            return job.slot.created + STARTUP_TIMEOUT_S
        if self.timeout_s is None:
            return float("inf")
        return max(job.submitted, job.slot.ready_at) + self.timeout_s

    def wait(self, timeout: float | None = None) -> list[Finished]:
        self._dispatch()
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
                slot.node = _node_of(self._ray, ref)
            elif (done := self._collect(ref)) is not None:
                finished.append(done)
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
        self._dispatch()  # finished evaluations made room
        return finished

    def _collect(self, ref: Any) -> Finished | None:
        """The finished job's result; None when its node was lost and it is queued to run again
        elsewhere (the evaluation is not at fault), at most NODE_LOSS_RETRIES times."""
        job = self._jobs.pop(ref)
        try:
            out = self._ray.get(ref)
        except Exception as exc:  # noqa: BLE001 - worker death, node loss, OOM kill: a failed result
            self._retire(job.slot, healthy=False)
            first = (str(exc).strip().splitlines() or [""])[0][:300]
            if _node_lost(self._ray, job.slot) and self._retries.get(job.key, 0) < NODE_LOSS_RETRIES:
                self._retries[job.key] = self._retries.get(job.key, 0) + 1
                _log.warning("evaluation %d lost its node, retrying it elsewhere: %s", job.key, first)
                self._queue.appendleft((job.key, job.task, job.slot.share))  # dispatched on return
                return None
            reason = f"worker died ({type(exc).__name__}): {first}"
            return Finished(job.key, Result.failure(reason, time.monotonic() - job.submitted))
        self._retries.pop(job.key, None)
        self._retire(job.slot, healthy=out["recycle"] is None)
        return Finished(job.key, Result.from_json(out["result"]), out["worker"], job.slot.node)

    def shutdown(self) -> None:
        for slot in [*self._idle, *self._starting.values(), *(j.slot for j in self._jobs.values())]:
            self._ray.kill(slot.actor, no_restart=True)
        self._idle.clear()
        self._starting.clear()
        self._jobs.clear()
        self._queue.clear()
        self._retries.clear()
        if self._owns_ray:
            stop_local_ray()

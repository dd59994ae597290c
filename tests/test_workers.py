"""Persistent evaluation workers without Ray: their clean-up and replacement rules, the device data
cache, GPU shares from estimated memory, and the reaping of a crashed driver's local Ray."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from search_helpers import experiment

import einspace as es
from einspace.evaluators import data_cache, worker
from einspace.evaluators.base import Task
from einspace.search import ray_local
from einspace.search.config import ConfigError
from einspace.search.packing import PROCESS_BYTES, SMALLEST_SHARE, gpu_share, training_bytes

MIB, GIB = 2**20, 2**30


@pytest.mark.parametrize(
    "error, replaced",
    [
        (None, False),
        ("over budget: 12 network parameters exceed the budget of 10", False),
        ("time budget of 5 s exceeded in epoch 1 of 8", False),
        ("out of memory on cuda:0: CUDA out of memory. Tried to allocate 2.00 GiB", True),
        ("out of memory on cpu: DefaultCPUAllocator: can't allocate memory", True),
        ("evaluator crashed: RuntimeError: CUDA error: an illegal memory access was encountered", True),
        ("evaluator crashed: RuntimeError: cuDNN error: CUDNN_STATUS_EXECUTION_FAILED", True),
        ("evaluator crashed: RuntimeError: CUDA error: device-side assert triggered", True),
    ],
)
def test_a_worker_is_replaced_after_memory_and_cuda_errors_only(error, replaced, monkeypatch):
    monkeypatch.setattr(worker, "_resident", None)  # as in a fresh worker process
    reason = worker.after_evaluation(error)
    assert (reason is not None) == replaced
    if replaced:
        assert error[:40] in reason


#: One real error per kind that poisons a worker, each naming exactly one of `worker.POISONING`'s
#: fragments: removing any fragment from the rule fails its row.
POISONED_BY: dict[str, str] = {
    "out of memory": "out of memory on cuda:0: Tried to allocate 2.00 GiB",
    "CUDA error": "evaluator crashed: RuntimeError: CUDA error: an illegal memory access was encountered",
    "cuDNN error": "evaluator crashed: RuntimeError: cuDNN error: the execution failed",
    "CUBLAS_STATUS": "evaluator crashed: RuntimeError: CUBLAS_STATUS_EXECUTION_FAILED in cublasSgemm",
    "CUDNN_STATUS": "evaluator crashed: RuntimeError: CUDNN_STATUS_MAPPING_ERROR",
    "device-side assert": "evaluator crashed: RuntimeError: device-side assert triggered at Indexing.cu:1284",
    "NCCL error": "evaluator crashed: RuntimeError: NCCL error in: ProcessGroupNCCL.cpp:1207",
}


def test_every_kind_of_poisoning_error_is_tested_alone():
    assert set(POISONED_BY) == set(worker.POISONING)
    for fragment, error in POISONED_BY.items():
        assert [f for f in worker.POISONING if f in error] == [fragment], error


@pytest.mark.parametrize("fragment", list(POISONED_BY))
def test_a_worker_is_replaced_after_each_kind_of_poisoning_error(fragment, monkeypatch):
    monkeypatch.setattr(worker, "_resident", None)
    reason = worker.after_evaluation(POISONED_BY[fragment])
    assert reason == f"replaced after the error: {POISONED_BY[fragment]}"


def test_a_worker_is_replaced_when_device_memory_grows_past_its_first_evaluation(monkeypatch):
    """What torch keeps for a process's lifetime (cuBLAS workspaces: 195 MiB on an H200) stays
    after every evaluation and is no leak; growth beyond it is. CUDA is simulated: the test
    states the rule, the GPU test in test_training.py runs it on a device."""
    import torch

    allocated = {"bytes": 0}
    for name in ("synchronize", "empty_cache", "reset_peak_memory_stats"):
        monkeypatch.setattr(torch.cuda, name, lambda *args, **kwargs: None)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda *args, **kwargs: allocated["bytes"])
    monkeypatch.setattr(data_cache, "device_bytes", lambda: 100 * MIB)  # the cached data, not counted
    monkeypatch.setattr(worker, "_resident", None)

    def after(held_mib: int) -> str | None:
        allocated["bytes"] = (100 + held_mib) * MIB
        return worker.after_evaluation(None)

    assert after(195) is None  # the first evaluation's residue: the process's own
    assert after(195) is None and after(195 + 60) is None  # within LEAK_BYTES of it
    reason = after(195 + 65)
    assert reason and "260 MiB" in reason and "kept 195 MiB" in reason
    monkeypatch.setattr(worker, "_resident", None)
    assert "1100 MiB" in after(1100)  # more than RESIDENT_LIMIT: a leak in the first evaluation


def test_the_gpu_share_travels_in_the_environment(monkeypatch):
    monkeypatch.delenv(worker.GPU_SHARE_ENV, raising=False)
    assert worker.gpu_share() is None
    monkeypatch.setenv(worker.GPU_SHARE_ENV, "0.125")
    assert worker.gpu_share() == 0.125


def test_the_data_cache_makes_each_entry_once_and_keeps_the_newest():
    import torch

    data_cache.clear()
    made = []

    def make(i):
        made.append(i)
        return torch.full((2,), float(i)), torch.zeros(2)

    for i in [0, 1, 0, 2, 3, 4, 0]:  # 0 stays recent; 1 is the oldest when 4 arrives
        x, _ = data_cache.cached(("set", i), lambda i=i: make(i))
        assert float(x[0]) == i
    assert made == [0, 1, 2, 3, 4]
    data_cache.cached(("set", 1), lambda: make(1))
    assert made == [0, 1, 2, 3, 4, 1]  # evicted, so made again
    assert data_cache.device_bytes() == 0  # nothing here is on a GPU
    data_cache.clear()
    data_cache.cached(("set", 0), lambda: make(0))
    assert made[-1] == 0


@pytest.mark.parametrize(
    "needed, device, largest, share",
    [
        (1 * GIB, 16 * GIB, 1.0, 1 / 16),
        (1 * GIB + 1, 16 * GIB, 1.0, 1 / 8),
        (5 * GIB, 16 * GIB, 1.0, 1 / 2),
        (40 * GIB, 16 * GIB, 1.0, 1.0),  # more than a GPU: a whole one (the worker may fail)
        (5 * GIB, 16 * GIB, 0.25, 0.25),  # never more than num_gpus
        (1, 16 * GIB, 1 / 32, 1 / 32),
    ],
)
def test_gpu_shares_are_the_smallest_power_of_two_that_holds_the_estimate(needed, device, largest, share):
    assert gpu_share(needed, device, largest) == share
    assert SMALLEST_SHARE == 1 / 16


def test_training_memory_is_process_weights_and_activations():
    tree = "(S (M (C linear(d=16))) (M (C leaky_relu)))"  # 1x8x8 -> 16x8x8 -> 16x8x8
    task = Task(tree, "einspace", (1, 8, 8), "training", {"batch_size": 32})
    params = 1 * 16 + 16
    values = 64 + 1024 + 1024  # per example: the input and both operations' outputs
    assert training_bytes(task) == PROCESS_BYTES + 16 * params + values * 32 * 4
    net = es.compile_network(es.parse_tree(tree), es.input_state((1, 8, 8)))
    assert sum(p.numel() for p in net.backbone.parameters()) == params


@pytest.mark.parametrize(
    "executor, message",
    [
        ({"packing": "dense"}, "executor.packing must be 'fixed' or 'memory'"),
        ({"packing": "memory"}, r"with num_gpus > 0.*got 'memory' with num_gpus 0"),
        ({"gpu_memory_gb": "80G"}, "executor.gpu_memory_gb must be a number or null"),
    ],
)
def test_packing_settings_are_checked(tmp_path, executor, message):
    with pytest.raises(ConfigError, match=message):
        experiment(tmp_path, executor={"kind": "ray", **executor})


@pytest.fixture
def orphan(tmp_path):
    """A process holding a file open in a fake session directory, recorded as started by a driver
    that has exited; killed by the test or here."""
    session = tmp_path / "session_x"
    (session / "logs").mkdir(parents=True)
    with open(session / "logs" / "agent.out", "w") as out:
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], stdout=out)
    gone = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    dead = int(gone.stdout)
    records = tmp_path / "records"
    records.mkdir()
    yield child, session, records, dead
    if child.poll() is None:
        child.kill()
    child.wait()


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="reads /proc")
def test_a_dead_drivers_session_is_reaped_and_a_live_ones_is_not(orphan):
    child, session, records, dead = orphan
    assert ray_local.session_processes(str(session)) == [child.pid]
    mine = {"pid": os.getpid(), "start": ray_local._start_time(os.getpid()), "session_dir": str(session)}
    (records / "alive.json").write_text(json.dumps(mine))
    assert ray_local.reap_orphaned_sessions(records) == []  # its driver (this process) is alive
    assert child.poll() is None
    # the dead driver's pid with another start time, as a reused pid would have
    stale = {"pid": os.getpid(), "start": mine["start"] - 1, "session_dir": str(session)}
    for name, record in (("alive", {**mine, "pid": dead}), ("reused", stale)):
        (records / f"{name}.json").write_text(json.dumps(record))
    assert ray_local.reap_orphaned_sessions(records) == [child.pid]
    assert child.wait(10) == -9
    assert not list(records.glob("*.json"))
    assert ray_local._start_time(dead) is None


def test_a_session_recorded_twice_is_killed_once_while_its_process_lingers(tmp_path, monkeypatch):
    """Two dead drivers' records of one session, whose process is still listed after the first
    SIGKILL (not yet gone): killed and reported once."""
    for name in ("a", "b"):
        record = {"pid": 1, "start": -1, "session_dir": "/tmp/session_x"}
        (tmp_path / f"{name}.json").write_text(json.dumps(record))
    monkeypatch.setattr(ray_local, "session_processes", lambda session: [4242])
    kills = []
    monkeypatch.setattr(ray_local.os, "kill", lambda pid, sig: kills.append(pid))
    assert ray_local.reap_orphaned_sessions(tmp_path) == [4242]
    assert kills == [4242]
    assert not list(tmp_path.glob("*.json"))


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="reads /proc")
def test_start_times_name_processes():
    assert ray_local._start_time(os.getpid()) == ray_local._start_time(os.getpid()) is not None
    exited = subprocess.Popen([sys.executable, "-c", "pass"])
    exited.wait()
    assert ray_local._start_time(exited.pid) is None

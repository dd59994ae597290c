"""Worker replacement (einspace.evaluators.worker) at its boundaries: the exact reasons given, the
leak limits to the byte, a CUDA failure after the evaluation, the warm-up on a (simulated) GPU
and the collector's freeze. CUDA is simulated with monkeypatched torch.cuda calls; the rule's
other half (the executor replacing the worker) is tested with Ray in test_executors.py."""

from __future__ import annotations

import gc
import os

import pytest
import torch

from einspace.evaluators import data_cache, worker

MIB = 2**20


@pytest.fixture
def device(monkeypatch):
    """A simulated initialised GPU: `device["bytes"]` is what it holds, 100 MiB of it cached data."""
    state = {"bytes": 0, "calls": []}
    for name in ("synchronize", "empty_cache", "reset_peak_memory_stats"):
        monkeypatch.setattr(torch.cuda, name, lambda *a, name=name, **k: state["calls"].append(name))
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda *a, **k: state["bytes"])
    monkeypatch.setattr(data_cache, "device_bytes", lambda: 100 * MIB)
    monkeypatch.setattr(worker, "_resident", None)
    return state


@pytest.fixture
def no_share(monkeypatch):
    """No GPU share in the environment; the one `warm_up` sets there is removed after the test,
    else it stays for the rest of the process (later tests, and Ray instances started there)."""
    monkeypatch.setenv(worker.GPU_SHARE_ENV, "")  # recorded as absent before: undone after the test
    monkeypatch.delenv(worker.GPU_SHARE_ENV)


def _after(device: dict, held: int) -> str | None:
    device["bytes"] = 100 * MIB + held
    return worker.after_evaluation(None)


def test_the_leak_limit_is_exact_to_the_byte(device):
    """The first evaluation's residue up to RESIDENT_LIMIT is the process's own; later ones may
    add LEAK_BYTES to it, and one byte more replaces the worker."""
    assert worker.LEAK_BYTES == 64 * MIB and worker.RESIDENT_LIMIT == 1024 * MIB
    assert _after(device, 200 * MIB) is None
    assert device["calls"] == ["synchronize", "empty_cache", "reset_peak_memory_stats"]
    assert _after(device, 264 * MIB) is None  # exactly LEAK_BYTES more
    assert _after(device, 264 * MIB + 1) == (
        "replaced: 264 MiB of device memory still allocated after the evaluation"
        " (the process kept 200 MiB after its first)"
    )
    assert _after(device, 200 * MIB) is None  # the first residue stays the reference


def test_the_first_evaluation_may_keep_up_to_the_resident_limit(device):
    assert _after(device, 1024 * MIB) is None
    assert _after(device, 1088 * MIB) is None  # and the next LEAK_BYTES beyond it
    worker._resident = None
    assert _after(device, 1024 * MIB + 1) == (
        "replaced: 1024 MiB of device memory still allocated after the evaluation"
    )


def test_held_memory_leaves_the_cached_data_out(device):
    """The reference is what the process holds beyond its cached data: 0 here."""
    assert _after(device, 0) is None
    assert worker._resident == 0
    assert _after(device, 64 * MIB) is None
    assert _after(device, 65 * MIB) is not None


def test_a_cuda_failure_after_the_evaluation_replaces_the_worker(device, monkeypatch):
    def fail(*args, **kwargs):
        raise RuntimeError("CUDA error: " + "x" * 300 + "\nCompile with TORCH_USE_CUDA_DSA")

    monkeypatch.setattr(torch.cuda, "synchronize", fail)
    assert (
        worker.after_evaluation(None)
        == "replaced: CUDA failed after the evaluation: " + ("CUDA error: " + "x" * 300)[:200]
    )


def test_the_error_in_the_reason_is_cut_at_200_characters(device):
    error = "evaluator crashed: RuntimeError: CUDA error: " + "y" * 400
    assert worker.after_evaluation(error) == f"replaced after the error: {error[:200]}"
    assert device["calls"] == []  # a poisoned worker is not cleaned: it is replaced


def test_other_errors_clean_up_and_keep_the_worker(device):
    assert _after(device, 10 * MIB) is None
    device["calls"].clear()
    assert worker.after_evaluation("over budget: 12 parameters exceed the budget of 10") is None
    assert device["calls"] == ["synchronize", "empty_cache", "reset_peak_memory_stats"]


def test_without_an_initialised_gpu_nothing_is_measured(monkeypatch):
    monkeypatch.setattr(worker, "_resident", None)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda *a, **k: 2**40)
    assert worker.after_evaluation(None) is None
    assert worker._resident is None


def test_an_empty_share_is_the_whole_device(monkeypatch):
    monkeypatch.setenv(worker.GPU_SHARE_ENV, "")
    assert worker.gpu_share() is None
    monkeypatch.setenv(worker.GPU_SHARE_ENV, "0.5")
    assert worker.gpu_share() == 0.5


def test_warm_up_records_the_share_and_calibrates_mixed_precision_on_the_gpu(monkeypatch, no_share):
    from einspace.evaluators import _runtime, base, time_model

    seen: list = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: seen.append("synchronize"))
    monkeypatch.setattr(base, "list_evaluators", lambda: seen.append("evaluators") or [])
    monkeypatch.setattr(_runtime, "autocast_dtype", lambda device, amp: ("dtype", device.type, amp))
    monkeypatch.setattr(time_model, "calibrated", lambda *a, **k: seen.append(("calibrated", a, k)))
    # the optimiser built once (its first build imports torch._dynamo: seconds, not spent here)
    optimiser = lambda params, lr: seen.append(("SGD", [(p.shape, p.requires_grad) for p in params], lr))  # noqa: E731
    monkeypatch.setattr(torch.optim, "SGD", optimiser)
    worker.warm_up(None)
    worker.warm_up(0.0)
    assert seen == [] and worker.GPU_SHARE_ENV not in os.environ
    worker.warm_up(0.25)
    assert worker.gpu_share() == 0.25
    device = torch.device("cuda")
    assert seen == [
        "evaluators",
        ("SGD", [(torch.Size([1]), True)], 0.1),
        "synchronize",
        ("calibrated", (device, ("dtype", "cuda", True)), {"threads": None}),
    ]


def test_warm_up_without_a_gpu_only_records_the_share(monkeypatch, no_share):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: pytest.fail("no GPU to touch"))
    worker.warm_up(0.5)
    assert worker.gpu_share() == 0.5


def test_settle_freezes_what_is_alive(monkeypatch):
    try:
        worker.settle()
        assert gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()

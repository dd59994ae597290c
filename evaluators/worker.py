"""A long-lived evaluation process: warmed up once, cleaned after every evaluation, and replaced
when it can no longer be trusted.

Keeping one process per GPU slot saves, per evaluation, a process start, the torch import, the
CUDA context and the dataset's trip to the device (einspace.evaluators.data_cache). The price is
that one evaluation could poison the next: memory it left allocated, a CUDA context broken by a
sticky error. So after every evaluation the process collects garbage, returns cached blocks to
the driver, resets the peak-memory statistics and checks that the device memory it holds, beyond
its cached data, has not grown since its first evaluation (what torch keeps for a process's
lifetime -- cuBLAS workspaces, one per stream, measured at 195 MiB on an H200 -- is not a leak);
after an out-of-memory or CUDA error, or a leak, it asks to be replaced by a fresh process.
Importing this module does not import torch.
"""

from __future__ import annotations

import gc
import os
import sys

__all__ = ["GPU_SHARE_ENV", "LEAK_BYTES", "POISONING", "after_evaluation", "gpu_share", "settle", "warm_up"]

#: Set by the executor to this process's share of its GPU (e.g. "0.125"); bounds what it caches.
GPU_SHARE_ENV = "EINSPACE_GPU_SHARE"
#: Fragments of an error after which the process is replaced: the CUDA context may be unusable
#: (illegal access, device-side assert) or the allocator fragmented. A fresh process is cheap next
#: to a poisoned one failing every later evaluation.
POISONING = (
    "out of memory",
    "CUDA error",
    "cuDNN error",
    "CUBLAS_STATUS",
    "CUDNN_STATUS",
    "device-side assert",
    "NCCL error",
)
#: Device memory an evaluation may add to what the process held after its first evaluation
#: (beyond the cached data) before the process is replaced.
LEAK_BYTES = 64 * 2**20
#: What the first evaluation may leave for the process's lifetime (library workspaces and
#: handles); more than this is a leak already.
RESIDENT_LIMIT = 1024 * 2**20

#: Device bytes held after this process's first evaluation, beyond its cached data (None before).
_resident: int | None = None


def gpu_share() -> float | None:
    """This process's share of its GPU as the executor set it, or None (the whole device)."""
    value = os.environ.get(GPU_SHARE_ENV)
    return float(value) if value else None


def warm_up(share: float | None) -> None:
    """Record this process's GPU share and, when it has a GPU, prepare what every evaluation
    there needs: the evaluators imported, an optimiser built once (the first imports
    torch._dynamo: seconds), the CUDA context created and the training time model calibrated
    for mixed precision, the default (einspace.evaluators.time_model). The first
    evaluation then pays none of it and its time budget counts from a ready worker. Without a GPU
    the first evaluation imports what it needs itself, and calibrates if it has a time budget
    (the same seconds, once per worker; no time is lost to warming evaluators a CPU worker might
    never use)."""
    if not share:
        return
    os.environ[GPU_SHARE_ENV] = repr(share)
    import torch

    if torch.cuda.is_available():
        from einspace.evaluators._runtime import autocast_dtype
        from einspace.evaluators.base import list_evaluators
        from einspace.evaluators.time_model import calibrated

        list_evaluators()
        torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)
        torch.cuda.synchronize()  # creates the context on the worker's device
        device = torch.device("cuda")
        calibrated(device, autocast_dtype(device, amp=True), threads=None)


def settle() -> None:
    """Mark every object alive now (modules, classes: what the imports made) as permanent, so the
    collection after each evaluation walks only what evaluations made: with torch imported a full
    collection takes 0.1-0.5 s, after this microseconds. Run after the warm-up and again after
    the first evaluation (for what it imported lazily). Reference counting still frees permanent
    objects; only cycles among them are never collected."""
    gc.collect()
    gc.freeze()


def after_evaluation(error: str | None) -> str | None:
    """Release what an evaluation left behind. Returns why this process should not run another
    evaluation, or None."""
    if error and any(fragment in error for fragment in POISONING):
        return f"replaced after the error: {error[:200]}"
    gc.collect()
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_initialized():
        return None
    from einspace.evaluators import data_cache

    try:
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        held = torch.cuda.memory_allocated() - data_cache.device_bytes()
    except RuntimeError as exc:  # a sticky CUDA error surfaces at the next call
        return f"replaced: CUDA failed after the evaluation: {str(exc).splitlines()[0][:200]}"
    return _leak(held)


def _leak(held: int) -> str | None:
    """Why `held` device bytes (beyond the cached data) after an evaluation make this process
    unfit for another, or None. The first evaluation's residue sets what the process keeps."""
    global _resident
    if _resident is None:
        _resident = held
        limit = RESIDENT_LIMIT
    else:
        limit = _resident + LEAK_BYTES
    if held <= limit:
        return None
    first = limit == RESIDENT_LIMIT
    kept = "" if first else f" (the process kept {_resident / 2**20:.0f} MiB after its first)"
    return f"replaced: {held / 2**20:.0f} MiB of device memory still allocated after the evaluation{kept}"

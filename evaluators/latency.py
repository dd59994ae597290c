"""Measured latency of one forward pass, for searches with a latency objective or limit.

Analytic counts (parameters, FLOPs) rank networks by size, not by what a device makes of them:
memory-bound operations, kernel launches and lowering change the time per pass. So latency is
measured on the device the evaluation trained on, at a stated batch size: a few warm-up passes
(allocation, kernel selection), then the median of timed passes (robust to a stray slow one).
"""

from __future__ import annotations

import statistics
import time

import torch
from torch import nn

from einspace.evaluators._runtime import Runtime

__all__ = ["WARMUP_PASSES", "TIMED_PASSES", "forward_latency_ms"]

WARMUP_PASSES = 3
TIMED_PASSES = 10


def forward_latency_ms(
    model: nn.Module, runtime: Runtime, example_shape: tuple[int, ...], batch_size: int
) -> float:
    """The median milliseconds of an inference forward pass of `model` on a batch of
    `batch_size` random inputs of `example_shape`, on the runtime's device and precision."""
    model.eval()
    x = torch.randn(batch_size, *example_shape, device=runtime.device)
    times = []
    with torch.no_grad(), runtime.autocast():
        for i in range(WARMUP_PASSES + TIMED_PASSES):
            runtime.synchronize()
            start = time.perf_counter()
            model(x)
            runtime.synchronize()
            if i >= WARMUP_PASSES:
                times.append(time.perf_counter() - start)
    return 1000.0 * statistics.median(times)

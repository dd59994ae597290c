"""Cheap evaluators for the search tests and benchmark, loaded as a plugin (also inside Ray workers).

`test_params` scores a tree analytically from its parameter count (no training, no torch forward);
`test_faulty` does the same but misbehaves on a deterministic share of trees (by content hash);
`test_where` does the same and logs where it ran (process, node, GPUs), for placement tests.
"""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path

from einspace.evaluators.base import EvaluationFailed, Evaluator, register_evaluator
from einspace.tree import content_hash

#: Parameter count the analytic fitness prefers, so evolution has a slope to climb.
TARGET_PARAMS = 5_000


def _analytic(checked) -> dict[str, float]:
    params = checked.params
    return {"fitness": -abs(math.log10(params + 1) - math.log10(TARGET_PARAMS)), "params": float(params)}


@register_evaluator
class ParamsEvaluator(Evaluator):
    """Fitness = closeness of log10(parameters) to log10(TARGET_PARAMS); optional sleep."""

    name = "test_params"

    def __init__(self, sleep: float = 0.0):
        self.sleep = sleep

    def evaluate(self, checked, random_seed):
        if self.sleep:
            time.sleep(self.sleep)
        return _analytic(checked)


@register_evaluator
class FaultyEvaluator(Evaluator):
    """Misbehaves (`fault`: raise, hang, exit, nan, expected, cuda) on trees whose hash % every == 0."""

    name = "test_faulty"

    def __init__(self, fault: str = "raise", every: int = 1):
        self.fault = fault
        self.every = every

    def evaluate(self, checked, random_seed):
        if int(content_hash(checked.tree)[:8], 16) % self.every == 0:
            if self.fault == "raise":
                raise RuntimeError("injected failure")
            if self.fault == "expected":
                raise EvaluationFailed("CUDA out of memory (injected)")
            if self.fault == "hang":
                time.sleep(3600)
            if self.fault == "exit":
                os._exit(17)
            if self.fault == "nan":
                return {"fitness": float("nan")}
            if self.fault == "cuda":
                raise RuntimeError("CUDA error: an illegal memory access was encountered")
        return _analytic(checked)


@register_evaluator
class WhereEvaluator(Evaluator):
    """Appends where it runs to `log`/<pid>.jsonl as it starts: the process and its session, Ray
    node, the GPU ids Ray assigned, CUDA_VISIBLE_DEVICES and the GPU share; then sleeps `sleep`
    seconds. `batch_size` is read by memory packing only."""

    name = "test_where"

    def __init__(self, log: str, batch_size: int = 256, sleep: float = 0.0):
        self.log = Path(log)
        self.sleep = sleep

    def evaluate(self, checked, random_seed):
        import ray

        context = ray.get_runtime_context()
        entry = {
            "pid": os.getpid(),
            "session": os.getsid(0),
            "node": context.get_node_id(),
            "gpu_ids": [str(i) for i in ray.get_gpu_ids()],
            "visible": os.environ.get("CUDA_VISIBLE_DEVICES"),
            "share": context.get_assigned_resources().get("GPU", 0.0),
        }
        with open(self.log / f"{os.getpid()}.jsonl", "a") as f:
            f.write(json.dumps(entry) + "\n")
        time.sleep(self.sleep)
        return _analytic(checked)


@register_evaluator
class FidelityEvaluator(Evaluator):
    """`test_params` with a fidelity (`epochs` of pretend training): fewer epochs lower the score
    by a tree-dependent amount, so a low rung ranks trees nearly, not exactly, as the top does.
    Reports its progress (epochs, steps) as the training evaluator does."""

    name = "test_fidelity"
    fidelity_setting = "epochs"

    def __init__(self, epochs: int = 9):
        self.epochs = epochs

    def full_fidelity(self) -> int:
        return self.epochs

    def evaluate(self, checked, random_seed):
        metrics = _analytic(checked)
        noise = int(content_hash(checked.tree)[:8], 16) / 2**32
        metrics["fitness"] -= noise / self.epochs
        return {**metrics, "epochs": float(self.epochs), "steps": float(10 * self.epochs)}

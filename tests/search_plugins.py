"""Cheap evaluators for the search tests and benchmark, loaded as a plugin (also inside Ray workers).

`test_params` scores a tree analytically from its parameter count (no training, no torch forward);
`test_faulty` does the same but misbehaves on a deterministic share of trees (by content hash).
"""

from __future__ import annotations

import math
import os
import time

from einspace.checker import check_tree
from einspace.evaluators.base import EvaluationFailed, Evaluator, register_evaluator
from einspace.tree import content_hash

#: Parameter count the analytic fitness prefers, so evolution has a slope to climb.
TARGET_PARAMS = 5_000


def _analytic(tree, input, grammar) -> dict[str, float]:
    params = check_tree(tree, grammar, input).params
    return {"fitness": -abs(math.log10(params + 1) - math.log10(TARGET_PARAMS)), "params": float(params)}


@register_evaluator
class ParamsEvaluator(Evaluator):
    """Fitness = closeness of log10(parameters) to log10(TARGET_PARAMS); optional sleep."""

    name = "test_params"

    def __init__(self, sleep: float = 0.0):
        self.sleep = sleep

    def evaluate(self, tree, input, grammar, random_seed):
        if self.sleep:
            time.sleep(self.sleep)
        return _analytic(tree, input, grammar)


@register_evaluator
class FaultyEvaluator(Evaluator):
    """Misbehaves (`fault`: raise, hang, exit, nan, expected) on trees whose hash % every == 0."""

    name = "test_faulty"

    def __init__(self, fault: str = "raise", every: int = 1):
        self.fault = fault
        self.every = every

    def evaluate(self, tree, input, grammar, random_seed):
        if int(content_hash(tree)[:8], 16) % self.every == 0:
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
        return _analytic(tree, input, grammar)

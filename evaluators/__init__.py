"""Evaluators that turn a tree into a fitness: training, zero-cost proxies, datasets, budgets.

The public names load their module on first use, so importing `einspace.evaluators.base` for
Task and Result (as stores and strategies do) does not pull in the training code.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "Continuation": "base",
    "EvaluationFailed": "base",
    "Evaluator": "base",
    "Result": "base",
    "Task": "base",
    "get_evaluator": "base",
    "list_evaluators": "base",
    "register_evaluator": "base",
    "run_task": "base",
    "Budget": "budgets",
    "activation_bytes": "budgets",
    "budget_violation": "budgets",
    "Dataset": "datasets",
    "list_datasets": "datasets",
    "load_arrays": "datasets",
    "load_dataset": "datasets",
    "TrainingSettings": "training",
    "final_evaluation": "training",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)

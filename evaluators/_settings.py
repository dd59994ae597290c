"""Evaluator settings as frozen dataclasses built from plain mappings, with errors that name the key."""

from __future__ import annotations

import dataclasses
from typing import Any, TypeVar

from einspace.errors import EinspaceError
from einspace.registry import check_setting_names

T = TypeVar("T")

#: Epochs of the final evaluation (paper Table 4, "Epochs (eval)"); here, away from the training
#: code, so that the command line can name it without importing torch.
FINAL_EPOCHS = 64
#: The learning-rate schedules (`einspace.evaluators.optim`).
SCHEDULES = ("cosine", "step", "constant")
#: How a training run starts its classification head (the setting `head_init`): as initialised,
#: or fitted in closed form to the untrained backbone's features (`einspace.evaluators.head_fit`).
HEAD_INITS = ("random", "fitted")


def settings_from(cls: type[T], evaluator: str, values: dict[str, Any]) -> T:
    """`cls(**values)`, but an unknown key is an EinspaceError suggesting the closest known one
    (a typo in an experiment file should stop the run, not silently use a default)."""
    known = [f.name for f in dataclasses.fields(cls)]  # type: ignore[arg-type]
    check_setting_names(f"evaluator {evaluator!r}", values, known)
    return cls(**values)


def require(condition: bool, message: str) -> None:
    """Raise EinspaceError(message) unless `condition` (user input is never `assert`ed)."""
    if not condition:
        raise EinspaceError(message)

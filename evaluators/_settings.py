"""Evaluator settings as frozen dataclasses built from plain mappings, with errors that name the key."""

from __future__ import annotations

import dataclasses
import difflib
from typing import Any, TypeVar

from einspace.errors import EinspaceError

T = TypeVar("T")


def settings_from(cls: type[T], evaluator: str, values: dict[str, Any]) -> T:
    """`cls(**values)`, but an unknown key is an EinspaceError suggesting the closest known one
    (a typo in an experiment file should stop the run, not silently use a default)."""
    known = [f.name for f in dataclasses.fields(cls)]  # type: ignore[arg-type]
    for key in values:
        if key not in known:
            close = difflib.get_close_matches(key, known, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else f" (known: {', '.join(known)})"
            raise EinspaceError(f"unknown setting {key!r} for evaluator {evaluator!r}{hint}")
    return cls(**values)


def require(condition: bool, message: str) -> None:
    """Raise EinspaceError(message) unless `condition` (user input is never `assert`ed)."""
    if not condition:
        raise EinspaceError(message)

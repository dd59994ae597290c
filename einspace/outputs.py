"""Output files: a bad path is one sentence before any work, and a file is written whole or not at all."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from einspace.errors import EinspaceError

__all__ = ["writable", "write_output"]


def writable(path: str | Path) -> Path:
    """`path` as a Path if a file can be created there, else an EinspaceError `cannot write …` saying
    why. Commands with several outputs check them all first, so one bad path leaves none behind."""
    path = Path(path)
    if path.is_dir():
        raise EinspaceError(f"cannot write {path}: it is a directory; give a file name")
    folder = path.parent
    if not folder.is_dir():
        existing = next((p for p in folder.parents if p.exists()), None)
        if folder.exists() or (existing is not None and not existing.is_dir()):
            blocker = folder if folder.exists() else existing
            raise EinspaceError(f"cannot write {path}: {blocker} is a file, not a folder")
        raise EinspaceError(f"cannot write {path}: there is no folder {folder}")
    return path


def write_output(path: str | Path, content: str | bytes | Callable[[Path], None]) -> Path:
    """Write `content` (text, bytes, or a function writing a given path) to a temporary file next
    to `path`, then rename it into place: an error midway leaves the old file, or none."""
    path = writable(path)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.partial")
    try:
        if isinstance(content, str):
            temporary.write_text(content, encoding="utf-8")
        elif isinstance(content, bytes):
            temporary.write_bytes(content)
        else:
            content(temporary)
        os.replace(temporary, path)
    except OSError as exc:
        raise EinspaceError(f"cannot write {path}: {exc.strerror or exc}") from None
    finally:
        temporary.unlink(missing_ok=True)
    return path

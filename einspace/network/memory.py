"""Whether a network fits in memory, decided from its analytic counts before anything is allocated.

A sampled tree can describe hundreds of billions of parameters; building it would get the
process killed by the operating system, with no message. The limit is the memory this machine
has available (the smaller of the kernel's MemAvailable and the cgroup's limit), or the one
stated in the environment variable EINSPACE_MEMORY_LIMIT_GB.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from einspace.errors import EinspaceError

__all__ = ["LIMIT_VARIABLE", "allocation_failed", "format_bytes", "memory_limit", "require_memory"]

#: The environment variable that states a memory limit in GiB.
LIMIT_VARIABLE = "EINSPACE_MEMORY_LIMIT_GB"
_GIB = 2**30


def memory_limit() -> tuple[int, str]:
    """(bytes a network may take, where that number comes from), or (0, "") when unknown."""
    stated = os.environ.get(LIMIT_VARIABLE)
    if stated is not None:
        try:
            value = float(stated)
        except ValueError:
            raise EinspaceError(f"{LIMIT_VARIABLE} must be a number of GiB, got {stated!r}") from None
        return int(value * _GIB), f"stated by {LIMIT_VARIABLE}={stated}"
    limits = [n for n in (_mem_available(), _cgroup_limit()) if n]
    return (min(limits), "available on this machine") if limits else (0, "")


def _mem_available() -> int:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


def _cgroup_limit() -> int:
    try:
        text = Path("/sys/fs/cgroup/memory.max").read_text().strip()
    except OSError:
        return 0
    return int(text) if text.isdigit() else 0


def format_bytes(n: float) -> str:
    """`1.5 GiB`, `300.0 MiB`: a memory size as people read it."""
    for unit, size in (("TiB", 2**40), ("GiB", _GIB), ("MiB", 2**20)):
        if n >= size:
            return f"{n / size:,.1f} {unit}"
    return f"{n / 2**10:,.1f} KiB"


def require_memory(parts: Mapping[str, int], doing: str) -> None:
    """Refuse `doing` (EinspaceError with every number) when `parts` (what, bytes) add up to more
    than `memory_limit()`; nothing is checked where the limit is unknown."""
    limit, source = memory_limit()
    total = sum(parts.values())
    if limit and total > limit:
        detail = " + ".join(f"{format_bytes(n)} of {what}" for what, n in parts.items())
        need = detail if len(parts) == 1 else f"{format_bytes(total)} ({detail})"
        raise EinspaceError(
            f"{doing} would need about {need}, more than the {format_bytes(limit)} {source}; choose a "
            f"smaller tree (e.g. sample with --max-params), or set {LIMIT_VARIABLE} to state another limit"
        )


def allocation_failed(exc: BaseException) -> bool:
    """Whether an exception is an allocation failure (host or CUDA; torch's OutOfMemoryError says
    "out of memory"), which callers such as the evaluators report apart from other failures."""
    text = str(exc)
    return isinstance(exc, MemoryError) or any(
        words in text for words in ("out of memory", "can't allocate memory", "not enough memory")
    )

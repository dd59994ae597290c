"""Dataset splits as device tensors, kept across the evaluations of one worker process.

A persistent worker evaluates many trees on the same data; copying it to the GPU (or pinning it
in host memory) once per worker rather than once per evaluation removes a fixed cost that, for
small networks, rivals the training itself. Entries are keyed by what the caller names (the
training evaluator uses the Dataset object, the split and the subset; `load_dataset` returns one
object per dataset version, so data changed on disk gets new entries) plus the device, and the
oldest go once there are more than MAX_ENTRIES. Importing this module does not import torch.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

__all__ = ["MAX_ENTRIES", "cached", "clear", "device_bytes"]

#: Splits kept at once: train and valid of two datasets.
MAX_ENTRIES = 4

_entries: OrderedDict[Hashable, tuple[torch.Tensor, torch.Tensor]] = OrderedDict()


def cached(
    key: Hashable, make: Callable[[], tuple[torch.Tensor, torch.Tensor]]
) -> tuple[torch.Tensor, torch.Tensor]:
    """The tensors stored under `key`, made by `make()` (and stored) the first time."""
    if key in _entries:
        _entries.move_to_end(key)
        return _entries[key]
    value = _entries[key] = make()
    while len(_entries) > MAX_ENTRIES:
        _entries.popitem(last=False)
    return value


def device_bytes() -> int:
    """Bytes the cached tensors hold in GPU memory (what a worker keeps on purpose)."""
    return sum(t.nbytes for pair in _entries.values() for t in pair if t.is_cuda)


def clear() -> None:
    """Drop every entry (after an out-of-memory error, so the next evaluation starts clean)."""
    _entries.clear()

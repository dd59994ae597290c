"""Fixtures shared by several test modules."""

from __future__ import annotations

from collections.abc import Iterator

import pytest


@pytest.fixture(scope="module")
def one_thread() -> Iterator[None]:
    """One torch thread for a module of tiny networks: a thread pool only adds synchronisation,
    which on a busy machine (other jobs on the cores) made such a module 7x slower."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def renamed_pattern_axes(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every einops `Rearrange` layer made from here on has its axes renamed (`h` becomes
    `renamed_h`): the same tensor work, written differently. Whatever recognises operations by
    their modules must not notice (it once compared pattern strings, and silently stopped fusing)."""
    import re

    from einops.layers.torch import Rearrange

    original = Rearrange.__init__

    def renamed(self, pattern: str, **lengths: int) -> None:
        pattern = re.sub(r"[A-Za-z_]\w*", lambda m: f"renamed_{m.group()}", pattern)
        original(self, pattern, **{f"renamed_{k}": v for k, v in lengths.items()})

    monkeypatch.setattr(Rearrange, "__init__", renamed)

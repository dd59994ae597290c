"""Training that carries on across the rungs of a multi-fidelity search (`Continuation`).

A promoted tree trains on from where its lower rung stopped: the network's parameters and
buffers, the optimisers' and schedules' state, the generator that orders the data and torch's
own generator, and how many epochs are done. With all of them restored, training 1 epoch, then
on to 3, then on to 8 gives the network that 8 uninterrupted epochs give (on CPU to the last bit,
`tests/test_continuation.py`; under float16 autocast the loss scaler starts afresh).

States are files that `torch.load(..., weights_only=True)` reads (tensors and plain values, no
pickled code). One that cannot be used (missing: pruned, or written on another node; of another
tree; unreadable) is not an error: the run starts fresh, with the same schedule, and its metric
`continued_from_epoch` is 0. Nor is one that cannot be written: the result stands (`state_saved`
0), and a promotion of it trains from scratch.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from einspace.errors import EinspaceError

if TYPE_CHECKING:
    from torch import nn

    from einspace.evaluators.base import Continuation
    from einspace.evaluators.optim import Optimizers

__all__ = ["Resumption", "TrainedState", "read_state", "save_atomically", "write_state"]


@dataclass
class TrainedState:
    """Everything a training run needs to go on exactly where another stopped."""

    tree: str  # content hash of the tree it trained: a state is only loaded into the same tree
    epochs: int  # epochs done
    model: dict[str, torch.Tensor]
    optimizers: dict[str, Any]
    shuffle: torch.Tensor  # state of the generator that orders the training data
    rng: torch.Tensor  # state of torch's default CPU generator


def read_state(path: str | None, tree: str, before: int) -> TrainedState | None:
    """The state at `path` if there is one, readable, of `tree` and with fewer than `before`
    epochs done; else None."""
    if path is None or not Path(path).is_file():
        return None
    try:
        state = TrainedState(**torch.load(path, map_location="cpu", weights_only=True))
    except Exception:  # noqa: BLE001 - any unreadable file means: start fresh
        return None
    return state if state.tree == tree and 0 < state.epochs < before else None


def write_state(path: str, state: TrainedState) -> bool:
    """Write `state` to `path` atomically; whether it worked."""
    return save_atomically(dict(vars(state)), path)


def save_atomically(content: dict[str, Any], path: str) -> bool:
    """`torch.save` to `path` atomically (a reader never sees half a file); whether it worked."""
    target = Path(path)
    partial = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        torch.save(content, partial)
        os.replace(partial, target)
    except (OSError, RuntimeError):  # torch.save reports a missing folder as a RuntimeError
        with contextlib.suppress(OSError):
            partial.unlink(missing_ok=True)
        return False
    return True


@dataclass
class Resumption:
    """How one training run starts and ends: the schedule's length in epochs (`horizon`), the
    state it starts from (None: fresh) and where it saves its own (None: nowhere)."""

    horizon: int
    state: TrainedState | None = None
    save: str | None = None

    @staticmethod
    def of(continuation: Continuation, tree: str, epochs: int) -> Resumption:
        """The resumption of a run of `epochs` epochs of `tree` (a content hash)."""
        if continuation.horizon < epochs:
            raise EinspaceError(
                f"a continued run of {epochs} epochs cannot follow a schedule of {continuation.horizon}"
            )
        return Resumption(
            continuation.horizon, read_state(continuation.load, tree, epochs), continuation.save
        )

    @property
    def start(self) -> int:
        """Epochs already done."""
        return self.state.epochs if self.state is not None else 0

    def restore(self, model: nn.Module, optimizers: Optimizers, shuffle: torch.Generator) -> None:
        """Load the saved state (if any) into a freshly built run."""
        if self.state is None:
            return
        model.load_state_dict(self.state.model)
        optimizers.load_state_dict(self.state.optimizers)
        shuffle.set_state(self.state.shuffle)
        torch.set_rng_state(self.state.rng)

    def finish(
        self, tree: str, epochs: int, model: nn.Module, optimizers: Optimizers, shuffle: torch.Generator
    ) -> dict[str, float]:
        """Save the run's state where asked (after `epochs` epochs, all it was asked for); the
        metrics that say where it started and whether it saved."""
        metrics = {"continued_from_epoch": float(self.start)}
        if self.save is not None:
            state = TrainedState(
                tree,
                epochs,
                model.state_dict(),
                optimizers.state_dict(),
                shuffle.get_state(),
                torch.get_rng_state(),
            )
            metrics["state_saved"] = float(write_state(self.save, state))
        return metrics

"""Where a run keeps the trained states that promotions continue from (multi-fidelity search
with `promotion: continue`; the evaluator side is `einspace.evaluators.continuation`).

One file per evaluation below the top rung (and above a rung at 0 epochs, which trains nothing),
`states/<evaluation id>.pt` in the run directory, written by the worker that trained it and read
by the worker that trains its promotion. The folder holds only what
`SuccessiveHalving.live_states` may still need: after every result the rest is deleted, so it stays
bounded by the rungs' promising results, and a resumed run finds what it left.
Which states may be on disk is kept in memory (read from the folder once, when the run opens or
resumes), so pruning never lists the folder. On a cluster of several machines workers read and write
the run directory's path on their own machine: put the run directory on a shared filesystem, or
promotions train from scratch.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from einspace.evaluators.base import Continuation
    from einspace.search.config import MultiFidelitySection
    from einspace.search.strategy import Candidate, Strategy

__all__ = ["STATES_FOLDER", "TrainedStates"]

#: The folder of a run directory that holds saved training states.
STATES_FOLDER = "states"


class TrainedStates:
    """The saved states of one run: where each evaluation saves, what it continues, and (`live`)
    which states may still be needed. `saved` holds the evaluations whose state may be on disk:
    those found there on opening, and every one since told to save."""

    def __init__(self, directory: Path, horizon: int, live: Callable[[], set[int]]):
        self.directory, self.horizon, self.live = Path(directory), horizon, live
        found = self.directory.glob("*.pt") if self.directory.is_dir() else ()
        self.saved = {int(file.stem) for file in found if file.stem.isdigit()}

    @staticmethod
    def of(run_dir: Path, multi_fidelity: MultiFidelitySection, strategy: Strategy) -> TrainedStates | None:
        """The run's states when its promotions continue (None: they retrain)."""
        from einspace.search.successive_halving import SuccessiveHalving

        if not multi_fidelity.continues or not isinstance(strategy, SuccessiveHalving):
            return None
        return TrainedStates(Path(run_dir) / STATES_FOLDER, strategy.rungs[-1], strategy.live_states)

    def path(self, evaluation: int) -> Path:
        return self.directory / f"{evaluation}.pt"

    def continuation(self, candidate: Candidate) -> Continuation:
        """A candidate's evaluation saves its state unless it is at the top rung or at 0 epochs
        (nothing is trained there, so promotions from it train from scratch), and goes on from the
        state of the evaluation it `continues`, if any."""
        from einspace.evaluators.base import Continuation

        save = None if candidate.fidelity in (0, self.horizon) else str(self.path(candidate.id))
        if save is not None:
            self.saved.add(candidate.id)
        load = None if candidate.continues is None else str(self.path(candidate.continues))
        return Continuation(self.horizon, save, load)

    def prune(self) -> None:
        """Delete every saved state that is not `live`. An evaluation in flight is live, so its
        state is only deleted once its worker has finished writing it."""
        dead = self.saved - self.live()
        for evaluation in dead:
            self.path(evaluation).unlink(missing_ok=True)
        self.saved -= dead

"""Where a run keeps the trained weights that children inherit (evolution with the training
evaluator's `inherit_weights`; the evaluator side is `einspace.evaluators.inheritance`).

One file per tree, `weights/<content hash>.pt` in the run directory: every evaluation saves its
trained weights there (a promotion to a higher rung overwrites its lower rung's, so children
inherit from the longest-trained copy), and a mutation or crossover starts from its first parent's
file. The folder holds only what the strategy may still vary: after every result, files of trees
that are neither a parent the strategy may still choose (`Strategy.live_parents`) nor in flight
nor the parent of something in flight are deleted, so the disk it takes is bounded by the
population; a resumed run finds what it left. On a cluster of several machines workers read and
write the run directory's path on their own machine: put the run directory on a shared
filesystem, or children train from a fresh initialisation (their metric `inheritance_missing` 1).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from einspace.evaluators.base import Inheritance
    from einspace.search.config import Experiment
    from einspace.search.strategy import Candidate

__all__ = ["INHERITING_ORIGINS", "WEIGHTS_FOLDER", "InheritedWeights"]

#: The folder of a run directory that holds the weights children inherit.
WEIGHTS_FOLDER = "weights"
#: The origins of candidates that inherit from their first parent.
INHERITING_ORIGINS = ("mutation", "crossover")


class InheritedWeights:
    """The weights files of one run: where each evaluation saves, what each child inherits, and
    which files may go."""

    def __init__(self, directory: Path):
        self.directory = Path(directory)
        # the hashes with a file: read once here, then kept up to date by `saved` and `prune`
        self.files = {f.stem for f in self.directory.glob("*.pt")} if self.directory.is_dir() else set()

    @staticmethod
    def of(run_dir: Path, experiment: Experiment) -> InheritedWeights | None:
        """The run's weights when its evaluator inherits (None: it does not)."""
        if experiment.evaluator.settings.get("inherit_weights") is not True:
            return None
        return InheritedWeights(Path(run_dir) / WEIGHTS_FOLDER)

    def path(self, tree_hash: str) -> Path:
        return self.directory / f"{tree_hash}.pt"

    def inheritance(self, candidate: Candidate, parent_hash: str | None) -> Inheritance:
        """A candidate saves its weights under its tree's hash, and inherits from its first
        parent's (`parent_hash`) when it is a child of variation."""
        from einspace.evaluators.base import Inheritance

        inherits = parent_hash is not None and candidate.origin in INHERITING_ORIGINS
        return Inheritance(str(self.path(parent_hash)) if inherits else None, str(self.path(candidate.hash)))

    def saved(self, tree_hash: str) -> None:
        """Note that an evaluation of `tree_hash` wrote its file."""
        self.files.add(tree_hash)

    def prune(self, live: set[str]) -> None:
        """Delete every file whose tree is not `live`."""
        for tree_hash in self.files - live:
            self.path(tree_hash).unlink(missing_ok=True)
        self.files &= live

"""Transfer between searches: a surrogate-screened search starts its surrogate from the results of
earlier runs of the same grammar, on the same task or another (experiment key `warm_start`, or
`einspace search EXP --warm-start RUN ...`).

The earlier runs' trees are read with this run's grammar and input (a tree that does not fit the
new input still gives its operation counts) and enter the surrogate's data as their own sources,
ranked within their run, so screening starts with the first candidate (the initial population's
samples included) instead of after `surrogate_min_results` results of its own. The run
directories are part of the experiment, so of the run's identity: a run cannot be resumed with
other warm starts. The earlier results are read once, when the run starts; a resumed run has them
in its checkpoint.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from einspace.errors import EinspaceError
from einspace.search.store import Status

if TYPE_CHECKING:
    from einspace.search.config import Experiment
    from einspace.search.store import Record
    from einspace.search.strategy import Strategy
    from einspace.search.surrogate import Surrogate

__all__ = ["check_warm_start", "earlier_results", "heard_results", "surrogate_of", "warm_start"]


def surrogate_of(strategy: Strategy) -> Surrogate | None:
    """The surrogate of a strategy, or of the strategy a scheduler wraps (None: it has none)."""
    while getattr(strategy, "surrogate", None) is None and hasattr(strategy, "base"):
        strategy = strategy.base  # type: ignore[attr-defined]
    return getattr(strategy, "surrogate", None)


def check_warm_start(experiment: Experiment, strategy: Strategy) -> None:
    """Refuse, naming `warm_start[i]`, a run that is missing, not a run, of another grammar or
    without a scored result, and warm starts for a strategy without a surrogate."""
    if not experiment.warm_start:
        return
    if surrogate_of(strategy) is None:
        raise EinspaceError(
            "warm_start needs a surrogate to start: strategy regularised_evolution with screen above 1"
        )
    for i, run_dir in enumerate(experiment.warm_start):
        _scored(experiment, i, run_dir)


def earlier_results(experiment: Experiment) -> list[tuple[int, Record]]:
    """(source, record) of every scored or failed evaluation of the warm-start runs (source 1 for
    the first run, ...); a multi-fidelity run's at its lowest fidelity, what a screened strategy
    hears of its own."""
    return [
        (i + 1, r) for i, run_dir in enumerate(experiment.warm_start) for r in _scored(experiment, i, run_dir)
    ]


def _scored(experiment: Experiment, i: int, run_dir: str) -> list[Record]:
    from einspace.search.config import grammar_digest
    from einspace.search.loop import STORE_NAME, SearchRun

    key = f"warm_start[{i}] {run_dir}"
    if not Path(run_dir).is_dir():
        raise EinspaceError(f"{key}: no such run directory")
    if not (Path(run_dir) / STORE_NAME).is_file():
        raise EinspaceError(f"{key}: is not a search run directory (no {STORE_NAME} in it)")
    try:
        with SearchRun.open(run_dir) as run:
            history, earlier = run.store.history(), run.experiment
    except EinspaceError as exc:
        raise EinspaceError(f"{key}: {exc}") from None
    if earlier is None:
        raise EinspaceError(f"{key}: its experiment cannot be read")
    if grammar_digest(earlier.grammar) != grammar_digest(experiment.grammar):
        raise EinspaceError(
            f"{key}: searched grammar {earlier.grammar!r}, not {experiment.grammar!r} (a warm start "
            "needs the same grammar)"
        )
    results = heard_results(history)
    if not any(r.status == Status.OK for r in results):
        raise EinspaceError(f"{key}: has no scored evaluation to learn from")
    return results


def heard_results(history: list[Record]) -> list[Record]:
    """The scored and failed evaluations of a run as its strategy heard them: a multi-fidelity
    run's at its lowest fidelity (later rungs and cached repeats left out)."""
    finished = [r for r in history if r.status in (Status.OK, Status.FAILED)]
    lowest = min((r.fidelity for r in finished if r.fidelity is not None), default=None)
    return [r for r in finished if r.fidelity == lowest]


def warm_start(strategy: Strategy, experiment: Experiment) -> int:
    """Give a fresh strategy's surrogate the warm-start runs' results; how many."""
    from einspace.search.surrogate import tree_features
    from einspace.tree import parse_tree

    surrogate = surrogate_of(strategy)
    if surrogate is None:
        raise EinspaceError("warm_start needs a surrogate to start")
    space = strategy.space
    results = earlier_results(experiment)
    for source, r in results:
        fitness = r.fitness if r.status == Status.OK and r.fitness is not None else float("-inf")
        surrogate.add(tree_features(parse_tree(r.tree), space.grammar, space.input), fitness, source)
    return len(results)

"""Benchmark (not a test): how well surrogates rank, replayed offline on searches already run
(issue 26's target: Spearman's rho >= 0.5 once 50 results are in).

A search that screens with a surrogate measures its rank correlation online, but only for the one
feature set and model it ran with, and only on the children it chose. This replays a finished
run's own history instead: for each result from the 51st on (results at the lowest fidelity, in
the order the strategy heard them; a failed one counts as -inf, the worst), a surrogate fitted to
the results before it, refitted as the online one is (whenever the results have grown by a fifth),
predicts it; rho is computed over those (prediction, result) pairs. Every feature set and model
below sees exactly the same results, so their rho can be compared within one run.

Feature sets (`FEATURES`): `tree` is `einspace.search.surrogate.tree_features`, what the online
surrogate uses; the others leave a part of it out, to see what that part is worth: `no-calls` the
operations with their arguments (does detail help or dilute?), `no-shapes` the shapes
(`shape_features`: what the surrogate saw before they were added).

Run directories come from `benchmarks/search_efficiency.py --keep-runs` (OUT/runs/*/run) or any
`einspace search`:

    python benchmarks/search_efficiency.py --tasks motifs --methods RE RE+S --keep-runs
    python benchmarks/surrogate_ranking.py runs/search_efficiency/runs/*/run
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from _harness import RHO_RESULTS, weighed_mean

if TYPE_CHECKING:
    from einspace.checker import CheckedTree
    from einspace.grammar.model import Grammar
    from einspace.search.strategy import SearchSpace
    from einspace.state import FeatureState
    from einspace.tree import Node


Features = Callable[["Node", "Grammar", "FeatureState", "CheckedTree | None"], dict[str, float]]


def _tree(tree: Node, grammar: Grammar, input: FeatureState, checked: CheckedTree | None) -> dict[str, float]:
    from einspace.search.surrogate import tree_features

    return tree_features(tree, grammar, input, checked)


def _without(*prefixes: str) -> Features:
    """The tree's features less those whose names start with one of `prefixes`."""

    def features(
        tree: Node, grammar: Grammar, input: FeatureState, checked: CheckedTree | None
    ) -> dict[str, float]:
        return {k: v for k, v in _tree(tree, grammar, input, checked).items() if not k.startswith(prefixes)}

    return features


#: The names of `einspace.search.surrogate.shape_features`: their prefixes.
SHAPES = ("head_", "min_")
FEATURES: dict[str, Features] = {
    "tree": _tree,
    "no-calls": _without("call:"),
    "no-shapes": _without(*SHAPES),
}


def run_results(
    run_dir: str,
) -> tuple[SearchSpace, list[tuple[Node, CheckedTree | None]], list[float], str]:
    """A run's search space, its results as its strategy heard them (the lowest fidelity, cached
    repeats left out): each tree with its check (None if it no longer checks) and its fitness
    (-inf: failed), and its dataset's name (the file's stem)."""
    from einspace.checker import check_tree
    from einspace.errors import EinspaceError
    from einspace.evaluators.base import Status
    from einspace.search.loop import SearchRun
    from einspace.search.warm_start import heard_results
    from einspace.tree import parse_tree

    with SearchRun.open(run_dir) as run:
        history, experiment = run.store.history(), run.experiment
    if experiment is None:
        raise SystemExit(f"{run_dir}: its experiment cannot be read")
    space = experiment.space()
    trees, fitness = [], []
    for r in heard_results(history):
        tree = parse_tree(r.tree)
        try:
            checked = check_tree(tree, space.grammar, space.input)
        except EinspaceError:
            checked = None
        trees.append((tree, checked))
        fitness.append(r.fitness if r.status == Status.OK and r.fitness is not None else -math.inf)
    return space, trees, fitness, Path(str(experiment.evaluator.settings.get("dataset", "?"))).stem


def replay(
    rows: list[dict[str, float]], fitness: list[float], model: str, seed: int, after: int = RHO_RESULTS
) -> float:
    """Spearman's rho of each result from the `after`+1-th on against the prediction of a
    surrogate fitted (online, refitted as the search's is) to the results before it."""
    from einspace.search.surrogate import Surrogate, rank_correlation

    surrogate = Surrogate(model, random_seed=seed, min_results=after)
    pairs = []
    for i, (row, value) in enumerate(zip(rows, fitness, strict=True)):
        if i >= after and surrogate.ready:
            pairs.append((surrogate.predict([row])[0], value))
        surrogate.add(row, value)
    return rank_correlation(pairs)


def _name(run_dir: Path) -> str:
    """A kept benchmark run's TASK_METHOD_SEED (its directory holds the run as `run`)."""
    return run_dir.parent.name if run_dir.name == "run" else run_dir.name


def main() -> None:
    from einspace.search.surrogate import SURROGATES

    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("runs", nargs="+", help="search run directories")
    parser.add_argument("--features", nargs="+", choices=list(FEATURES), default=list(FEATURES))
    parser.add_argument("--models", nargs="+", choices=list(SURROGATES), default=list(SURROGATES))
    parser.add_argument(
        "--after", type=int, default=RHO_RESULTS, help="results in before predictions count (default 50)"
    )
    args = parser.parse_args()
    variants = [(f, m) for f in args.features for m in args.models]
    print("run".ljust(28) + "results".rjust(8) + "".join(f"{f}/{m}".rjust(29) for f, m in variants))
    table: dict[tuple[str, str], list[tuple[float, int, str]]] = {v: [] for v in variants}
    for run_dir in args.runs:
        if not (Path(run_dir) / "search.sqlite").is_file():
            continue
        space, trees, fitness, dataset = run_results(run_dir)
        line = _name(Path(run_dir))[:27].ljust(28) + str(len(fitness)).rjust(8)
        if len(fitness) <= args.after + 2:
            print(line + "  (too few results)")
            continue
        rows = {f: [FEATURES[f](t, space.grammar, space.input, c) for t, c in trees] for f in args.features}
        for f, m in variants:
            rho = replay(rows[f], fitness, m, seed=0, after=args.after)
            table[(f, m)].append((rho, len(fitness) - args.after, dataset))
            line += f"{rho:29.2f}"
        print(line, flush=True)
    datasets = sorted({d for rows in table.values() for _, _, d in rows})
    for dataset in [*datasets, None] if len(datasets) > 1 else [None]:
        for label, weighed in (("mean", False), ("by predictions", True)):
            means = [_mean([r for r in table[x] if dataset in (None, r[2])], weighed) for x in variants]
            label = f"{label}, {dataset or 'all'}"
            print(label[:35].ljust(36) + "".join(f"{m:29.2f}" for m in means))


def _mean(rhos: list[tuple[float, int, str]], weighed: bool) -> float:
    """The mean rho over runs (a run with no rho left out), weighed by predictions or not."""
    return weighed_mean([(rho, n if weighed else 1) for rho, n, _ in rhos if math.isfinite(rho)])


if __name__ == "__main__":
    main()

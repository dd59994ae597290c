"""Multi-objective regularised evolution (`pareto_evolution`) against random search on digits:
validation accuracy (max) against parameters (min), at equal compute.

Each method searches with the quick start's training settings (experiments/quickstart.yaml: 4
epochs, one thread, its FLOP, activation and time budgets, at most 50k parameters) from no seed
trees, for each random seed, until the evaluations it trained have used `--compute` seconds of
compute (CPU seconds here, as `einspace report` counts them). The hypervolume of the feasible
results against the reference point (accuracy 0, 50,000 parameters) is printed at fractions of
that compute, per seed, then the mean final hypervolume of each method.

    python benchmarks/pareto.py                      # 3 seeds, 150 compute seconds each, 2 jobs
    python benchmarks/pareto.py --compute 60 --jobs 1
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from concurrent.futures import as_completed
from pathlib import Path
from typing import Any

from _harness import confine_worker, quickstart, search_pool

METHODS = {
    "pareto_evolution": {"population": 16, "tournament": 4},
    "random_search": {},
}
REFERENCE = [0.0, 50_000]
FRACTIONS = (0.25, 0.5, 0.75, 1.0)


def _raw(method: str, seed: int, run_dir: Path) -> dict[str, Any]:
    raw = quickstart()
    return {
        **raw,
        "name": f"pareto_{method}_{seed}",
        "run_dir": str(run_dir),
        "random_seed": seed,
        "strategy": {"name": method, "settings": {"evaluations": 100_000, **METHODS[method]}},
        "seeds": [],
        "multi_objective": {
            "objectives": [{"name": "fitness", "direction": "max"}, {"name": "params", "direction": "min"}],
            "reference": REFERENCE,
        },
        "executor": {"kind": "in_process"},
    }


def _search(method: str, seed: int, budget: float, root: str) -> list[tuple[float, float]]:
    """One search until `budget` compute seconds; its hypervolume over compute."""
    confine_worker()
    from einspace.search import compute
    from einspace.search.config import parse_experiment
    from einspace.search.loop import SearchRun
    from einspace.search.multi_objective import Objectives

    e = parse_experiment(_raw(method, seed, Path(root) / f"{method}_{seed}"), "benchmarks/pareto.py")
    spent = {"s": 0.0}

    def on_result(record: Any, strategy: Any) -> None:
        spent["s"] += compute.compute_of(record)

    with SearchRun.start(e) as run:
        run.run(e.make_executor(), on_result=on_result, should_stop=lambda: spent["s"] >= budget)
        space = e.space()
        objectives = Objectives.of(e.multi_objective, space.grammar, space.input)
        assert objectives is not None
        return objectives.hypervolume_over_compute(run.store.history())


def _at(curve: list[tuple[float, float]], seconds: float) -> float:
    """The hypervolume once `seconds` of compute were spent (that of the last result before)."""
    reached = [hv for spent, hv in curve if spent <= seconds]
    return reached[-1] if reached else 0.0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--compute", type=float, default=150.0, help="compute seconds per search")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--jobs", type=int, default=2)
    args = parser.parse_args(argv)
    runs = [(m, s) for s in range(args.seeds) for m in METHODS]
    marks = [f * args.compute for f in FRACTIONS]
    print(
        f"hypervolume (accuracy x parameters below {REFERENCE[1]:,}) at compute seconds "
        + ", ".join(f"{m:g}" for m in marks),
        flush=True,
    )
    finals: dict[str, list[float]] = {m: [] for m in METHODS}
    with tempfile.TemporaryDirectory() as root, search_pool(args.jobs) as pool:
        futures = {pool.submit(_search, *run, args.compute, root): run for run in runs}
        for future in as_completed(futures):  # each as it finishes: a long run keeps what it has
            (method, seed), curve = futures[future], future.result()
            values = [_at(curve, m) for m in marks]
            finals[method].append(values[-1])
            line = "  ".join(f"{v:9.1f}" for v in values)
            print(f"  {method:17s} seed {seed}: {line}   ({len(curve)} results)", flush=True)
    for method, values in finals.items():
        sd = statistics.stdev(values) if len(values) > 1 else 0.0
        print(f"mean final hypervolume {method}: {statistics.mean(values):9.1f} ± {sd:.1f} (n={len(values)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())

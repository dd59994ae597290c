"""Does sampling from a learned grammar beat sampling from the original? Digits tasks, equal evaluations.

    python benchmarks/learned_probabilities.py [--evaluations 30] [--epochs 8] [--seeds 3] [--quick]

For each bundled digits task (digits 1x8x8; adddigits and multdigits 3x8x8) and each random seed,
three arms train the same number K of sampled networks with the same recipe and budgets:

- original: random search, K samples from the paper's grammar (`grammars/einspace.pcfg`);
- learned:  random search, K samples from a grammar learned (`einspace learn-probabilities`, its
            defaults: the fittest quarter, prior strength 10) from the *original* arm's run of the
            next seed on the same task: learned on other evaluations, so its K are all fresh;
- online:   the `estimation_of_distribution` strategy, K in all: the first K/3 from the original
            grammar, then from a grammar re-learned from the 8 best every 5 results.

All arms sample in the exact mode (the grammar's distribution given validity, so that the learned
probabilities mean what they say) with the quick start's limits and budgets. Reported per arm: the
best validation accuracy of its K (what a random search returns), their mean (the quality of the
distribution itself), and how many failed (over a budget, or a training error), each as the mean
over seeds with the per-seed values. Runs are kept under runs/benchmarks/learned_probabilities/
(`epochs<E>/`, `quick/` for --quick) and resumed if the script is run again (delete it to start over).
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path
from typing import Any

from einspace.search.config import parse_experiment
from einspace.search.executors import InProcessExecutor
from einspace.search.learn import learn_from_run
from einspace.search.loop import open_store, run_search
from einspace.search.store import Record

ROOT = Path("runs/benchmarks/learned_probabilities")
TASKS = {"digits": [1, 8, 8], "adddigits": [3, 8, 8], "multdigits": [3, 8, 8]}
ARMS = ("original", "learned", "online")


def experiment(
    root: Path, task: str, arm: str, seed: int, evaluations: int, epochs: int, grammar: str
) -> dict[str, Any]:
    strategy: dict[str, Any] = {"name": "random_search", "settings": {"evaluations": evaluations}}
    if arm == "online":
        settings = {
            "evaluations": evaluations,
            "warmup": max(1, evaluations // 3),
            "elite": 8,
            "update_every": 5,
        }
        strategy = {"name": "estimation_of_distribution", "settings": settings}
    return {
        "name": f"{task}_{arm}_{seed}",
        "run_dir": str(root / task / f"{arm}_{seed}"),
        "random_seed": seed,
        "grammar": grammar,
        "sampling": "exact",
        "input": {"shape": TASKS[task], "mode": "im"},
        "limits": {"max_depth": 20, "max_nodes": 200, "max_params": 50_000},
        "evaluator": {
            "name": "training",
            "settings": {
                "dataset": task,
                "epochs": epochs,
                "batch_size": 128,
                "threads": 1,
                "max_flops": 8_000_000,
                "max_activation_mb": 200,
                "max_seconds": 20,
            },
        },
        "strategy": strategy,
        "executor": {"kind": "in_process"},
    }


def run(raw: dict[str, Any]) -> list[Record]:
    """Run (or resume) one arm; its records, cached copies excluded."""
    exp = parse_experiment(raw, f"{raw['name']}.yaml")
    store = open_store(exp, Path(raw["run_dir"]))
    try:
        run_search(exp, InProcessExecutor(1), store)
        history = store.history()
    finally:
        store.close()
    return [r for r in history if r.status != "cached"]


def scores(records: list[Record]) -> tuple[float, float, int]:
    """(best, mean, failed): accuracies of the successful evaluations; failures count as absent."""
    ok = [r.fitness for r in records if r.status == "ok" and r.fitness is not None]
    return max(ok, default=float("nan")), statistics.fmean(ok) if ok else float("nan"), len(records) - len(ok)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--evaluations", type=int, default=30, help="K, per arm, task and seed")
    parser.add_argument("--epochs", type=int, default=8, help="training epochs (the paper's recipe: 8)")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--tasks", nargs="+", default=list(TASKS), choices=list(TASKS))
    parser.add_argument("--quick", action="store_true", help="digits only, K = 6, one epoch, 2 seeds")
    args = parser.parse_args(argv)
    if args.quick:
        args.evaluations, args.epochs, args.seeds, args.tasks = 6, 1, 2, ["digits"]
    seeds = list(range(args.seeds))
    root = ROOT / ("quick" if args.quick else f"epochs{args.epochs}")
    started = time.perf_counter()
    results: dict[tuple[str, str, int], tuple[float, float, int]] = {}
    for task in args.tasks:
        for seed in seeds:
            raw = experiment(root, task, "original", seed, args.evaluations, args.epochs, "einspace")
            results[(task, "original", seed)] = scores(run(raw))
        for seed in seeds:
            source = root / task / f"original_{(seed + 1) % len(seeds)}"
            grammar = root / task / f"learned_from_original_{(seed + 1) % len(seeds)}.pcfg"
            learn_from_run(source, grammar)
            raw = experiment(
                root, task, "learned", seed, args.evaluations, args.epochs, str(grammar.resolve())
            )
            results[(task, "learned", seed)] = scores(run(raw))
        for seed in seeds:
            raw = experiment(root, task, "online", seed, args.evaluations, args.epochs, "einspace")
            results[(task, "online", seed)] = scores(run(raw))
        print(f"{task} done after {time.perf_counter() - started:.0f} s", flush=True)
    print(
        f"\nValidation accuracy, K = {args.evaluations} trained networks per arm, {args.epochs} epochs, "
        f"seeds {seeds}; mean over seeds [per seed]"
    )
    print(f"{'task':<11} {'arm':<9} {'best of K':<30} {'mean of K':<30} {'failed':<12}")
    for task in args.tasks:
        for arm in ARMS:
            cells = []
            for column in range(3):
                values = [results[(task, arm, s)][column] for s in seeds]
                digits = 0 if column == 2 else 3  # failures: a count per seed, their mean to one decimal
                per_seed = ", ".join(f"{v:.{digits}f}" for v in values)
                cells.append(f"{statistics.fmean(values):.{max(digits, 1)}f} [{per_seed}]")
            print(f"{task:<11} {arm:<9} {cells[0]:<30} {cells[1]:<30} {cells[2]:<12}")
    print(f"\ntotal {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()

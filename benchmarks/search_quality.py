"""Benchmark (not a test): search quality at a CPU-sized budget, after the paper's Table 1.

On the built-in datasets, for each random seed, three methods with the same training recipe:

- seed:  the small ResNet seed (`resnet_small`) alone, its one evaluation;
- RE:    regularised evolution whose initial population is that seed (paper's RE(RN18)),
         K evaluations;
- RS:    random search, K fresh samples from the grammar, the best on validation.

The seed's number is the seed's own evaluation inside the RE run (the record of origin
`seed:resnet_small`, trained with the same random seed), so it costs nothing extra. Each
method's best (by validation) is then retrained on train+valid for the same epochs and scored
on test. Means and standard deviations over the random seeds are printed per dataset.

Budgets and recipe are experiments/quickstart.yaml's (4 epochs, batch 128, at most 50k
parameters, 8M FLOPs, 200 MiB of estimated activations). Execution: every search runs with the
in-process executor (one evaluation at a time, torch on one thread) in its own worker process
(address space capped at 6 GiB, so a runaway allocation is a failed evaluation, not a killed
worker), `--jobs` searches at once (default 2, one per core of a 2-core machine). The Ray
executor would give the same results; it is not needed here.

    python benchmarks/search_quality.py                 # digits + adddigits, 3 seeds, K = 60 (~30 min)
    python benchmarks/search_quality.py --quick         # digits only, 3 seeds, K = 30 (~4 min)
"""

from __future__ import annotations

import argparse
import math
import statistics
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

SEED = "resnet_small"
MEMORY_LIMIT_GB = 6  # per search process
METHODS = ("seed_alone", "RE", "RS")
INPUTS = {"digits": [1, 8, 8], "adddigits": [3, 8, 8], "multdigits": [3, 8, 8]}


def _experiment(dataset: str, method: str, seed: int, k: int, epochs: int, run_dir: Path) -> Any:
    from einspace.search.config import parse_experiment

    strategy: dict[str, Any] = (
        {"name": "regularised_evolution", "settings": {"evaluations": k, "population": 10, "tournament": 3}}
        if method == "RE"
        else {"name": "random_search", "settings": {"evaluations": k}}
    )
    raw = {
        "name": f"{dataset}_{method}_{seed}",
        "run_dir": str(run_dir),
        "random_seed": seed,
        "grammar": "einspace",
        "input": {"shape": INPUTS[dataset], "mode": "im"},
        "limits": {"max_depth": 20, "max_nodes": 200, "max_params": 50000},
        "evaluator": {
            "name": "training",
            "settings": {
                "dataset": dataset,
                "epochs": epochs,
                "batch_size": 128,
                "threads": 1,
                "max_seconds": 20,
            },
        },
        "strategy": strategy,
        "seeds": [SEED] if method == "RE" else [],
        "executor": {"kind": "in_process"},
    }
    return parse_experiment(raw, "search_quality")


def _test_accuracy(tree_text: str, dataset: str, epochs: int, seed: int) -> float:
    from einspace.evaluators.training import final_evaluation
    from einspace.tree import parse_tree

    metrics = final_evaluation(
        parse_tree(tree_text), dataset, "einspace", {"epochs": epochs, "batch_size": 128, "threads": 1}, seed
    )
    return metrics["test_accuracy"]


def run_one(dataset: str, method: str, seed: int, k: int, epochs: int) -> dict[str, Any]:
    """One search; returns the best validation accuracy (and the seed's, for RE) with test accuracies."""
    import resource

    import torch

    from einspace.search.loop import open_store, run_search
    from einspace.search.report import best_records

    torch.set_num_threads(1)
    # A tree whose memory the analytic estimate misses fails with an allocation error (recorded
    # as a failed evaluation) instead of the kernel killing the whole worker.
    limit = MEMORY_LIMIT_GB << 30
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        e = _experiment(dataset, method, seed, k, epochs, Path(tmp) / "run")
        store = open_store(e)
        try:
            run_search(e, e.executor(), store)
            history = store.history()
        finally:
            store.close()
    out: dict[str, Any] = {
        "dataset": dataset,
        "seed": seed,
        "failed": sum(r.status == "failed" for r in history),
    }
    best = best_records(history, 1)[0]
    out[method] = (best.fitness, _test_accuracy(best.tree, dataset, epochs, seed), best.origin)
    if method == "RE":
        own = next(r for r in history if r.origin == f"seed:{SEED}" and r.status != "cached")
        out["seed_alone"] = (own.fitness, _test_accuracy(own.tree, dataset, epochs, seed), own.origin)
    out["seconds"] = time.perf_counter() - started
    return out


def _mean_sd(values: list[float]) -> str:
    mean = statistics.fmean(values)
    sd = statistics.stdev(values) if len(values) > 1 else math.nan
    return f"{100 * mean:5.1f} ± {100 * sd:4.1f}"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--datasets", nargs="+", default=None, choices=sorted(INPUTS))
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument(
        "--evaluations", type=int, default=None, help="K, per search (default 60; 30 --quick)"
    )
    parser.add_argument("--epochs", type=int, default=4, help="training epochs per evaluation (default 4)")
    parser.add_argument("--jobs", type=int, default=2, help="searches at once (default 2)")
    parser.add_argument("--quick", action="store_true", help="digits only, K = 30")
    args = parser.parse_args()
    datasets = args.datasets or (["digits"] if args.quick else ["digits", "adddigits"])
    k = args.evaluations or (30 if args.quick else 60)
    jobs = [(d, m, s, k, args.epochs) for d in datasets for s in args.seeds for m in ("RE", "RS")]
    print(
        f"search quality: K = {k} evaluations per search, {args.epochs} epochs each, seeds {args.seeds}; "
        f"in-process executor, {args.jobs} searches at once"
    )
    started = time.perf_counter()
    results = []
    with ProcessPoolExecutor(args.jobs, max_tasks_per_child=1) as pool:
        for r in pool.map(run_one, *zip(*jobs, strict=True)):  # in order; each line as soon as it is known
            results.append(r)
            parts = "  ".join(
                f"{m} valid {100 * r[m][0]:.1f} test {100 * r[m][1]:.1f}" for m in METHODS if m in r
            )
            print(f"  {r['dataset']} seed {r['seed']}: {parts}  ({r['seconds']:.0f} s)", flush=True)
    print(f"total {time.perf_counter() - started:.0f} s\n")
    header = (
        f"{'dataset':<10} {'method':<18} {'valid acc %':>14} {'test acc % (best)':>18}   per seed (valid)"
    )
    print(header)
    print("-" * len(header))
    names = {"seed_alone": f"{SEED} alone", "RE": f"RE({SEED})", "RS": "random search"}
    for d in datasets:
        rows = [r for r in results if r["dataset"] == d]
        for method in METHODS:
            got = sorted((r["seed"], r[method]) for r in rows if method in r)
            valid = [v for _, (v, _, _) in got]
            test = [t for _, (_, t, _) in got]
            per = "  ".join(f"{100 * v:.1f}" for v in valid)
            print(f"{d:<10} {names[method]:<18} {_mean_sd(valid):>14} {_mean_sd(test):>18}   {per}")
        failed = sum(r["failed"] for r in rows)
        print(
            f"{'':<10} (failed evaluations: {failed}; search seconds: {sum(r['seconds'] for r in rows):.0f})"
        )


if __name__ == "__main__":
    main()

"""Benchmark (not a test): search quality at a CPU-sized budget, after the paper's Table 1.

On the built-in datasets, for each random seed, three methods with the same training recipe:

- seed:  the small ResNet seed (`resnet_small`) alone, its one training run;
- RE:    regularised evolution whose initial population is that seed (the paper's RE(RN18));
- RS:    random search, fresh samples from the grammar, the best on validation.

RE and RS are compared at the same number T of *trained* networks: each search stops once T of
its evaluations have finished training (status ok). Cached duplicates (RE's initial population
is `population` copies of one seed: one is trained, the others are served from the cache; a
mutation or a sample that repeats an earlier tree is served the same way) and failed
evaluations (over a budget, refused at once from the analytic counts, or over the time limit)
do not count towards T; both are reported per method. The seed's number is its own training
run inside the RE search (the record of origin `seed:resnet_small`), so it costs nothing extra
(nan where that run failed, e.g. over the time limit).
Each method's best tree (by validation) is then retrained on train+valid with the same epochs,
batch size and thread count (no time limit) and scored on test; means and standard deviations
over the random seeds are printed per dataset.

Everything else is experiments/quickstart.yaml's, read from that file and printed at the start:
the grammar, the limits (depth, nodes, 50k parameters), the training evaluator's settings (its
epochs, batch size, thread, 8M-FLOP and 200-MiB activation budgets and time limit) and the
regularised-evolution settings (population, tournament, crossover); only the dataset and the
input shape change per dataset, and `--max-seconds` replaces the time limit where asked (10 s of
wall time on a machine shared with other work can be a fraction of that of CPU time). Execution:
every search runs with the in-process executor (one evaluation at a time) in its own worker
process (address space capped at 6 GiB, so a runaway allocation is a failed evaluation, not a
killed worker), `--jobs` searches at once (default 2, one per core of a 2-core machine). The Ray
executor would give the same results.

    python benchmarks/search_quality.py                 # digits + adddigits, 3 seeds, T = 60
    python benchmarks/search_quality.py --quick         # digits only, 3 seeds, T = 30
"""

from __future__ import annotations

import argparse
import json
import math
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from _harness import (
    QUICKSTART,
    confine_worker,
    failure_kind,
    mean_sd,
    quickstart,
    retraining,
    search_pool,
    test_accuracy,
)

METHODS = ("seed_alone", "RE", "RS")
INPUTS = {"digits": [1, 8, 8], "adddigits": [3, 8, 8], "multdigits": [3, 8, 8]}
#: K, the strategy's own budget, only needs to be out of reach: the search stops at T trained.
CANDIDATES_PER_TRAINED = 20


def _raw_experiment(
    dataset: str, method: str, seed: int, trained: int, run_dir: Path, max_seconds: float | None = None
) -> dict[str, Any]:
    raw = quickstart()
    settings = dict(raw["evaluator"]["settings"], dataset=dataset)
    if max_seconds is not None:
        settings["max_seconds"] = max_seconds
    budget = {"evaluations": CANDIDATES_PER_TRAINED * trained}
    strategy = (
        {"name": "regularised_evolution", "settings": {**raw["strategy"]["settings"], **budget}}
        if method == "RE"
        else {"name": "random_search", "settings": budget}
    )
    return {
        **raw,
        "name": f"{dataset}_{method}_{seed}",
        "run_dir": str(run_dir),
        "random_seed": seed,
        "input": {"shape": INPUTS[dataset], "mode": "im"},
        "evaluator": {"name": raw["evaluator"]["name"], "settings": settings},
        "strategy": strategy,
        "seeds": raw["seeds"] if method == "RE" else [],
        "executor": {"kind": "in_process"},
    }


def _final_settings() -> dict[str, Any]:
    """The retraining on train+valid: the search's epochs, batch size and threads."""
    return retraining(quickstart()["evaluator"]["settings"])


def _test_accuracy(tree_text: str, dataset: str, seed: int) -> float:
    return test_accuracy(tree_text, dataset, quickstart()["grammar"], _final_settings(), seed)


def run_one(dataset: str, method: str, seed: int, trained: int, max_seconds: float | None) -> dict[str, Any]:
    """One search, stopped after `trained` networks trained; its best (and for RE the seed's own
    evaluation) with validation and test accuracies, and what the search evaluated."""
    from einspace.search.config import parse_experiment
    from einspace.search.loop import open_store, run_search
    from einspace.search.report import best_records

    confine_worker()
    started = time.perf_counter()
    counts: Counter[str] = Counter()
    with tempfile.TemporaryDirectory() as tmp:
        raw = _raw_experiment(dataset, method, seed, trained, Path(tmp) / "run", max_seconds)
        e = parse_experiment(raw, "search_quality")
        store = open_store(e)
        try:
            run_search(
                e,
                e.make_executor(),
                store,
                on_result=lambda record, _: counts.update([record.status]),
                should_stop=lambda: counts["ok"] >= trained,
            )
            history = store.history()
        finally:
            store.close()
    if counts["ok"] != trained:
        raise RuntimeError(f"{dataset} {method} seed {seed}: trained {counts['ok']} of {trained} networks")
    failures = Counter(failure_kind(r.error) for r in history if r.status == "failed")
    out: dict[str, Any] = {
        "dataset": dataset,
        "method": method,
        "seed": seed,
        "evaluated": len(history),
        "trained": counts["ok"],
        "cached": counts["cached"],
        "failed": dict(failures),
    }
    best = best_records(history, 1)[0]
    out[method] = (best.fitness, _test_accuracy(best.tree, dataset, seed), best.origin)
    if method == "RE":
        own = next(r for r in history if r.origin.startswith("seed:") and r.status != "cached")
        valid = own.fitness if own.status == "ok" else math.nan  # nan: its evaluation failed
        out["seed_alone"] = (valid, _test_accuracy(own.tree, dataset, seed), own.origin)
    out["seconds"] = time.perf_counter() - started
    return out


def _describe_setup(trained: int, max_seconds: float | None) -> str:
    raw = _raw_experiment("digits", "RE", 0, trained, Path("."), max_seconds)
    shared = {
        "source": str(QUICKSTART.relative_to(QUICKSTART.parents[1])),
        "grammar": raw["grammar"],
        "limits": raw["limits"],
        "evaluator": {**raw["evaluator"], "settings": {**raw["evaluator"]["settings"], "dataset": "*"}},
        "RE": {**raw["strategy"]["settings"], "seeds": raw["seeds"]},
        "final retraining on train+valid": _final_settings(),
    }
    del shared["RE"]["evaluations"]
    return json.dumps(shared)


def _report(results: list[dict[str, Any]], datasets: list[str]) -> None:
    header = (
        f"{'dataset':<10} {'method':<18} {'valid acc %':>14} {'test acc % (best)':>18}   per seed (valid)"
    )
    print(header)
    print("-" * len(header))
    seed = quickstart()["seeds"][0]
    names = {"seed_alone": f"{seed} alone", "RE": f"RE({seed})", "RS": "random search"}
    for d in datasets:
        rows = [r for r in results if r["dataset"] == d]
        for method in METHODS:
            got = sorted((r["seed"], r[method]) for r in rows if method in r)
            valid = [v for _, (v, _, _) in got]
            test = [t for _, (_, t, _) in got]
            per = "  ".join(f"{100 * v:.1f}" for v in valid)
            print(f"{d:<10} {names[method]:<18} {mean_sd(valid):>14} {mean_sd(test):>18}   {per}")
        for method in ("RE", "RS"):
            runs = [r for r in rows if r["method"] == method]
            failed: Counter[str] = Counter()
            for r in runs:
                failed.update(r["failed"])
            reasons = ", ".join(f"{n} {kind}" for kind, n in sorted(failed.items())) or "none"
            print(
                f"{'':<10} {method}: {sum(r['trained'] for r in runs)} trained, "
                f"{sum(r['cached'] for r in runs)} cached duplicates, "
                f"{sum(failed.values())} failed ({reasons}) of {sum(r['evaluated'] for r in runs)} "
                f"candidates; {sum(r['seconds'] for r in runs):.0f} s"
            )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--datasets", nargs="+", default=None, choices=sorted(INPUTS))
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument(
        "--trained", type=int, default=None, help="T, trained networks per search (default 60; 30 --quick)"
    )
    parser.add_argument("--jobs", type=int, default=2, help="searches at once (default 2)")
    parser.add_argument("--quick", action="store_true", help="digits only, T = 30")
    parser.add_argument(
        "--max-seconds",
        type=float,
        default=None,
        help="the evaluator's time limit instead of the quick start's (on a machine shared with other "
        "work, where 10 s of wall time can be a fraction of that of CPU time)",
    )
    args = parser.parse_args()
    datasets = args.datasets or (["digits"] if args.quick else ["digits", "adddigits"])
    trained = args.trained or (30 if args.quick else 60)
    jobs = [(d, m, s, trained, args.max_seconds) for d in datasets for s in args.seeds for m in ("RE", "RS")]
    print(
        f"search quality: each search stops at T = {trained} trained networks; datasets {datasets}, "
        f"seeds {args.seeds}; in-process executor, {args.jobs} searches at once\n"
        f"shared settings: {_describe_setup(trained, args.max_seconds)}"
    )
    started = time.perf_counter()
    results = []
    with search_pool(args.jobs) as pool:
        for r in pool.map(run_one, *zip(*jobs, strict=True)):  # in order; each line as soon as it is known
            results.append(r)
            parts = "  ".join(
                f"{m} valid {100 * r[m][0]:.1f} test {100 * r[m][1]:.1f}" for m in METHODS if m in r
            )
            print(
                f"  {r['dataset']} seed {r['seed']} {r['method']}: {parts}  ({r['trained']} trained, "
                f"{r['cached']} cached, {sum(r['failed'].values())} failed; {r['seconds']:.0f} s)",
                flush=True,
            )
    print(f"total {time.perf_counter() - started:.0f} s\n")
    _report(results, datasets)


if __name__ == "__main__":
    main()

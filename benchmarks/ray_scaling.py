"""Benchmark (not a test): how a search scales with evaluations in flight on a local Ray instance.

Two kinds of rows:

- sleep: each evaluation sleeps 1 s (plus the tiny real work of checking the tree and an
  analytic fitness) and asks for a quarter of a CPU, so 8 run at once on a 2-core machine.
  The ideal here is N evaluations/s with N in flight: what is lost against it is orchestration
  overhead only (dispatch, result transfer, the driver's ask/tell/store/checkpoint), not
  computation. The strategy is regularised evolution.
- train: real (small) training evaluations, the quick start's recipe (digits, 4 epochs, batch
  128, one torch thread, its budgets) with one CPU per evaluation. The ideal with N in flight is
  min(N, CPUs) times the rate of the 1-in-flight row: N trainings can only overlap on N cores.
  The strategy is random search, whose candidates do not depend on results, so every N trains
  the same networks.

Rates count evaluations that ran (slept or trained, or failed at once over a budget); cached
duplicates, which cost neither, are reported apart and counted in neither the rate nor the
ideal. Worker start-up (a process and a torch import per worker, paid once per run) is timed
apart, before the run, in its own column. The driver's overhead per evaluation is measured by
the run loop.

    python benchmarks/ray_scaling.py [--per-slot 8] [--in-flight 1 2 4 8] [--train-in-flight 1 2]
"""

from __future__ import annotations

import argparse
import math
import tempfile
import time
from pathlib import Path

from einspace.evaluators.base import Evaluator, register_evaluator

SLEEP_S = 1.0
#: The quick start's training recipe and budgets (experiments/quickstart.yaml).
TRAINING = {
    "dataset": "digits",
    "epochs": 4,
    "batch_size": 128,
    "threads": 1,
    "max_flops": 8_000_000,
    "max_activation_mb": 200,
    "max_seconds": 10,
}

if __name__ != "__main__":  # imported as a plugin (driver and workers): register the evaluator once

    @register_evaluator
    class SleepEvaluator(Evaluator):
        """A simulated training run: sleep, then an analytic fitness from the parameter count."""

        name = "bench_sleep"

        def __init__(self, seconds: float = SLEEP_S):
            self.seconds = seconds

        def evaluate(self, checked, random_seed):  # noqa: ANN001, ANN201
            time.sleep(self.seconds)
            return {"fitness": -abs(math.log10(checked.params + 1) - 4.0)}


def _experiment(run_dir: Path, kind: str, in_flight: int, evaluations: int, fresh: bool):  # noqa: ANN202
    from einspace.search.config import parse_experiment

    if kind == "sleep":
        raw = {
            "input": {"shape": [3, 32, 32]},
            "limits": {"max_depth": 16, "max_nodes": 120},
            "evaluator": {"name": "bench_sleep", "settings": {"seconds": SLEEP_S}},
            # A population smaller than the run so the timed part is mostly steady-state evolution.
            "strategy": {
                "name": "regularised_evolution",
                "settings": {
                    "evaluations": evaluations,
                    "population": max(4, evaluations // 4),
                    "tournament": 3,
                },
            },
            "plugins": [str(Path(__file__).resolve())],
            "executor": {"kind": "ray", "max_in_flight": in_flight, "num_cpus": 0.25, "fresh_process": fresh},
        }
    else:
        raw = {
            "input": {"shape": [1, 8, 8]},
            "limits": {"max_depth": 20, "max_nodes": 200, "max_params": 50_000},
            "evaluator": {"name": "training", "settings": TRAINING},
            "strategy": {"name": "random_search", "settings": {"evaluations": evaluations}},
            "executor": {"kind": "ray", "max_in_flight": in_flight, "num_cpus": 1, "fresh_process": fresh},
        }
    return parse_experiment({**raw, "random_seed": 0, "run_dir": str(run_dir)}, "ray_scaling")


def _run(kind: str, in_flight: int, evaluations: int, fresh: bool) -> dict[str, float]:
    from einspace.search.loop import open_store, run_search

    with tempfile.TemporaryDirectory() as tmp:
        e = _experiment(Path(tmp), kind, in_flight, evaluations, fresh)
        store = open_store(e)
        executor = e.make_executor()
        startup = executor.start_workers(wait=True)
        started = time.perf_counter()
        summary = run_search(e, executor, store)
        wall = time.perf_counter() - started
        executor.shutdown()
        store.close()
    return {
        "ran": summary.evaluated,
        "cached": summary.cached,
        "failed": summary.failed,
        "wall": wall,
        "driver": summary.driver_seconds,
        "startup": startup,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--in-flight", type=int, nargs="+", default=[1, 2, 4, 8], help="sleep rows")
    parser.add_argument("--per-slot", type=int, default=8, help="sleep evaluations per in-flight slot")
    parser.add_argument("--train-in-flight", type=int, nargs="*", default=[1, 2], help="training rows")
    parser.add_argument("--train-evaluations", type=int, default=16, help="trainings per training row")
    parser.add_argument("--fresh-process", action="store_true", help="one worker process per evaluation")
    parser.add_argument("--cpus", type=int, default=2, help="CPUs of the local Ray instance")
    args = parser.parse_args()

    import ray

    ray.init(address="local", num_cpus=args.cpus, include_dashboard=False, log_to_driver=False)
    print(
        f"{'kind':<6} {'in flight':>9} {'ran':>5} {'cached':>6} {'wall s':>7} {'evals/s':>8} {'ideal':>6} "
        f"{'efficiency':>10} {'driver ms/eval':>14} {'start-up s':>10}"
    )
    rows = [("sleep", n, n * args.per_slot) for n in args.in_flight]
    rows += [("train", n, args.train_evaluations) for n in args.train_in_flight]
    one_in_flight_rate = None  # of the training rows: their ideal scales it
    for kind, n, evaluations in rows:
        r = _run(kind, n, evaluations, args.fresh_process)
        rate = r["ran"] / r["wall"]
        if kind == "sleep":
            ideal = n / SLEEP_S
        else:
            one_in_flight_rate = one_in_flight_rate or (rate if n == 1 else None)
            ideal = min(n, args.cpus) * one_in_flight_rate if one_in_flight_rate else math.nan
        print(
            f"{kind:<6} {n:>9} {r['ran']:>5} {r['cached']:>6} {r['wall']:>7.2f} {rate:>8.2f} {ideal:>6.2f} "
            f"{rate / ideal:>10.1%} {1000 * r['driver'] / max(1, r['ran'] + r['cached']):>14.2f} "
            f"{r['startup']:>10.2f}" + (f"   ({r['failed']:.0f} failed)" if r["failed"] else "")
        )
    ray.shutdown()


if __name__ == "__main__":
    main()

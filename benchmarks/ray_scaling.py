"""Benchmark (not a test): how a search scales with evaluations in flight on a local Ray instance.

Each evaluation sleeps 1 s (plus the tiny real work of checking the tree and an analytic fitness),
so the ideal throughput with N in flight is N evaluations/s. Worker start-up (a process and a
torch import per worker, paid once per run) is reported apart; the rest measures steady state.
Reports evaluations/s, efficiency
against that ideal, and the driver's overhead per evaluation (time in ask/tell/store/checkpoint,
measured by the run loop). Sleeping tasks scale past the core count, so tasks ask for a fraction
of a CPU to let 8 run on a 2-core machine.

    python benchmarks/ray_scaling.py [--per-slot 8] [--in-flight 1 2 4 8] [--fresh-process]
"""

from __future__ import annotations

import argparse
import math
import tempfile
import time
from pathlib import Path

from einspace.evaluators.base import Evaluator, register_evaluator

SLEEP_S = 1.0

if __name__ != "__main__":  # imported as a plugin (driver and workers): register the evaluator once

    @register_evaluator
    class SleepEvaluator(Evaluator):
        """A simulated training run: sleep, then an analytic fitness from the parameter count."""

        name = "bench_sleep"

        def __init__(self, seconds: float = SLEEP_S):
            self.seconds = seconds

        def evaluate(self, tree, input, grammar, random_seed):  # noqa: ANN001, ANN201
            from einspace.checker import check_tree

            time.sleep(self.seconds)
            params = check_tree(tree, grammar, input).params
            return {"fitness": -abs(math.log10(params + 1) - 4.0)}


def _experiment(run_dir: Path, in_flight: int, evaluations: int, fresh: bool):  # noqa: ANN202
    from einspace.search.config import parse_experiment

    raw = {
        "random_seed": 0,
        "input": {"shape": [3, 32, 32]},
        "limits": {"max_depth": 16, "max_nodes": 120},
        "evaluator": {"name": "bench_sleep", "settings": {"seconds": SLEEP_S}},
        "strategy": {
            "name": "regularised_evolution",
            # A population smaller than the run so the timed part is mostly steady-state evolution.
            "settings": {"evaluations": evaluations, "population": max(4, evaluations // 4), "tournament": 3},
        },
        "plugins": [str(Path(__file__).resolve())],
        "executor": {"kind": "ray", "max_in_flight": in_flight, "num_cpus": 0.25, "fresh_process": fresh},
        "run_dir": str(run_dir),
    }
    return parse_experiment(raw, "ray_scaling")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--in-flight", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--per-slot", type=int, default=8, help="evaluations per in-flight slot")
    parser.add_argument("--fresh-process", action="store_true", help="one worker process per evaluation")
    parser.add_argument("--cpus", type=int, default=2, help="CPUs of the local Ray instance")
    args = parser.parse_args()

    import ray

    from einspace.search.loop import open_store, run_search

    ray.init(address="local", num_cpus=args.cpus, include_dashboard=False, log_to_driver=False)
    print(
        f"{'in flight':>9} {'evals':>6} {'wall s':>7} {'evals/s':>8} {'ideal':>6} {'efficiency':>10} "
        f"{'driver ms/eval':>14}"
    )
    for n in args.in_flight:
        evaluations = n * args.per_slot
        with tempfile.TemporaryDirectory() as tmp:
            e = _experiment(Path(tmp), n, evaluations, args.fresh_process)
            store = open_store(e)
            executor = e.executor()
            startup = executor.start_workers(wait=True)
            started = time.perf_counter()
            summary = run_search(e, executor, store)
            wall = time.perf_counter() - started
            executor.shutdown()
            store.close()
        done = summary.evaluated + summary.cached
        ideal_wall = summary.evaluated * SLEEP_S / n
        rate = done / wall
        print(
            f"{n:>9} {done:>6} {wall:>7.2f} {rate:>8.2f} {n / SLEEP_S:>6.1f} {ideal_wall / wall:>10.1%} "
            f"{1000 * summary.driver_seconds / max(1, done):>14.2f} {startup:>14.2f}"
            + (f"   ({summary.cached} cached duplicates, not slept)" if summary.cached else "")
        )
    ray.shutdown()


if __name__ == "__main__":
    main()

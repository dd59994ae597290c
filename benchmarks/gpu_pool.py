"""Benchmark (not a test): how much of a worker pool's time goes to training, persistent workers
against a fresh process per evaluation, measured in the same run.

A random search of N small networks (the paper's grammar, at most 40k parameters) is run with k
evaluations in flight per device, once per worker mode; random search asks for the same trees
whatever the results, so both modes train the same networks. Per mode it reports evaluations/s,
the time in training steps per evaluation (every step, the first included), the fixed overhead
per evaluation -- its wall time, from its submission to its result in the driver, minus its time
in steps -- and where that overhead goes: the training evaluator's phases (`time/*` metrics:
device start, building, data, capture, validation; the first step apart: cuDNN autotuning,
compilation) and the rest ("outside": process start and imports, Ray, parsing). "steady" is the
overhead without each worker's first evaluation: a persistent worker on a CPU imports torch and
the evaluator in its first (on a GPU, before it; einspace.evaluators.worker). "slot ovh" is k x
wall / N minus the time in steps, which also counts slots left idle at the end of the run. On a
GPU, its utilisation is sampled with nvidia-smi every 200 ms during the run.

Targets: fixed overhead per evaluation <= 1 s with persistent workers (CPU and GPU); on a GPU,
>= 70% mean utilisation with 8 small evaluations sharing it.

    python benchmarks/gpu_pool.py --quick         # CPU, CI-sized: digits, 12 evaluations, 2 in flight
    python benchmarks/gpu_pool.py --device cuda   # 48 evaluations, 8 per GPU, 10k 3x32x32 images
    python benchmarks/gpu_pool.py --device cuda --settings '{"step_mode": "cuda_graphs"}'

The GPU task is the one the issue measured: 10k synthetic 3x32x32 images of 10 classes (written
to a temporary directory in the Unseen NAS layout, nothing is downloaded), 3 epochs of batch 256
(120 steps per evaluation).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

MODES = ("persistent", "fresh")
PHASES = ("device", "build", "data", "capture", "validation")


class Latency:
    """The search's executor, recording the seconds from each submission to its result."""

    def __init__(self, executor: Any):
        self.executor, self.max_in_flight = executor, executor.max_in_flight
        self.submitted: dict[int, float] = {}
        self.seconds: dict[int, float] = {}

    def submit(self, key: int, task: Any) -> None:
        self.submitted[key] = time.perf_counter()
        self.executor.submit(key, task)

    def wait(self, timeout: float | None = None) -> list[Any]:
        finished = self.executor.wait(timeout)
        for done in finished:
            self.seconds[done.key] = time.perf_counter() - self.submitted.pop(done.key)
        return finished

    @property
    def in_flight(self) -> int:
        return self.executor.in_flight


def synthetic_images(root: Path, train: int = 10_000, shape: tuple[int, ...] = (3, 32, 32)) -> Path:
    """A learnable 10-class image task: a class-specific pattern under noise, float32 .npy files."""
    rng = np.random.default_rng(0)
    patterns = rng.normal(0, 1, (10, *shape)).astype(np.float32)
    sizes = {"train": train, "valid": train // 5, "test": train // 5}
    for split, n in sizes.items():
        y = rng.integers(0, 10, n)
        x = 0.5 * patterns[y] + rng.normal(0, 1, (n, *shape)).astype(np.float32)
        np.save(root / f"{split}_x.npy", x.astype(np.float32))
        np.save(root / f"{split}_y.npy", y.astype(np.int64))
    return root


class Utilisation:
    """Mean GPU utilisation (%) over all GPUs, sampled by nvidia-smi while the block runs."""

    def __init__(self) -> None:
        self.samples: list[float] = []
        self._process: subprocess.Popen | None = None

    def __enter__(self) -> Utilisation:
        query = ["nvidia-smi", "--query-gpu=utilization.gpu", "--format=csv,noheader,nounits", "-lms", "200"]
        self._process = subprocess.Popen(query, stdout=subprocess.PIPE, text=True)
        threading.Thread(target=self._read, daemon=True).start()
        return self

    def _read(self) -> None:
        assert self._process is not None and self._process.stdout is not None
        for line in self._process.stdout:
            if line.strip().isdigit():
                self.samples.append(float(line))

    def __exit__(self, *exc: object) -> None:
        assert self._process is not None
        self._process.terminate()
        self._process.wait()

    @property
    def mean(self) -> float:
        return statistics.fmean(self.samples) if self.samples else float("nan")


def experiment(args: argparse.Namespace, run_dir: Path, mode: str, data: str, shape: list[int]):  # noqa: ANN201
    from einspace.search.config import parse_experiment

    cuda = args.device == "cuda"
    settings = {
        "dataset": data,
        "epochs": args.epochs,
        "batch_size": args.batch_size,
        "device": args.device,
        "max_flops": 20_000_000,  # over-budget trees fail at once, from the analytic counts
        "max_seconds": 120,
        **({} if cuda else {"threads": max(1, args.cpus // args.in_flight)}),
        **json.loads(args.settings),
    }
    if args.train_subset:
        settings["train_subset"] = args.train_subset
    gpus = args.gpus if cuda else 0
    raw = {
        "random_seed": 0,
        "input": {"shape": shape},
        "limits": {"max_depth": 14, "max_nodes": 100, "max_params": 40_000},
        "evaluator": {"name": "training", "settings": settings},
        "strategy": {"name": "random_search", "settings": {"evaluations": args.evaluations}},
        "executor": {
            "kind": "ray",
            "max_in_flight": args.in_flight * max(1, gpus),
            "num_cpus": args.cpus / (args.in_flight * max(1, gpus)),
            "num_gpus": 1 / args.in_flight if cuda else 0,
            "fresh_process": mode == "fresh",
        },
        "run_dir": str(run_dir),
    }
    return parse_experiment(raw, f"gpu_pool_{mode}")


def measure(args: argparse.Namespace, mode: str, data: str, shape: list[int]) -> dict[str, Any]:
    from contextlib import nullcontext

    from einspace.search.loop import open_store, run_search

    with tempfile.TemporaryDirectory() as tmp:
        e = experiment(args, Path(tmp), mode, data, shape)
        store = open_store(e)
        executor = e.make_executor()
        startup = executor.start_workers(wait=True)
        timed = Latency(executor)
        sampler = Utilisation() if args.device == "cuda" else nullcontext()
        started = time.perf_counter()
        with sampler:
            summary = run_search(e, timed, store)  # type: ignore[arg-type] - an Executor by duck typing
        wall = time.perf_counter() - started
        executor.shutdown()
        records = [r for r in store.history() if r.status != "cached"]
        store.close()
    slots = e.executor.max_in_flight
    n = len(records)

    def mean(values: Any) -> float:
        values = list(values)
        return statistics.fmean(values) if values else 0.0

    steps = {r.id: r.metrics.get("time/first_step", 0.0) + r.metrics.get("time/steps", 0.0) for r in records}
    overhead = {r.id: timed.seconds[r.id] - steps[r.id] for r in records}
    seen: set[str | None] = set()
    later = []  # evaluations after their worker's first (which pays the process's imports)
    for r in records:  # in the order they finished, so a worker's first comes first
        if r.worker in seen:
            later.append(r.id)
        seen.add(r.worker)
    return {
        "mode": mode,
        "evaluations": n,
        "failed": sum(r.status == "failed" for r in records),
        "workers": len({r.worker for r in records if r.worker}),  # processes used: replacements show
        "startup_s": startup,
        "wall_s": wall,
        "evals_per_s": n / wall,
        "steps_s": mean(steps.values()),
        "overhead_s": mean(overhead.values()),
        "steady_s": mean(overhead[key] for key in later) if later else None,
        "slot_overhead_s": slots * wall / max(1, n) - mean(steps.values()),
        "first_step_s": mean(r.metrics.get("time/first_step", 0.0) for r in records),
        **{f"{phase}_s": mean(r.metrics.get(f"time/{phase}", 0.0) for r in records) for phase in PHASES},
        "outside_s": mean(timed.seconds[r.id] - (r.seconds or 0.0) for r in records),
        "driver_ms": 1000 * summary.driver_seconds / max(1, n),
        "gpu_util": sampler.mean if isinstance(sampler, Utilisation) else None,
    }


#: (title, row key, width, number format) of the printed table.
COLUMNS = [
    ("mode", "mode", 11, ""),
    ("evals", "evaluations", 6, "d"),
    ("failed", "failed", 7, "d"),
    ("workers", "workers", 8, "d"),
    ("start s", "startup_s", 8, ".2f"),
    ("wall s", "wall_s", 8, ".1f"),
    ("eval/s", "evals_per_s", 8, ".2f"),
    ("steps s", "steps_s", 9, ".3f"),
    ("overhead s", "overhead_s", 11, ".3f"),
    ("steady s", "steady_s", 9, ".3f"),
    ("slot ovh s", "slot_overhead_s", 11, ".3f"),
    ("1st step", "first_step_s", 9, ".3f"),
    *[(phase, f"{phase}_s", 11, ".3f") for phase in PHASES],
    ("outside", "outside_s", 9, ".3f"),
    ("GPU %", "gpu_util", 7, ".1f"),
]


def report(rows: list[dict[str, Any]]) -> None:
    print("".join(f"{title:>{width}}" for title, _, width, _ in COLUMNS))
    for row in rows:
        cells = ("-" if row[key] is None else format(row[key], fmt) for _, key, _, fmt in COLUMNS)
        print("".join(f"{cell:>{width}}" for cell, (_, _, width, _) in zip(cells, COLUMNS, strict=True)))
    print(
        "\nper evaluation: steps: time in training steps; overhead: wall time (submission to result) - steps"
        " (target <= 1 s with persistent workers);\nsteady: the same without each worker's first evaluation"
        " (which imports torch and the evaluator on a CPU worker);\nslot ovh: in-flight x wall / evaluations"
        " - steps (idle slots at the end included); device ... validation: the evaluator's phases;\noutside:"
        " wall time outside the evaluator (process start, imports, Ray, parsing); start s: starting the"
        " persistent workers, once per run, not in wall."
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="CPU, digits, 12 evaluations, 2 in flight")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--evaluations", type=int, default=48)
    parser.add_argument("--in-flight", type=int, default=8, help="evaluations in flight per device")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--train-subset", type=int, default=None)
    parser.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    parser.add_argument("--settings", default="{}", help="more training settings, as JSON")
    parser.add_argument("--cpus", type=int, default=os.cpu_count(), help="CPUs of the local Ray instance")
    parser.add_argument("--json", type=Path, help="also write the rows to this file")
    args = parser.parse_args()
    if args.quick:
        args.device, args.evaluations, args.in_flight, args.epochs = "cpu", 12, 2, 1
        args.batch_size, args.train_subset = 64, 512

    import ray

    from einspace.search.ray_local import start_local_ray, stop_local_ray

    start_local_ray(num_cpus=args.cpus)
    args.gpus = int(ray.cluster_resources().get("GPU", 0))
    if args.device == "cuda" and not args.gpus:
        raise SystemExit("--device cuda: Ray sees no GPU")
    with tempfile.TemporaryDirectory() as tmp:
        if args.quick:
            data, shape = "digits", [1, 8, 8]
        else:
            data, shape = str(synthetic_images(Path(tmp))), [3, 32, 32]
        print(
            f"{args.evaluations} evaluations of {data if args.quick else '10k 3x32x32 images'}, "
            f"{args.epochs} epochs, batch {args.batch_size}, {args.in_flight} in flight per "
            f"{'GPU' if args.device == 'cuda' else 'machine'} ({args.gpus} GPUs, {args.cpus} CPUs)\n"
        )
        rows = [measure(args, mode, data, shape) for mode in args.modes]
    stop_local_ray()
    report(rows)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()

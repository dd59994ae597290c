"""How far the training time model is off: predicted against measured training time of sampled trees.

    python benchmarks/time_prediction.py [--trees 40] [--epochs 2] [--device cpu] [--threads 1]
                                         [--recalibrate]

Trees are sampled from the bundled grammar on digits (1x8x8) with the limits of
experiments/digits_re.yaml, seeds 1, 2, ...; each tree predicted to take --skip-below to
--skip-above seconds (the range where a time budget matters; the others are counted) is trained
by the training evaluator (batch 128, the given epochs, no time budget) and its time compared
with the prediction (einspace.evaluators.time_model): the wall time of training (metric
`seconds`) and the process's CPU seconds for the whole evaluation (with one thread, what the
wall time would be on an idle machine: the calibration keeps the fastest of its timings, so it
predicts an idle machine, and a shared one makes wall times longer). The model is calibrated
once, as a worker does, or with --recalibrate before every tree. Printed: per tree the counts,
predicted seconds, wall and CPU seconds, the ratios, and those of the step and validation parts
(to wall time); then the quantiles of the ratios and, for margins 1.5-4, the share of trees a
margin would have refused although they fit (ratio above it) and the share predicted below
1/margin of their time (left to the projection after a few steps). `predicted_time_margin` is
chosen from these.

A measurement, not a test.
"""

from __future__ import annotations

import argparse

import numpy as np
import torch

from einspace import Limits, Sampler, check_tree
from einspace.errors import SamplingError
from einspace.evaluators._runtime import autocast_dtype, resolve_device
from einspace.evaluators.base import Task, run_task
from einspace.evaluators.time_model import TimeModel, Workload, calibrate
from einspace.grammar.parser import load_grammar
from einspace.state import input_state
from einspace.tree import to_text

LIMITS = Limits(max_depth=20, max_nodes=300, max_params=200_000)  # experiments/digits_re.yaml
TRAIN, VALID, CLASSES = 1097, 350, 10  # the digits splits
EVAL_BATCH = 1024  # the training evaluator's default


def _calibrated(device: torch.device, threads: int) -> TimeModel:
    torch.set_num_threads(threads)
    return calibrate(device, autocast_dtype(device, True))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trees", type=int, default=40)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--skip-below", type=float, default=0.5, help="seconds predicted")
    parser.add_argument("--skip-above", type=float, default=60.0, help="seconds predicted")
    parser.add_argument("--recalibrate", action="store_true", help="before every tree")
    parser.add_argument("--exclude", type=int, nargs="*", default=[], help="seeds not to train")
    args = parser.parse_args()

    grammar, x = load_grammar("einspace"), input_state((1, 8, 8))
    device = resolve_device(args.device)
    model = _calibrated(device, args.threads)
    print(f"calibration on {device}, {args.threads} thread(s): {model}")
    settings = {
        "epochs": args.epochs,
        "batch_size": args.batch_size,
        "device": args.device,
        "threads": args.threads,
    }
    walls, cpus, skipped, failed, seed = [], [], 0, 0, 0
    columns = (
        "seed",
        "ops",
        "MFLOPs",
        "values",
        "predicted",
        "wall",
        "cpu",
        "/wall",
        "/cpu",
        "step",
        "valid",
    )
    widths = (4, 6, 8, 9, 9, 8, 8, 6, 6, 6, 6)
    print(" ".join(f"{c:>{w}}" for c, w in zip(columns, widths, strict=True)))
    while len(walls) < args.trees:
        seed += 1
        if seed in args.exclude:
            continue
        try:
            tree = Sampler(grammar, x, LIMITS, random_seed=seed).sample()
        except SamplingError:
            continue
        work = Workload.of(check_tree(tree, grammar, x), CLASSES)
        if args.recalibrate:
            model = _calibrated(device, args.threads)
        forecast = model.forecast(work, args.epochs, TRAIN, args.batch_size, VALID, EVAL_BATCH)
        if not args.skip_below <= forecast.seconds <= args.skip_above:
            skipped += 1
            continue
        result = run_task(Task(to_text(tree), "einspace", (1, 8, 8), "training", settings))
        if not result.ok:
            failed += 1
            continue
        m = result.metrics
        walls.append(forecast.seconds / m["seconds"])
        cpus.append(forecast.seconds / result.cost.cpu_seconds)
        step = m["time/steps"] / (m["steps"] - 1)
        print(
            f"{seed:4d} {work.ops:6d} {work.flops / 1e6:8.3f} {work.values:9d} {forecast.seconds:9.3f} "
            f"{m['seconds']:8.3f} {result.cost.cpu_seconds:8.3f} {walls[-1]:6.2f} {cpus[-1]:6.2f} "
            f"{forecast.step_seconds / step:6.2f} {forecast.validation_seconds / m['time/validation']:6.2f}",
            flush=True,
        )
    bounds = f"{args.skip_below:g}-{args.skip_above:g} s"
    print(f"\n{len(walls)} trees trained, {skipped} skipped (predicted outside {bounds}), {failed} failed")
    for name, ratios in (("wall", np.array(walls)), ("CPU", np.array(cpus))):
        quantiles = ", ".join(f"p{q} {np.percentile(ratios, q):.2f}" for q in (0, 5, 25, 50, 75, 95, 100))
        print(f"predicted / measured {name} seconds: {quantiles}")
        for margin in (1.5, 2.0, 2.5, 3.0, 4.0):
            print(
                f"  margin {margin:g}: {np.mean(ratios > margin):.0%} would be refused though they fit, "
                f"{np.mean(ratios < 1 / margin):.0%} predicted below 1/{margin:g} of their time"
            )


if __name__ == "__main__":
    main()

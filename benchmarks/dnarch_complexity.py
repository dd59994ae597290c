"""DNArch's complexity loss on digits: does training land a network on its target cost?

    python benchmarks/dnarch_complexity.py [--epochs 30] [--seeds 3] [--weights 0.1 0] [--target 0.5]

A small DNArch network (below: two learnable-size convolutions, two learnable widths, a
learnable-depth residual stack; 2.45 MFLOPs per 1×8×8 digit) is trained with the `training`
evaluator's `train_and_test` (train+valid, then the test split) and the auxiliary loss
`complexity: {weight: λ, target: 0.5, measure: flops}`, for each λ in `--weights` and each seed.
With λ = 0 the loss is still built, so its cost is reported, but it does not train anything.

Printed per run: the cost at the end (the loss's differentiable estimate, Eqs. 9-10, which is
what it steers) over the target, the same over the nominal cost, the test accuracy, and the
effective (discretely counted) kernel sizes, widths and depth. The expectation: with λ > 0 the
final cost is within ±10% of the target; with λ = 0 it stays near the nominal cost (about twice
the target). The masks are trained by Adam at `--arch-lr` (0.05: the default 1e-3 moves a mask's
cut-off too little in a few hundred steps) on the einspace recipe's cosine schedule; weights by
SGD at lr 0.04, batch 64. One thread by default (shared machines).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

import einspace as es
from einspace.evaluators.datasets import load_dataset
from einspace.evaluators.training import TrainingSettings, train_and_test

TREE = (
    "(S (C dnarch_kernel(k=5, d=16)) (C norm) (C leaky_relu) (C dnarch_width(d=32)) (C leaky_relu)"
    " (C dnarch_kernel(k=5, d=16)) (C norm) (C leaky_relu) (C dnarch_depth(blocks=2, k=3))"
    " (C dnarch_width(d=32)) (C leaky_relu))"
)
TOLERANCE = 0.10


def run(weight: float, seed: int, args: argparse.Namespace) -> dict[str, float]:
    settings = TrainingSettings(
        dataset="digits",
        epochs=args.epochs,
        batch_size=64,
        lr=0.04,
        param_groups={"architecture": {"lr": args.arch_lr}},
        auxiliary_losses={"complexity": {"weight": weight, "target": args.target, "measure": "flops"}},
        device="cpu",
        threads=args.threads or None,
    )
    data = load_dataset("digits")
    return train_and_test(es.parse_tree(TREE), data, es.input_state(data.input_shape), None, settings, seed)


def sizes(metrics: dict[str, float]) -> str:
    """Effective kernel sizes, widths and depth, in tree order, from the architecture metrics."""
    parts = []
    for key, value in metrics.items():
        if key.startswith("arch/") and not key.endswith("_nominal"):
            nominal = metrics[f"{key}_nominal"]
            parts.append(f"{key.rsplit('/', 1)[1]} {value:g}/{nominal:g}")
    return ", ".join(parts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--weights", type=float, nargs="+", default=[0.1, 0.0])
    parser.add_argument("--target", type=float, default=0.5, help="fraction of the nominal FLOPs")
    parser.add_argument("--arch-lr", type=float, default=0.05)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (0: torch's choice)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    checked = es.check_tree(es.parse_tree(TREE), None, es.input_state((1, 8, 8)))
    print(f"network: {checked.flops:,} FLOPs, {checked.params:,} params; target {args.target:g} of the FLOPs")
    print(f"{'λ':>5} {'seed':>4} {'cost/target':>11} {'cost/nominal':>12} {'test acc':>8} {'s':>5}  sizes")
    summary: dict[float, list[tuple[float, float]]] = {}
    for weight in args.weights:
        for seed in range(args.seeds):
            started = time.perf_counter()
            metrics = run(weight, seed, args)
            ratio = metrics["complexity/ratio"]
            nominal = metrics["complexity/flops_effective"] / metrics["complexity/flops_nominal"]
            accuracy = metrics["test_accuracy"]
            summary.setdefault(weight, []).append((ratio, accuracy))
            seconds = time.perf_counter() - started
            print(
                f"{weight:>5g} {seed:>4} {ratio:>11.3f} {nominal:>12.3f} {accuracy:>8.4f} {seconds:>5.0f}  "
                f"{sizes(metrics)}",
                flush=True,
            )
    print("\nλ      cost/target (mean, range)   within ±10%   test accuracy (mean ± sd)")
    for weight, rows in summary.items():
        ratios, accuracies = [r for r, _ in rows], [a for _, a in rows]
        within = sum(abs(r - 1) <= TOLERANCE for r in ratios)
        spread = statistics.stdev(accuracies) if len(accuracies) > 1 else 0.0
        print(
            f"{weight:<6g} {statistics.mean(ratios):.3f} ({min(ratios):.3f}-{max(ratios):.3f})"
            f"{'':>10}{within}/{len(ratios)}{'':>10}{statistics.mean(accuracies):.4f} ± {spread:.4f}"
        )


if __name__ == "__main__":
    main()

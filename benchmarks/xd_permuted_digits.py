"""Benchmark (not a test): XD-operations learn what a convolution cannot, on permuted digits.

After paper 000's permuted-CIFAR experiment: every image of the bundled 8x8 digits has its 64
pixels shuffled by one fixed random permutation (the same for all splits), which destroys the
locality a convolution relies on. Networks of one layout are trained, all derivation trees
built with `einspace.seeds.architectures` and compiled by einspace:

- conv: two 3x3 convolutions (stride 1, padding 1, width 16), each followed by norm and leaky
        ReLU, then the paper's head (average pool, linear). A convolution is im2col . linear .
        col2im (lowered to F.conv2d);
- conv-wide: the same at width 32, more parameters than xd has, architecture ones included;
- xd:   conv with each convolution replaced by the `xd` terminal of the same (d, k, s, p),
        warm-started at that convolution (same weight count, plus K, L, M, b, C).

The head pools away positions, so what the classifier sees is what the two layers computed;
with permuted pixels a 3x3 neighbourhood is 9 unrelated pixels, while an XD-operation can
learn a global mixing instead.

All train with the project's training evaluator (`train_and_test`: train on train+valid,
score on test) and one recipe: SGD on the weights (lr 0.04, momentum 0.9, weight decay 3e-4,
cosine schedule, batch 64), and for XD's architecture parameters Adam (`--arch-lr`, no weight
decay) frozen for the first `--freeze` epochs, in which only the weights move (the paper's
warm-up). Each method runs over `--seeds` seeds on one thread; the table gives the test
accuracy of each run and mean +- std, on permuted digits and, with `--reference`, on the
original ones.

    python benchmarks/xd_permuted_digits.py               # 3 seeds, permuted (~4 CPU minutes)
    python benchmarks/xd_permuted_digits.py --reference   # and unpermuted (twice that)
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from einspace.evaluators.datasets import Dataset, load_dataset
from einspace.evaluators.training import TrainingSettings, train_and_test
from einspace.seeds.architectures import act, computation, conv, network, norm, seq
from einspace.state import input_state
from einspace.tree import Nonterminal

#: (k, s, p) of the two layers: in the grammar's im2col grid.
LAYERS = ((3, 1, 1), (3, 1, 1))


def conv_net(width: int) -> Nonterminal:
    return network(seq(*(seq(conv(width, k, s, p), norm(), act()) for k, s, p in LAYERS)))


def xd_net(width: int) -> Nonterminal:
    layers = (seq(computation("xd", d=width, k=k, s=s, p=p), norm(), act()) for k, s, p in LAYERS)
    return network(seq(*layers))


def permuted(dataset: Dataset, seed: int) -> Dataset:
    """The dataset with one fixed random permutation applied to the pixels of every image."""
    order = np.random.default_rng(seed).permutation(int(np.prod(dataset.input_shape[1:])))

    def shuffle(x: np.ndarray) -> np.ndarray:
        return x.reshape(*x.shape[:2], -1)[..., order].reshape(x.shape)

    splits = {
        f"{s}_{part}": getattr(dataset, f"{s}_{part}") for s in ("train", "valid", "test") for part in "xy"
    }
    splits.update({key: shuffle(value) for key, value in splits.items() if key.endswith("_x")})
    return Dataset(f"{dataset.name}-permuted", **splits, classes=dataset.classes)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--lr", type=float, default=0.04, help="SGD learning rate of the weights")
    parser.add_argument("--arch-lr", type=float, default=1e-2, help="Adam learning rate of K, L, M, b, C")
    parser.add_argument("--freeze", type=int, default=1, help="epochs before the architecture moves")
    parser.add_argument("--reference", action="store_true", help="also train on the unpermuted digits")
    args = parser.parse_args()

    settings = TrainingSettings(
        epochs=args.epochs,
        batch_size=args.batch,
        lr=args.lr,
        threads=1,
        param_groups={
            "architecture": {"optimizer": "adam", "lr": args.arch_lr, "freeze_epochs": args.freeze}
        },
    )
    digits = load_dataset("digits")
    datasets = [permuted(digits, seed=0)] + ([digits] if args.reference else [])
    nets = {"conv": conv_net(16), "conv-wide": conv_net(32), "xd": xd_net(16)}
    shape = input_state(digits.input_shape)
    print(f"{'dataset':<16} {'method':<9} {'seed':>4} {'test acc':>9} {'params':>7} {'seconds':>8}")
    summary = []
    for dataset in datasets:
        for method, tree in nets.items():
            scores = []
            for seed in range(args.seeds):
                started = time.perf_counter()
                result = train_and_test(tree, dataset, shape, None, settings, random_seed=seed)
                scores.append(result["test_accuracy"])
                seconds = time.perf_counter() - started
                row = f"{dataset.name:<16} {method:<9} {seed:>4} {scores[-1]:>9.4f} {result['params']:>7.0f}"
                print(f"{row} {seconds:>8.1f}", flush=True)
            spread = statistics.stdev(scores) if len(scores) > 1 else 0.0
            summary.append(f"{dataset.name:<16} {method:<9} {statistics.mean(scores):.4f} ± {spread:.4f}")
    print("\nmean ± std of test accuracy over seeds")
    print("\n".join(summary))


if __name__ == "__main__":
    main()

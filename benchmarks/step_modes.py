"""Benchmark (not a test): one small network trained in one process under each training step mode
(`step_mode`: eager, cuda_graphs, compile, compile_cuda_graphs), the time per step side by side.

A small network's GPU step is bound by launching kernels from the host; the step modes cut that
work. Each mode trains the same network on the same synthetic images (benchmarks/gpu_pool.py's,
nothing is downloaded) through the training evaluator, and the table gives per mode whether it
applied (`step_mode_applied`), the milliseconds of a step after the first, the first step's
seconds (compilation, cuDNN autotuning), the capture's seconds and the validation accuracy. The
first mode is repeated at the end when listed twice (`eager ... eager`): the first run of a
process pays start-up costs the second does not.

    python benchmarks/step_modes.py                       # resnet_small on CUDA, every mode
    python benchmarks/step_modes.py --network xd --batch 128 --train 2560 --modes eager cuda_graphs eager
    python benchmarks/step_modes.py --device cpu --train 512 --modes eager   # CPU: modes run eagerly
"""

from __future__ import annotations

import argparse
import math
import pathlib
import tempfile
from collections.abc import Callable

from gpu_pool import synthetic_images  # beside this script, on sys.path

from einspace.evaluators.base import Task, run_task
from einspace.seeds import load_seed
from einspace.seeds.architectures import act, computation, network, seq
from einspace.state import input_state
from einspace.tree import Node, to_text

SHAPE = (3, 32, 32)


def _xd_network() -> Node:
    """Three XD-operations (16 channels, 3x3, the later two of stride 2), each with its activation."""
    xd = [computation("xd", d=16, k=3, s=s, p=1) for s in (1, 2, 2)]
    return network(seq(xd[0], act(), xd[1], act(), xd[2], act()))


#: The networks, by name: (grammar, the derivation tree on SHAPE).
NETWORKS: dict[str, tuple[str, Callable[[], Node]]] = {
    "resnet_small": ("einspace", lambda: load_seed("resnet_small", "einspace", input_state(SHAPE))),
    "xd": ("einspace_plus", _xd_network),
}
MODES = ["eager", "cuda_graphs", "compile", "compile_cuda_graphs", "eager"]


def main() -> None:
    formatter = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=formatter)
    parser.add_argument("--network", choices=sorted(NETWORKS), default="resnet_small")
    parser.add_argument("--modes", nargs="+", default=MODES, help="step modes, in order: %(default)s")
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--train", type=int, default=10_000, help="training images")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--device", default="cuda")
    args = parser.parse_args()
    grammar, make = NETWORKS[args.network]
    tree = to_text(make())
    steps = args.epochs * math.ceil(args.train / args.batch)
    print(f"{args.network}, {steps} steps of batch {args.batch} on {args.device}")
    print(
        f"{'step_mode':<22}{'applied':>8}{'steps ms':>10}{'1st step s':>11}{'capture s':>10}{'accuracy':>9}"
    )
    with tempfile.TemporaryDirectory() as tmp:
        data = str(synthetic_images(pathlib.Path(tmp), train=args.train, shape=SHAPE))
        base = {"dataset": data, "epochs": args.epochs, "batch_size": args.batch, "device": args.device}
        for mode in args.modes:
            r = run_task(Task(tree, grammar, SHAPE, "training", {**base, "step_mode": mode}))
            if not r.ok:
                print(f"{mode:<22} failed: {r.error}")
                continue
            m = r.metrics
            per_step = 1000 * m["time/steps"] / (steps - 1)
            applied, first, capture = m.get("step_mode_applied", 0), m["time/first_step"], m["time/capture"]
            print(
                f"{mode:<22}{applied:>8.0f}{per_step:>10.3f}{first:>11.2f}{capture:>10.2f}"
                f"{m['valid_accuracy']:>9.3f}"
            )


if __name__ == "__main__":
    main()

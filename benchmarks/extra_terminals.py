"""The extra terminals (NOS, XD, DNArch) against the operation each replaces: time and memory.

    python benchmarks/extra_terminals.py [--batch 32] [--channels 32] [--size 32] [--repeats 10]

For every row one training step — forward, a mean-square loss, backward — of the terminal's
module, built through the operation registry exactly as a compiled tree builds it, is measured
against its baseline on the same input, and printed as ratios measured in the same run
(absolute times on shared machines mean little):
  - NOS calibrations: a plain 3×3 convolution of the same width (what they are added to);
  - XD-operations: the convolution they are warm-started at (same k, s, p, width); the XD
    computes on each axis padded to a power of two (32 + 1 -> 64: four times the pixels),
    so a 32x32 input is its worst case and 30x30 (-> 32) its best;
  - DNArch terminals: the same operation unmasked (a plain convolution, linear, identity or
    residual stack of the same nominal size).

Time: the fastest of `--repeats` steps, the terminal and its baseline alternating, after a
warm-up step each, on one thread by default (`--threads 0` for torch's choice), for the reasons
given in benchmarks/compiled_vs_handwritten.py. Memory: the peak bytes torch's CPU allocator
holds during one step, above what it held before (the same helper as that benchmark). Input:
`--batch` images of `--channels` × `--size` × `--size`, float32, on the CPU or, with
`--device cuda`, on the GPU (each step then ends with a synchronisation; memory is the CUDA
allocator's peak).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import compiled_vs_handwritten  # beside this script, on sys.path
import torch
from compiled_vs_handwritten import peak_bytes
from torch import nn

from einspace.ops import get_op, list_ops
from einspace.state import FeatureState, Signal


def conv3x3(state: FeatureState) -> nn.Module:
    channels = state.shape[0]
    return nn.Conv2d(channels, channels, 3, padding=1)


def conv(d: int, k: int, s: int = 1, p: int | None = None) -> Callable[[FeatureState], nn.Module]:
    """A plain convolution to d channels, k×k, stride s, padding p (default: same)."""
    return lambda state: nn.Conv2d(state.shape[0], d, k, stride=s, padding=k // 2 if p is None else p)


class FourierRoundTrip(nn.Module):
    """rfft2 then irfft2: the unmasked low-pass (an identity computed the same way)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.fft.irfft2(torch.fft.rfft2(x), s=x.shape[-2:])


class PlainResidualStack(nn.Sequential):
    """x + R(x) for each block R = conv(k)-BatchNorm-leaky ReLU: the unmasked depth stack."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self:
            x = x + block(x)
        return x


def residual_stack(blocks: int, k: int) -> Callable[[FeatureState], nn.Module]:
    def build(state: FeatureState) -> nn.Module:
        c = state.shape[0]
        return PlainResidualStack(
            *(nn.Sequential(nn.Conv2d(c, c, k, padding=k // 2), nn.BatchNorm2d(c), nn.LeakyReLU(0.01))
              for _ in range(blocks))
        )  # fmt: skip

    return build


@dataclass(frozen=True)
class Row:
    """One terminal with its arguments, whether it takes two branches, and its baseline."""

    family: str
    op: str
    args: dict[str, Any]
    baseline: Callable[[FeatureState], nn.Module]
    baseline_name: str
    branches: int = 1


ROWS = [
    Row("NOS", "channel_attention", {}, conv3x3, "conv 3x3"),
    Row("NOS", "spatial_attention", {}, conv3x3, "conv 3x3"),
    Row("NOS", "dynamic_conv", {"k": 3}, conv3x3, "conv 3x3"),
    Row("NOS", "dynamic_conv", {"k": 5}, conv3x3, "conv 3x3"),
    Row("NOS", "channel_calibrate", {}, conv3x3, "conv 3x3", branches=2),
    Row("NOS", "spatial_calibrate", {}, conv3x3, "conv 3x3", branches=2),
    Row("NOS", "dynamic_calibrate", {"k": 3}, conv3x3, "conv 3x3", branches=2),
    Row("XD", "xd", {"d": 32, "k": 3, "s": 1, "p": 1}, conv(32, 3), "conv 3x3 (its warm start)"),
    Row("XD", "xd", {"d": 32, "k": 3, "s": 2, "p": 1}, conv(32, 3, 2), "conv 3x3, stride 2"),
    Row("XD", "xd", {"d": 32, "k": 4, "s": 4, "p": 0}, conv(32, 4, 4, 0), "conv 4x4, stride 4"),
    Row("DNArch", "dnarch_kernel", {"k": 5, "d": 32}, conv(32, 5), "conv 5x5"),
    Row("DNArch", "dnarch_width", {"d": 32}, conv(32, 1), "conv 1x1 (linear)"),
    Row("DNArch", "dnarch_resolution", {}, lambda state: FourierRoundTrip(), "rfft2 + irfft2"),
    Row("DNArch", "dnarch_depth", {"blocks": 4, "k": 3}, residual_stack(4, 3), "4 residual blocks"),
]


def training_step(module: nn.Module, inputs: Any) -> None:
    """Forward, a mean-square loss, backward (gradients reset first, so they count in memory)."""
    module.zero_grad(set_to_none=True)
    module(inputs).square().mean().backward()
    if compiled_vs_handwritten.DEVICE.type == "cuda":
        torch.cuda.synchronize()


def measure(row: Row, state: FeatureState, batch: int, repeats: int) -> dict[str, float]:
    torch.manual_seed(0)
    device = compiled_vs_handwritten.DEVICE
    signal: Signal = (state,) * row.branches
    terminal = get_op(row.op).build(signal, row.args).to(device)
    baseline = row.baseline(state).to(device)
    x = torch.randn(batch, *state.shape, device=device, requires_grad=True)
    inputs = {"terminal": [x] * row.branches if row.branches > 1 else x, "baseline": x}
    modules = {"terminal": terminal, "baseline": baseline}
    for name, module in modules.items():
        training_step(module, inputs[name])
    memory = {n: peak_bytes(lambda n=n, m=m: training_step(m, inputs[n])) for n, m in modules.items()}
    times: dict[str, list[float]] = {n: [] for n in modules}
    for r in range(repeats):
        for name in ("terminal", "baseline") if r % 2 == 0 else ("baseline", "terminal"):
            start = time.perf_counter()
            training_step(modules[name], inputs[name])
            times[name].append(time.perf_counter() - start)
    count = {n: sum(p.numel() for p in m.parameters()) for n, m in modules.items()}
    return {
        "time": min(times["terminal"]) / min(times["baseline"]),
        "memory": memory["terminal"] / max(1, memory["baseline"]),
        "ms": 1e3 * min(times["terminal"]),
        "baseline_ms": 1e3 * min(times["baseline"]),
        "params": count["terminal"],
        "baseline_params": count["baseline"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--channels", type=int, default=32)
    parser.add_argument("--size", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (0: torch's choice)")
    parser.add_argument("--only", nargs="*", help="families or operations to run (default: all)")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    args = parser.parse_args()
    compiled_vs_handwritten.DEVICE = torch.device(args.device)
    where = torch.cuda.get_device_name() if args.device == "cuda" else "CPU"
    if args.threads:
        torch.set_num_threads(args.threads)
    state = FeatureState((args.channels, args.size, args.size), "im")
    rows = [r for r in ROWS if not args.only or r.family in args.only or r.op in args.only]
    missing = sorted({r.op for r in rows} - set(list_ops()))
    if missing:
        raise SystemExit(f"operations not registered: {', '.join(missing)}")
    print(
        f"extra terminals vs baselines: batch {args.batch}, input {state}, {where}, "
        f"{torch.get_num_threads()} thread(s), fastest of {args.repeats} steps (forward+backward)"
    )
    header = (
        f"{'family':<7} {'terminal':<28} {'baseline':<26} {'time':>6} {'memory':>7} {'ms':>8} {'params':>9}"
    )
    print(header)
    print("-" * len(header))
    for row in rows:
        m = measure(row, state, args.batch, args.repeats)
        call = row.op + (f"({', '.join(f'{k}={v}' for k, v in row.args.items())})" if row.args else "")
        print(
            f"{row.family:<7} {call:<28} {row.baseline_name:<26} {m['time']:>5.2f}x {m['memory']:>6.2f}x "
            f"{m['ms']:>8.2f} {m['params']:>9,}"
        )
    print("time, memory: the terminal's step over its baseline's; ms and params: the terminal's own")


if __name__ == "__main__":
    main()

"""The extra terminals (NOS, XD, DNArch) against the operation each replaces: time and memory.

    python benchmarks/extra_terminals.py [--batch 32] [--channels 32] [--size 32] [--repeats 10]
        [--min-seconds 2] [--quick] [--device cuda] [--only XD] [--count-ops]

For every row one training step — forward, a mean-square loss, backward — of the terminal's
module, built through the operation registry exactly as a compiled tree builds it, is measured
against its baseline on the same input, and printed as ratios measured in the same run
(absolute times on shared machines mean little):
  - NOS calibrations: a plain 3×3 convolution of the same width (what they are added to);
  - XD-operations: a table of their own (the rows of issue 27: 2-d 30x30 and 32x32, stride 1
    and 2, 1-d 30, 32, 1000 and 1024; k = 3, p = 1, `--channels` kept): the convolution they are
    warm-started at, and the same convolution computed with `torch.fft.rfftn` on the grid the XD
    uses (each axis padded to a power of two: 32 + 1 -> 64, so 32x32 is the worst case and 30x30
    the best), its weights transformed at every step. The target is an XD step at most 2x the
    FFT convolution's and a peak at most 3x its peak; the script exits 1 where a row misses it.
    Times there are medians of at least `--repeats` rounds, the three alternating, and of more on
    short rows, enough for about `--min-seconds` per row (at most 400);
  - DNArch terminals: the same operation unmasked (a plain convolution, linear, identity or
    residual stack of the same nominal size).

Time (other rows): the fastest of `--repeats` steps, the terminal and its baseline alternating, after a
warm-up step each, on one thread by default (`--threads 0` for torch's choice), for the reasons
given in benchmarks/compiled_vs_handwritten.py. Memory: the peak bytes torch's CPU allocator
holds during one step, above what it held before (the same helper as that benchmark). Input:
`--batch` images of `--channels` × `--size` × `--size`, float32, on the CPU or, with
`--device cuda`, on the GPU (each step then ends with a synchronisation; memory is the CUDA
allocator's peak; TF32 is off, so every row computes in float32 as on the CPU). `--quick`: 3
repeats (the same rows and batch: at a smaller batch the FFT convolution's transformed weights
dominate its peak, and the memory target would be judged on another workload).

On CUDA the XD table is followed by the same steps with every module captured as CUDA graphs and
replayed (XD / FFT convolution; as `step_mode: cuda_graphs` captures a network); a failed capture
is reported and ends that pass.

`--count-ops` only counts, for the XD rows, the tensor operations one training step dispatches
(and how many of them are not views), on the meta device: every module there takes the code path
it takes on a GPU, where a step this small is bound by launching them (the XD-operation's GPU
path: native complex arithmetic, `einspace.ops._xd_modules`). No GPU or timing needed.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import compiled_vs_handwritten  # beside this script, on sys.path
import torch
from compiled_vs_handwritten import peak_bytes
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from einspace.ops import get_op, list_ops
from einspace.ops.xd import fourier_sizes
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


def step_times(modules: dict[str, Any], inputs: dict[str, Any], repeats: int) -> dict[str, list[float]]:
    """Seconds of `repeats` training steps of each module, their order alternating round by round
    (a drift in the machine's speed then weighs on all alike)."""
    times: dict[str, list[float]] = {n: [] for n in modules}
    order = list(modules)
    for r in range(repeats):
        for name in order if r % 2 == 0 else order[::-1]:
            start = time.perf_counter()
            training_step(modules[name], inputs[name])
            times[name].append(time.perf_counter() - start)
    return times


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
    times = step_times(modules, inputs, repeats)
    count = {n: sum(p.numel() for p in m.parameters()) for n, m in modules.items()}
    return {
        "time": min(times["terminal"]) / min(times["baseline"]),
        "memory": memory["terminal"] / max(1, memory["baseline"]),
        "ms": 1e3 * min(times["terminal"]),
        "baseline_ms": 1e3 * min(times["baseline"]),
        "params": count["terminal"],
        "baseline_params": count["baseline"],
    }


# ----------------------------------------------------------------------------- XD against the FFT convolution


class FFTConv(nn.Module):
    """The convolution (cross-correlation, zero padding p, stride s) computed with `torch.fft.rfftn`
    on the grid the XD-operation uses (each axis padded to the power of two `fourier_sizes` gives),
    its weights transformed at every step: the computation an XD-operation generalises, at its
    size. The channels mix at each frequency in one batched product."""

    def __init__(self, c_in: int, c_out: int, k: int, spatial: tuple[int, ...], s: int, p: int):
        super().__init__()
        self.k, self.s, self.p, self.spatial = k, s, p, spatial
        self.fourier = fourier_sizes(spatial, k, p)
        self.out = tuple((size + 2 * p - k) // s + 1 for size in spatial)
        conv = (nn.Conv1d if len(spatial) == 1 else nn.Conv2d)(c_in, c_out, k)
        self.weight, self.bias = conv.weight, conv.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dims = tuple(range(-len(self.fourier), 0))
        axes = zip(self.spatial[::-1], self.fourier[::-1], strict=True)
        pads = [e for size, n in axes for e in (self.p, n - size - self.p)]
        x = nn.functional.pad(x, pads)  # x starts at p on each axis, zeros up to n
        xf = torch.fft.rfftn(x, dim=dims)  # (B, c_in, *f)
        wf = torch.fft.rfftn(self.weight, s=self.fourier, dim=dims).conj()  # (c_out, c_in, *f)
        batch, c_in, c_out = xf.shape[0], xf.shape[1], wf.shape[0]
        # Correlation: Y(f) = X(f) conj(W(f)), summed over the input channels at each frequency, as
        # one real batched product [Re X, Im X] @ [[Re W, Im W], [-Im W, Re W]] per frequency (torch's
        # complex bmm runs its backward one frequency at a time on CPU: 5-10x slower).
        left = xf.reshape(batch, c_in, -1).permute(2, 0, 1)  # (f, B, c_in)
        left = torch.cat([left.real, left.imag], dim=-1)  # (f, B, 2 c_in)
        w = wf.reshape(c_out, c_in, -1).permute(2, 1, 0)  # (f, c_in, c_out)
        right = torch.cat([torch.cat([w.real, w.imag], -1), torch.cat([-w.imag, w.real], -1)], -2)
        out = torch.bmm(left, right)  # (f, B, 2 c_out)
        yf = torch.complex(out[..., :c_out], out[..., c_out:]).permute(1, 2, 0)
        yf = yf.reshape(batch, c_out, *xf.shape[2:])
        y = torch.fft.irfftn(yf, s=self.fourier, dim=dims)
        y = y[(..., *(slice(0, (o - 1) * self.s + 1, self.s) for o in self.out))]
        return y + self.bias.reshape(-1, *[1] * len(self.fourier))


@dataclass(frozen=True)
class XDCase:
    """One XD row: the spatial input size and the stride (k = 3, p = 1, channels kept)."""

    spatial: tuple[int, ...]
    s: int

    @property
    def name(self) -> str:
        return f"{len(self.spatial)}-D {'x'.join(map(str, self.spatial))}, s{self.s}"


#: The rows of issue 27: the best (30 -> 32) and worst (32 -> 64) 2-d sizes, and 1-d axes up to 1024.
XD_CASES = [
    XDCase((30, 30), 1),
    XDCase((30, 30), 2),
    XDCase((32, 32), 1),
    XDCase((32, 32), 2),
    XDCase((30,), 1),
    XDCase((32,), 1),
    XDCase((1000,), 1),
    XDCase((1024,), 1),
]
#: At most this many rounds for a short row (`--min-seconds`).
MAX_REPEATS = 400
#: The target (issue 27): an XD step at most this many times the FFT convolution's, in time and peak memory.
TIME_TARGET, MEMORY_TARGET = 2.0, 3.0


def xd_row(
    case: XDCase, batch: int, channels: int, device: torch.device | str
) -> tuple[dict[str, nn.Module], dict[str, torch.Tensor]]:
    """The convolution, the FFT convolution with its weights, and the XD-operation (built through
    the registry) of one row, and each one's input: the same tensor (XD's 1-d form is col mode,
    (tokens, features): its input is that tensor transposed, a view)."""
    k, p = 3, 1
    x = torch.randn(batch, channels, *case.spatial, device=device, requires_grad=True)
    if len(case.spatial) == 1:
        state = FeatureState((case.spatial[0], channels), "col")
        plain: nn.Module = nn.Conv1d(channels, channels, k, stride=case.s, padding=p)
        inputs = {"conv": x, "fft": x, "xd": x.transpose(1, 2)}
    else:
        state = FeatureState((channels, *case.spatial), "im")
        plain = nn.Conv2d(channels, channels, k, stride=case.s, padding=p)
        inputs = {"conv": x, "fft": x, "xd": x}
    xd = get_op("xd").build((state,), {"d": channels, "k": k, "s": case.s, "p": p})
    fft = FFTConv(channels, channels, k, case.spatial, case.s, p)
    fft.weight, fft.bias = plain.weight, plain.bias
    return {"conv": plain.to(device), "fft": fft.to(device), "xd": xd.to(device)}, inputs


class Dispatched(TorchDispatchMode):
    """Counts the tensor operations torch dispatches, and how many of them are views (no kernel)."""

    def __init__(self) -> None:
        super().__init__()
        self.operations = self.views = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        self.operations += 1
        self.views += func.is_view
        return func(*args, **(kwargs or {}))


def count_xd(channels: int) -> None:
    """Tensor operations dispatched per training step of each XD row, without a GPU: on the meta
    device (shapes only) every module takes the code path it takes on a GPU, and a small step on a
    GPU is bound by launching them. The XD-operation on the CPU takes its CPU path."""
    print(
        "\nTensor operations dispatched per training step (forward, loss, backward), and in brackets "
        "those that are not views (kernels); meta takes each module's GPU path"
    )
    columns = {"conv": "conv", "fft": "FFT conv", "xd": "XD, GPU path", "xd_cpu": "XD, CPU path"}
    header = f"{'case':<16}" + "".join(f"{title:>14}" for title in columns.values()) + f"{'XD/FFT, GPU':>14}"
    print(header)
    print("-" * len(header))
    for case in XD_CASES:
        counts = {}
        for device in ("meta", "cpu"):
            modules, inputs = xd_row(case, 2, channels, device)
            for name in ("conv", "fft", "xd") if device == "meta" else ("xd",):
                training_step(modules[name], inputs[name])  # the first call fills caches
                with Dispatched() as seen:
                    training_step(modules[name], inputs[name])
                key = name if device == "meta" else "xd_cpu"
                counts[key] = (seen.operations, seen.operations - seen.views)
        cells = [f"{counts[key][0]} ({counts[key][1]})" for key in columns]
        ratio = f"{counts['xd'][0] / counts['fft'][0]:.2f} ({counts['xd'][1] / counts['fft'][1]:.2f})"
        print(f"{case.name:<16}" + "".join(f"{cell:>14}" for cell in [*cells, ratio]))


def measure_xd(case: XDCase, batch: int, channels: int, repeats: int, min_seconds: float) -> dict[str, float]:
    """Median step times (forward, loss, backward) of conv, FFT conv and XD, alternating, over at
    least `repeats` rounds and enough of them to take about `min_seconds`, and the peak bytes
    torch's allocator holds during one step of each (above what it held before)."""
    torch.manual_seed(0)
    modules, inputs = xd_row(case, batch, channels, compiled_vs_handwritten.DEVICE)
    plain, fft, x = modules["conv"], modules["fft"], inputs["conv"]
    with torch.no_grad():
        ref = plain(x)
        error = ((fft(x) - ref).norm() / ref.norm()).item()
    if error > 1e-4:
        raise SystemExit(f"FFT convolution differs from the convolution by {error:.1e} at {case.name}")
    for _ in range(2):  # a warm-up round, then one timed (the first steps pay one-time costs)
        start = time.perf_counter()
        for name, module in modules.items():
            training_step(module, inputs[name])
    # short rows take more steps: their medians are the most exposed to a shared machine's noise
    repeats = max(repeats, min(MAX_REPEATS, math.ceil(min_seconds / (time.perf_counter() - start))))
    memory = {n: peak_bytes(lambda n=n, m=m: training_step(m, inputs[n])) for n, m in modules.items()}
    median = median_steps(modules, inputs, repeats)
    return {
        "conv_ms": 1e3 * median["conv"],
        "fft": median["fft"] / median["conv"],
        "xd": median["xd"] / median["conv"],
        "xd_fft": median["xd"] / median["fft"],
        "memory": {n: m / 2**20 for n, m in memory.items()},
        "memory_ratio": memory["xd"] / max(1, memory["fft"]),
        "repeats": repeats,
    }


def median_steps(modules: dict[str, Any], inputs: dict[str, Any], repeats: int) -> dict[str, float]:
    """Median seconds of a training step of each module (`step_times`)."""
    return {n: statistics.median(t) for n, t in step_times(modules, inputs, repeats).items()}


def run_graphed_xd(batch: int, channels: int, repeats: int) -> None:
    """On CUDA, after the table: XD / FFT convolution with each module's step captured by
    torch.cuda.make_graphed_callables (as `step_mode: cuda_graphs` captures a network) and replayed.
    A failed capture is reported and ends the pass (it can leave the device unable to capture)."""
    print("\nThe same training steps replayed from CUDA graphs: XD / FFT convolution (median steps)")
    for case in XD_CASES:
        torch.manual_seed(0)
        modules, inputs = xd_row(case, batch, channels, "cuda")
        try:
            for name, module in modules.items():
                training_step(module, inputs[name])  # eager first: caches and cuDNN's choices
            graphed = {n: torch.cuda.make_graphed_callables(m, (inputs[n],)) for n, m in modules.items()}
        except RuntimeError as exc:  # torch's CUDA errors, capture refusals included
            print(f"{case.name:<16} capture failed: {str(exc).splitlines()[0]}")
            return
        median = median_steps(graphed, inputs, repeats)
        print(f"{case.name:<16} {median['xd'] / median['fft']:>6.2f}  (conv {1e3 * median['conv']:.2f} ms)")


def run_xd(batch: int, channels: int, repeats: int, min_seconds: float, where: str) -> bool:
    """The XD table; whether every row meets the target."""
    print(
        f"\nXD against the FFT convolution at the same padding: batch {batch}, {channels} -> {channels} "
        f"channels, k = 3, p = 1, {where}, {torch.get_num_threads()} thread(s), median of at least "
        f"{repeats} steps (more for short rows: about {min_seconds:g} s of steps per row)"
    )
    header = (
        f"{'case':<16} {'conv ms':>8} {'FFT/conv':>9} {'XD/conv':>8} {'XD/FFT':>7} "
        f"{'MiB conv':>9} {'FFT':>6} {'XD':>7} {'mem XD/FFT':>10} {'steps':>6}  target"
    )
    print(header)
    print("-" * len(header))
    met = True
    for case in XD_CASES:
        m = measure_xd(case, batch, channels, repeats, min_seconds)
        ok = m["xd_fft"] <= TIME_TARGET and m["memory_ratio"] <= MEMORY_TARGET
        met &= ok
        mib = m["memory"]
        print(
            f"{case.name:<16} {m['conv_ms']:>8.2f} {m['fft']:>8.2f}x {m['xd']:>7.2f}x {m['xd_fft']:>7.2f} "
            f"{mib['conv']:>9.1f} {mib['fft']:>6.1f} {mib['xd']:>7.1f} {m['memory_ratio']:>10.2f} "
            f"{m['repeats']:>6}  "
            f"{'met' if ok else 'NOT met'}"
        )
    print(
        f"target: XD step <= {TIME_TARGET:g}x the FFT convolution's and peak memory <= {MEMORY_TARGET:g}x "
        f"its peak; memory: the peak of the bytes torch's allocator holds during one step, above what it "
        f"held before; {'met on every row' if met else 'NOT met on every row'}"
    )
    return met


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--channels", type=int, default=32)
    parser.add_argument("--size", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument(
        "--min-seconds", type=float, default=2.0, help="XD rows: take at least this long per row (more steps)"
    )
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (0: torch's choice)")
    parser.add_argument("--only", nargs="*", help="families or operations to run (default: all)")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument(
        "--quick", action="store_true", help="3 repeats: a quicker, noisier run (the same rows and batch)"
    )
    parser.add_argument(
        "--count-ops",
        action="store_true",
        help="only count the XD rows' tensor operations per step (no timing)",
    )
    args = parser.parse_args()
    if args.count_ops:
        count_xd(args.channels)
        return
    if args.quick:
        args.repeats = 3
    compiled_vs_handwritten.DEVICE = torch.device(args.device)
    if args.device == "cuda":  # cuDNN convolves in TF32 by default: the FFT check would fail at 1e-4
        torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    where = torch.cuda.get_device_name() if args.device == "cuda" else "CPU"
    if args.threads:
        torch.set_num_threads(args.threads)
    state = FeatureState((args.channels, args.size, args.size), "im")
    chosen = lambda family, op: not args.only or family in args.only or op in args.only  # noqa: E731
    rows = [r for r in ROWS if chosen(r.family, r.op)]
    missing = sorted({r.op for r in rows} - set(list_ops()))
    if missing:
        raise SystemExit(f"operations not registered: {', '.join(missing)}")
    if rows:
        print(
            f"extra terminals vs baselines: batch {args.batch}, input {state}, {where}, "
            f"{torch.get_num_threads()} thread(s), fastest of {args.repeats} steps (forward+backward)"
        )
        header = (
            f"{'family':<7} {'terminal':<28} {'baseline':<26} {'time':>6} {'memory':>7} {'ms':>8} "
            f"{'params':>9}"
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
    if rows:
        print("time, memory: the terminal's step over its baseline's; ms and params: the terminal's own")
    if chosen("XD", "xd"):
        met = run_xd(args.batch, args.channels, args.repeats, args.min_seconds, where)
        if args.device == "cuda":
            run_graphed_xd(args.batch, args.channels, args.repeats)
        if not met:
            sys.exit(1)


if __name__ == "__main__":
    main()

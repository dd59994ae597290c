"""Predicted wall time of a training run, from a tree's analytic counts and this process's device.

Why: a time budget (`max_seconds`) that only the clock enforces lets a network that cannot finish
in time train until the budget runs out, and that compute is lost. A prediction made before
anything is built refuses the clear cases for free.

One training step of a batch of B examples is modelled as

    seconds = fixed + per_op * ops + per_flop * B * flops + per_value * B * values

with `ops` the operations the network runs (each launches kernels forward and backward), `flops`
its forward FLOPs per example and `values` its activation values per example, the input included
(einspace.evaluators.budgets): launch overhead, arithmetic and memory traffic. The backward pass's
work is proportional to the forward's, so the coefficients absorb it. A forward pass without
gradients (validation) has coefficients of its own. Both are fitted, by non-negative least squares
in relative error, to timings of plain-torch probe networks that vary the three counts apart, on
the device, thread count and precision the training uses. Calibrating takes 0.2-0.6 s on one CPU
thread and happens once per process for each of those (a persistent worker pays it once).

The model errs low on purpose (it keeps the fastest of repeated timings, of efficient kernels):
an estimate too high refuses a tree that would have fit, one too low costs only the few steps
after which the training evaluator projects the run from measured steps.
"""

from __future__ import annotations

import contextlib
import itertools
import math
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from einspace.checker import CheckedTree
from einspace.evaluators.budgets import activation_values, head_flops
from einspace.ops.registry import Group, get_op
from einspace.tree import Terminal

__all__ = ["Forecast", "TimeModel", "Workload", "calibrate", "calibrated"]

#: Classes of the probes' head (the digits tasks'); the head's cost enters the counts like a tree's.
_PROBE_CLASSES = 10
#: Timed repetitions per probe (after one untimed step); the fastest is kept, since other
#: processes on the machine only ever add time.
_REPEATS = 3
#: A growing probe takes 4x the batch until one training step takes this long and 4x its first
#: size's step, so that its per-example costs stand well above the fixed ones and the clock's
#: resolution...
_LONG_STEP_S = 0.004
#: ... or until its activations would pass this many values: 32 MiB of float32 on the CPU, where
#: steps are long before that, 256 MiB on a GPU, whose share of memory may be small.
_MAX_VALUES = {"cpu": 2**23, "cuda": 2**26}


@dataclass(frozen=True)
class Workload:
    """A network's counts in the model's terms: operations run per step, forward FLOPs and
    activation values per example."""

    ops: int
    flops: int
    values: int

    @staticmethod
    def of(checked: CheckedTree, classes: int | None) -> Workload:
        """The counts of a tree, with the classification head of `classes` (None: backbone only).
        Every operation instance counts (Repeat copies included) except identity and branching,
        which return their input or views of it."""
        ops = checked.count_operations(_runs)
        flops = checked.flops + (head_flops(checked, classes) if classes is not None else 0)
        inputs = sum(math.prod(state.shape) for state in checked.input)
        return Workload(ops, flops, inputs + activation_values(checked))

    def features(self, batch: int) -> np.ndarray:
        """What the coefficients multiply for a batch: 1, operations, the batch's FLOPs and values."""
        return np.array([1.0, self.ops, batch * self.flops, batch * self.values])


def _runs(node: Terminal) -> bool:
    """Whether an operation runs kernels: identity and branching (clone, group) pass their input
    on as is or as views."""
    return node.op != "identity" and get_op(node.op).group != Group.BRANCHING


@dataclass(frozen=True)
class Forecast:
    """The predicted time of one training run, in parts."""

    epochs: int
    steps_per_epoch: int
    step_seconds: float  # mean over an epoch's steps
    validation_seconds: float
    overhead_seconds: float  # building the network and the first step's extra work

    @property
    def seconds(self) -> float:
        training = self.epochs * self.steps_per_epoch * self.step_seconds
        return training + self.validation_seconds + self.overhead_seconds

    def __str__(self) -> str:
        return (
            f"{self.seconds:.3g} s of training ({self.epochs} epochs x {self.steps_per_epoch} steps x "
            f"{self.step_seconds:.3g} s/step + {self.validation_seconds:.3g} s validation + "
            f"{self.overhead_seconds:.2g} s set-up)"
        )


@dataclass(frozen=True)
class TimeModel:
    """Calibrated coefficients (fixed, per op, per FLOP, per value) of a training step and of a
    forward pass without gradients, and the set-up time of a run."""

    train: tuple[float, float, float, float]
    forward: tuple[float, float, float, float]
    overhead_seconds: float

    def step_seconds(self, workload: Workload, batch: int) -> float:
        """One training step (forward, backward, optimiser) of a batch of `batch` examples."""
        return float(np.dot(self.train, workload.features(batch)))

    def forward_seconds(self, workload: Workload, batch: int) -> float:
        """One forward pass in eval mode without gradients."""
        return float(np.dot(self.forward, workload.features(batch)))

    def forecast(
        self,
        workload: Workload,
        epochs: int,
        examples: int,
        batch_size: int,
        eval_examples: int,
        eval_batch_size: int,
    ) -> Forecast:
        """The time of training for `epochs` on `examples` in batches of `batch_size` (the last
        one short), then scoring `eval_examples` in batches of `eval_batch_size`."""
        steps = math.ceil(examples / batch_size)
        epoch = _batches(examples, batch_size, lambda b: self.step_seconds(workload, b))
        validation = _batches(eval_examples, eval_batch_size, lambda b: self.forward_seconds(workload, b))
        return Forecast(epochs, steps, epoch / steps, validation, self.overhead_seconds)


def _batches(examples: int, batch_size: int, seconds: Callable[[int], float]) -> float:
    """Seconds of passing `examples` in batches of `batch_size`, the last one holding the rest."""
    full, rest = divmod(examples, batch_size)
    return full * seconds(batch_size) + (seconds(rest) if rest else 0.0)


# ---------------------------------------------------------------- probes


@dataclass(frozen=True)
class _Probe:
    """A plain-torch network on examples of `shape`, with its counts as the checker would give
    them for the equivalent tree (so that the fitted coefficients apply to trees)."""

    build: Callable[[], nn.Module]
    shape: tuple[int, ...]
    workload: Workload
    batch: int
    grows: bool  # the batch grows until a step is long enough


class _Head(nn.Module):
    """The App. B.1 head on (B, ..., D) tokens or (B, C, H, W) maps: mean pool, linear layer."""

    def __init__(self, features: int, channels_first: bool):
        super().__init__()
        self.channels_first = channels_first
        self.linear = nn.Linear(features, _PROBE_CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pooled = x.flatten(2).mean(2) if self.channels_first else x.flatten(1, -2).mean(1)
        return self.linear(pooled)


class _Transpose(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.transpose(1, 2)


def _head_flops(values: int, features: int) -> int:
    return values + (2 * features + 1) * _PROBE_CLASSES


def _linear_probe(depth: int, tokens: int, width: int, batch: int, grows: bool) -> _Probe:
    """`depth` x (linear, leaky ReLU) on (tokens, width): FLOPs per op grow with the width."""

    def build() -> nn.Module:
        layers = [m for _ in range(depth) for m in (nn.Linear(width, width), nn.LeakyReLU(0.01))]
        return nn.Sequential(*layers, _Head(width, False))

    size = tokens * width
    flops = depth * ((2 * width + 1) * width * tokens + size) + _head_flops(size, width)
    return _Probe(build, (tokens, width), Workload(2 * depth, flops, size * (1 + 2 * depth)), batch, grows)


def _memory_probe(depth: int, side: int, batch: int) -> _Probe:
    """`depth` x (transpose, leaky ReLU, layer norm) on (side, side): few FLOPs per value, strided
    reads as after einspace's permutations."""

    def build() -> nn.Module:
        layers = [m for _ in range(depth) for m in (_Transpose(), nn.LeakyReLU(0.01), nn.LayerNorm(side))]
        return nn.Sequential(*layers, _Head(side, False))

    size = side * side
    work = Workload(3 * depth, depth * 5 * size + _head_flops(size, side), size * (1 + 3 * depth))
    return _Probe(build, (side, side), work, batch, True)


def _conv_probe(depth: int, channels: int, side: int, batch: int) -> _Probe:
    """`depth` x (3x3 convolution, batch norm, leaky ReLU) on (channels, side, side), counted as
    the tree im2col(k=3) . linear . col2im . norm . leaky_relu that lowering turns into it."""

    def build() -> nn.Module:
        layers = [
            m
            for _ in range(depth)
            for m in (
                nn.Conv2d(channels, channels, 3, padding=1),
                nn.BatchNorm2d(channels),
                nn.LeakyReLU(0.01),
            )
        ]
        return nn.Sequential(*layers, _Head(channels, True))

    size = channels * side * side
    flops = depth * ((2 * 9 * channels + 1) * size + 5 * size) + _head_flops(size, channels)
    work = Workload(5 * depth, flops, size * (1 + 13 * depth))  # patches 9, then 4 outputs of size
    return _Probe(build, (channels, side, side), work, batch, True)


def _probes() -> list[_Probe]:
    """Probes that vary operations (deep and narrow), FLOPs (wide linear layers), memory traffic
    (transposes and norms) apart, and one that mixes them as convolutional trees do."""
    return [
        _linear_probe(1, 4, 8, 16, grows=False),
        _linear_probe(12, 4, 8, 16, grows=False),
        _linear_probe(2, 8, 128, 2, grows=True),
        _memory_probe(2, 32, 2),
        _conv_probe(2, 16, 8, 2),
    ]


# ---------------------------------------------------------------- calibration


def _timed(device: torch.device, run: Callable[[], object]) -> float:
    """Wall seconds of `run`, its device work included."""
    _synchronize(device)
    start = time.perf_counter()
    run()
    _synchronize(device)
    return time.perf_counter() - start


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _measure(probe: _Probe, batch: int, device: torch.device, dtype: torch.dtype | None) -> tuple[float, ...]:
    """(training step, forward pass, set-up) seconds of `probe` at `batch` examples: set-up is the
    building and the first step beyond a typical step."""
    autocast = contextlib.nullcontext() if dtype is None else torch.autocast(device.type, dtype=dtype)
    started = time.perf_counter()
    model = probe.build().to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9, weight_decay=3e-4)
    x = torch.randn(batch, *probe.shape, device=device)
    y = torch.zeros(batch, dtype=torch.long, device=device)

    def step() -> None:
        with autocast:
            loss = F.cross_entropy(model(x).float(), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()

    @torch.no_grad()
    def forward() -> None:
        with autocast:
            model(x)

    step()
    _synchronize(device)
    first = time.perf_counter() - started
    train = min(_timed(device, step) for _ in range(_REPEATS))
    model.eval()
    forward_seconds = min(_timed(device, forward) for _ in range(_REPEATS))
    return train, forward_seconds, max(first - train, 0.0)


def _nnls(features: np.ndarray, seconds: np.ndarray) -> np.ndarray:
    """Non-negative coefficients c minimising the relative error of features @ c against seconds.
    With four features every subset of them is tried as the free set: the best solution that is
    non-negative is the exact optimum (numpy has no NNLS, and this needs no iteration)."""
    rows = features / seconds[:, None]  # relative error: every probe weighs alike, short or long
    scale = np.abs(rows).max(axis=0)
    scale[scale == 0] = 1.0
    rows = rows / scale
    target = np.ones(len(seconds))
    best, best_error = np.zeros(features.shape[1]), math.inf
    for size in range(1, features.shape[1] + 1):
        for free in itertools.combinations(range(features.shape[1]), size):
            solution, *_ = np.linalg.lstsq(rows[:, free], target, rcond=None)
            if (solution < 0).any():
                continue
            coefficients = np.zeros(features.shape[1])
            coefficients[list(free)] = solution
            error = float(np.sum((rows @ coefficients - target) ** 2))
            if error < best_error:
                best, best_error = coefficients, error
    return best / scale


def calibrate(device: torch.device, dtype: torch.dtype | None = None) -> TimeModel:
    """Fit a TimeModel to timings of the probes on `device` (under autocast to `dtype`, if any)
    with the current thread count. The global random state is left as it was."""
    rows: list[np.ndarray] = []
    timings: list[tuple[float, float, float]] = []  # (training step, forward pass, set-up)
    most = _MAX_VALUES.get(device.type, _MAX_VALUES["cpu"])
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        torch.manual_seed(0)
        for probe in _probes():
            batch, enough = probe.batch, _LONG_STEP_S
            while True:
                timings.append(_measure(probe, batch, device, dtype))
                rows.append(probe.workload.features(batch))
                step = timings[-1][0]
                if batch == probe.batch:
                    enough = max(enough, 4 * step)
                if not probe.grows or step >= enough or 4 * batch * probe.workload.values > most:
                    break
                batch *= 4
    if device.type == "cuda":
        torch.cuda.empty_cache()  # the probes' blocks: the evaluation's data placement counts free memory
    features, (train, forward, setup) = np.stack(rows), np.array(timings).T
    model = TimeModel(
        _coefficients(features, train), _coefficients(features, forward), float(np.median(setup))
    )
    numbers = (*model.train, *model.forward, model.overhead_seconds)
    if not all(math.isfinite(c) and c >= 0 for c in numbers) or not sum(model.train) > 0:
        raise ValueError(f"calibration gave unusable coefficients {numbers}")
    return model


def _coefficients(features: np.ndarray, seconds: np.ndarray) -> tuple[float, float, float, float]:
    fixed, per_op, per_flop, per_value = (float(c) for c in _nnls(features, seconds))
    return fixed, per_op, per_flop, per_value


#: Calibrations of this process by (device, threads, autocast dtype); None: calibration failed.
_CALIBRATIONS: dict[tuple[str, int, str], TimeModel | None] = {}


def calibrated(device: torch.device, dtype: torch.dtype | None, threads: int | None) -> TimeModel | None:
    """This process's time model for `device`, autocast `dtype` and `threads` CPU threads (None:
    the current number), calibrated on first use; None when calibration failed (once warned):
    then there are no predictions and only the clock enforces a time budget."""
    previous = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    key = (str(device), torch.get_num_threads(), str(dtype))
    try:
        if key not in _CALIBRATIONS:
            try:
                _CALIBRATIONS[key] = calibrate(device, dtype)
            except Exception as exc:  # noqa: BLE001 - a failed calibration must not fail an evaluation
                warnings.warn(
                    f"no training time predictions on {device}: calibration failed ({exc!r}); "
                    "time budgets are enforced by the clock only",
                    RuntimeWarning,
                    stacklevel=2,
                )
                _CALIBRATIONS[key] = None
        return _CALIBRATIONS[key]
    finally:
        torch.set_num_threads(previous)

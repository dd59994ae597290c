"""DNArch terminals (Romero & Zeghidour, 2023): kernel size, width, resolution and depth learnt by
backpropagation through differentiable masks, and the complexity loss that steers their cost.

Masks. A Gaussian mask (Eq. 1) learns kernel sizes, a sigmoid mask (Eq. 2) widths, frequency
cut-offs and depths. Every mask lives on coordinates normalised to [-1, 1] and is zero where it
falls below the threshold T_m = 0.1. Its differentiable size follows Eq. 9 (Gaussian) or Eq. 10
(sigmoid) with the reference "cut-off at the last coordinate (x_T = 1) is the full length N",
clipped at N with a straight-through estimator, so a mask that has grown past its axis still
feels the complexity loss and can shrink again. Mask parameters are architecture parameters
(einspace.trainable) and are clamped after every optimiser step as in the paper's App. E: sigma
no smaller than lets the support reach the first neighbouring taps (a kernel never collapses to
one tap), mu between "0.95 at the lowest coordinate" and "0.85 at the highest". Sigmoid masks
start at that upper bound (the paper's initial resolution mask; for width and depth: the base
network, here the nominal size); Gaussian masks start with their support just reaching the
outermost taps (the paper starts small, sigma = 0.0325 on global kernels; here the grammar's k
is the base size).

Static shapes. As the paper's own runs did, masked values are zeroed, never cropped: every
terminal keeps its nominal output shape, so the grammar's shape checks and analytic counts hold.
`params` and `cost` are nominal (unmasked), FLOPs per sample with a multiply-add counted 2 as in
einspace.ops.core; the small per-batch cost of evaluating the masks is not counted. Each module
also reports its differentiable cost at the current masks (`DNArchModule.costs`), which the
`complexity` network loss sums. A module counts only its own masks (App. C also shrinks a layer's
input side by the previous layer's width mask, and everything after a resolution mask; terminals
here do not know their neighbours), so the estimate errs high.

Depth is a terminal, `dnarch_depth`, rather than a grammar construct: its mask needs one ordered
stack of residual blocks x_{l+1} = x_l + m(l) R_l(x_l) with one shared cut-off over the block
index, while the grammar's only repetition, `(M) * b`, puts copies in parallel branches. So the
terminal holds `blocks` fixed, shape-preserving conv-norm-act blocks and masks them (tau = 8,
on the residual branch only, as in Sec. 2.4.4); blocks whose mask is zero are not run.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from functools import partial
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from einspace.errors import EinspaceError
from einspace.ops.core import UnaryOperation
from einspace.ops.registry import Argument, Group, infeasible, register_op
from einspace.state import COL, FeatureState
from einspace.trainable import mark_architecture, register_network_loss

__all__ = [
    "ComplexityLoss",
    "DNArchModule",
    "GaussianMask",
    "LowPass",
    "MaskedConv",
    "MaskedLinear",
    "ResidualStack",
    "SigmoidMask",
    "check_complexity_options",
    "complexity_loss",
]

#: Mask threshold T_m: below it a mask is zero (every mask of the paper uses 0.1).
T_M = 0.1
#: Slack when comparing with T_m, so a mask clamped to exactly T_m at a coordinate keeps it.
_ROUNDING = 1e-6
#: Sigmoid temperatures of the paper's tuned runs: channels 25, depth 8; resolution 25 (of 25/50/100).
TAU_WIDTH, TAU_DEPTH, TAU_RESOLUTION = 25.0, 8.0, 25.0
#: The Gaussian's cut-off in units of sigma (Eq. 3 with mu = 0): x_T = sigma * sqrt(-2 log T_m).
_GAUSS_REACH = math.sqrt(-2 * math.log(T_M))
#: What the cost measures count.
MEASURES = ("flops", "params")


def _threshold(values: torch.Tensor) -> torch.Tensor:
    """Zero a mask where it falls below T_m (Eqs. 1, 2)."""
    return torch.where(values >= T_M - _ROUNDING, values, torch.zeros_like(values))


def _clip_to(size: torch.Tensor, high: float) -> torch.Tensor:
    """min(size, high) forwards, identity backwards (straight-through), so an over-grown mask can shrink."""
    return size + (size.clamp(max=high) - size).detach()


def _logit(p: float) -> float:
    return math.log(p / (1 - p))


def _positions(length: int) -> torch.Tensor:
    return torch.linspace(-1.0, 1.0, length)


class GaussianMask(nn.Module):
    """Eq. 1 over `taps` kernel taps at coordinates linspace(-1, 1): centred (mu = 0), learnable sigma."""

    def __init__(self, taps: int):
        super().__init__()
        self.taps = taps
        self.register_buffer("coords", _positions(taps), persistent=False)
        self.sigma_min = 2 / (taps - 1) / _GAUSS_REACH  # the support reaches the neighbouring taps
        self.sigma = nn.Parameter(torch.tensor(1 / _GAUSS_REACH))  # it reaches the outermost taps
        mark_architecture(self, "sigma")

    def forward(self) -> torch.Tensor:
        return _threshold(torch.exp(-0.5 * (self.coords / self.sigma) ** 2))

    def cutoff(self) -> torch.Tensor:
        """x_T of Eq. 3: the mask is T_m at ±x_T."""
        return self.sigma * _GAUSS_REACH

    def size(self) -> torch.Tensor:
        """Eq. 9, 2 x_T / (2 x_T^0) · N with x_T^0 = 1 and N = taps, clipped at `taps`."""
        return _clip_to(self.cutoff() * self.taps, self.taps)

    def support(self) -> int:
        """The number of taps the mask keeps."""
        return int((self() > 0).sum())

    def constrain_architecture(self) -> None:
        self.sigma.clamp_(min=self.sigma_min)


class SigmoidMask(nn.Module):
    """Eq. 2, sigmoid(tau (mu - x)): keeps low coordinates (first channels, first blocks, low
    frequencies); learnable offset mu, fixed temperature tau. `length` is the N of Eq. 10, the size
    of the axis whose coordinates in [-1, 1] are `coords`."""

    def __init__(self, coords: torch.Tensor, length: int, tau: float):
        super().__init__()
        self.length, self.tau = length, tau
        self.register_buffer("coords", coords, persistent=False)
        self.mu_min = -1 + _logit(0.95) / tau  # 0.95 at the lowest coordinate
        self.mu_max = 1 + _logit(0.85) / tau  # 0.85 at the highest
        self.mu = nn.Parameter(torch.tensor(self.mu_max))
        mark_architecture(self, "mu")

    def forward(self) -> torch.Tensor:
        return _threshold(torch.sigmoid(self.tau * (self.mu - self.coords)))

    def cutoff(self) -> torch.Tensor:
        """x_T of Eq. 4: the mask is T_m there and zero above."""
        return self.mu - math.log(1 / (1 - T_M) - 1) / self.tau

    def size(self) -> torch.Tensor:
        """Eq. 10, (x_T - x_min) / (x_T^0 - x_min) · N with x_min = -1 and x_T^0 = 1, clipped at N."""
        return _clip_to((self.cutoff() + 1) / 2 * self.length, self.length)

    def constrain_architecture(self) -> None:
        self.mu.clamp_(self.mu_min, self.mu_max)


# ---------------------------------------------------------------- cost models


def _conv_costs(c_in: int, d: int, positions: int, taps: Any, masks: int) -> dict[str, Any]:
    """Convolution with `taps` kernel taps (int, or a tensor of masked taps), bias, same padding."""
    return {"flops": (2 * c_in * taps + 1) * d * positions, "params": (c_in * taps + 1) * d + masks}


def _width_costs(n_in: int, d: Any, positions: int) -> dict[str, Any]:
    """Linear to d features, bias, mask multiply (d an int or a tensor of masked channels)."""
    return {"flops": (2 * n_in + 2) * d * positions, "params": (n_in + 1) * d + 1}


def _fft_flops(n: Any) -> Any:
    """A real FFT or its inverse on n points: 2.5 n log2 n, half of a complex FFT's 5 n log2 n."""
    log2 = torch.log2(n.clamp(min=1)) if isinstance(n, torch.Tensor) else math.log2(n)
    return 2.5 * n * log2


def _lowpass_costs(channels: int, points: int, bins: int, kept: Any, masks: int) -> dict[str, Any]:
    """Forward FFT and mask (complex times real: 2) at full resolution; the inverse at the `kept`
    resolution, as if cropped (Eq. 5)."""
    flops = channels * (_fft_flops(points) + 2 * bins + _fft_flops(kept))
    return {"flops": flops, "params": masks}


def _lowpass_model(channels: int, spatial: tuple[int, ...]) -> Callable[[Any], dict[str, Any]]:
    """The low-pass costs as a function of the kept resolution (points of the spatial axes together)."""
    bins = math.prod(spatial[:-1]) * (spatial[-1] // 2 + 1)  # rfft/rfft2: the last axis one-sided
    return partial(_lowpass_costs, channels, math.prod(spatial), bins, masks=len(spatial))


def _stack_costs(channels: int, positions: int, taps: int, blocks: Any) -> dict[str, Any]:
    """`blocks` residual blocks conv(taps)-norm-act, each scaled by its mask and added (4 + 1 + 1 + 1
    FLOPs per element besides the convolution; norm params 2 per channel)."""
    block = _conv_costs(channels, channels, positions, taps, 0)
    flops = block["flops"] + 7 * channels * positions
    params = block["params"] + 2 * channels
    return {"flops": flops * blocks, "params": params * blocks + 1}


# ---------------------------------------------------------------- modules


def _axes(base: str, rank: int) -> list[str]:
    return [f"{base}_h", f"{base}_w"] if rank == 2 else [base]


class DNArchModule(nn.Module):
    """A DNArch terminal's module: its nominal cost (fixed when built, equal to its operation's
    `params` and `cost`) and its differentiable cost at the current masks."""

    nominal: dict[str, int]
    _cost: Callable[[Any], dict[str, Any]]  # the cost model, as a function of the masked size

    def masked_size(self) -> torch.Tensor:
        """The differentiable size the cost model takes (taps, channels, points or blocks)."""
        raise NotImplementedError

    def costs(self) -> dict[str, torch.Tensor]:
        """Differentiable FLOPs and parameters at the current mask sizes."""
        size = self.masked_size()
        return {
            measure: torch.as_tensor(value, dtype=size.dtype, device=size.device)
            for measure, value in self._cost(size).items()
        }

    def _set_nominal(self, costs: Mapping[str, Any]) -> None:
        self.nominal = {measure: int(round(costs[measure])) for measure in MEASURES}


def _uniform(shape: tuple[int, ...], fan_in: int) -> nn.Parameter:
    """nn.Linear's and nn.Conv's default initialisation, U(±1/sqrt(fan_in))."""
    bound = 1 / math.sqrt(fan_in)
    return nn.Parameter(torch.empty(shape).uniform_(-bound, bound))


class MaskedConv(DNArchModule):
    """A k^rank convolution (same padding, bias) whose kernel is multiplied by a product of 1-d
    Gaussian masks, one learnable sigma per spatial axis (FlexConv). The kernel is a plain weight
    tensor rather than the paper's kernel MLP: simpler, and the mask acts on it the same way.
    Rank 2 takes (B, C, H, W); rank 1 takes (B, S, D), convolving over S with D as channels."""

    def __init__(self, c_in: int, d: int, k: int, spatial: tuple[int, ...]):
        super().__init__()
        self.k, self.rank = k, len(spatial)
        self.weight = _uniform((d, c_in) + (k,) * self.rank, c_in * k**self.rank)
        self.bias = _uniform((d,), c_in * k**self.rank)
        self.masks = nn.ModuleList(GaussianMask(k) for _ in spatial)
        self._cost = partial(_conv_costs, c_in, d, math.prod(spatial), masks=self.rank)
        self._set_nominal(self._cost(k**self.rank))

    def kernel(self) -> torch.Tensor:
        first, *rest = (mask() for mask in self.masks)
        window = torch.outer(first, rest[0]) if rest else first
        return self.weight * window

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.rank == 2:
            return F.conv2d(x, self.kernel(), self.bias, padding=self.k // 2)
        return F.conv1d(x.transpose(1, 2), self.kernel(), self.bias, padding=self.k // 2).transpose(1, 2)

    def masked_size(self) -> torch.Tensor:
        return math.prod(mask.size() for mask in self.masks)

    def architecture_metrics(self) -> dict[str, float]:
        metrics: dict[str, float] = {}
        for axis, mask in zip(_axes("kernel", self.rank), self.masks, strict=True):
            metrics[axis], metrics[f"{axis}_nominal"] = mask.support(), self.k
        return metrics


class MaskedLinear(DNArchModule):
    """A linear layer to d features (over channels in im mode, a 1×1 convolution; over D in col
    mode) followed by a sigmoid mask over its output channels with learnable cut-off (tau = 25)."""

    def __init__(self, n_in: int, d: int, image: bool, positions: int):
        super().__init__()
        self.image = image
        self.weight = _uniform((d, n_in), n_in)
        self.bias = _uniform((d,), n_in)
        self.mask = SigmoidMask(_positions(d), d, TAU_WIDTH)
        self._cost = partial(_width_costs, n_in, positions=positions)
        self._set_nominal(self._cost(d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.image:
            return F.conv2d(x, self.weight[:, :, None, None], self.bias) * self.mask()[:, None, None]
        return F.linear(x, self.weight, self.bias) * self.mask()

    def masked_size(self) -> torch.Tensor:
        return self.mask.size()

    def architecture_metrics(self) -> dict[str, float]:
        return {"width": int((self.mask() > 0).sum()), "width_nominal": self.mask.length}


def _frequency_coords(length: int, onesided: bool) -> torch.Tensor:
    """|frequency| of each FFT bin of an axis of `length` (>= 2) samples, mapped to [-1, 1]
    (-1: the constant, 1: the highest frequency, length // 2)."""
    freqs = torch.arange(length // 2 + 1) if onesided else torch.fft.fftfreq(length, 1 / length).abs()
    return freqs / (length // 2) * 2 - 1


class LowPass(DNArchModule):
    """A learnable low-pass filter: FFT over the spatial axes, a sigmoid mask over |frequency| per
    axis (learnable cut-off, tau = 25), inverse FFT at the same size. The paper crops the spectrum
    above the cut-off and so lowers the resolution; with static shapes the masked frequencies are
    zeroed instead and the output keeps the input's shape. Rank 2: rfft2 over (H, W) of
    (B, C, H, W); rank 1: rfft over S of (B, S, D). Computed in float32 (FFTs take no bfloat16)."""

    def __init__(self, channels: int, spatial: tuple[int, ...]):
        super().__init__()
        self.spatial = spatial
        last = len(spatial) - 1
        self.masks = nn.ModuleList(
            SigmoidMask(_frequency_coords(n, onesided=i == last), n, TAU_RESOLUTION)
            for i, n in enumerate(spatial)
        )
        self._cost = _lowpass_model(channels, spatial)
        self._set_nominal(self._cost(math.prod(spatial)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if len(self.spatial) == 2:
            mask = torch.outer(self.masks[0](), self.masks[1]())
            return torch.fft.irfft2(torch.fft.rfft2(x.float()) * mask, s=self.spatial).to(x.dtype)
        spectrum = torch.fft.rfft(x.float(), dim=1) * self.masks[0]()[:, None]
        return torch.fft.irfft(spectrum, n=self.spatial[0], dim=1).to(x.dtype)

    def masked_size(self) -> torch.Tensor:
        return math.prod(mask.size() for mask in self.masks)

    def architecture_metrics(self) -> dict[str, float]:
        """Per axis: the samples that represent the kept frequencies 0..f_c, min(n, 2 f_c + 1)."""
        metrics: dict[str, float] = {}
        axes = _axes("resolution", len(self.spatial))
        for axis, mask, n in zip(axes, self.masks, self.spatial, strict=True):
            kept = mask() > 0
            highest = int(((mask.coords[kept].max() + 1) / 2 * (n // 2)).round())
            metrics[axis], metrics[f"{axis}_nominal"] = min(n, 2 * highest + 1), n
        return metrics


class _SequenceConv(nn.Conv1d):
    """A 1-d convolution over S of (B, S, D), D being the channels."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x.transpose(1, 2)).transpose(1, 2)


class ResidualStack(DNArchModule):
    """`blocks` residual blocks x + m(l) R_l(x), R_l = conv(k, same padding)-norm-leaky ReLU keeping
    the shape, with a sigmoid depth mask m over the block index (tau = 8). Rank 2: Conv2d and
    BatchNorm2d on (B, C, H, W); rank 1: a convolution over S and LayerNorm over D on (B, S, D)."""

    def __init__(self, channels: int, k: int, blocks: int, spatial: tuple[int, ...]):
        super().__init__()
        image = len(spatial) == 2
        conv = nn.Conv2d if image else _SequenceConv
        norm = nn.BatchNorm2d if image else nn.LayerNorm
        self.blocks = nn.ModuleList(
            nn.Sequential(conv(channels, channels, k, padding=k // 2), norm(channels), nn.LeakyReLU(0.01))
            for _ in range(blocks)
        )
        self.mask = SigmoidMask(_positions(blocks), blocks, TAU_DEPTH)
        self._cost = partial(_stack_costs, channels, math.prod(spatial), k ** len(spatial))
        self._set_nominal(self._cost(blocks))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mask = self.mask()
        active = [True] * len(self.blocks) if mask.is_meta else (mask > 0).tolist()  # meta: shapes only
        for block, scale, run in zip(self.blocks, mask, active, strict=True):
            if run:
                x = x + scale * block(x)
        return x

    def masked_size(self) -> torch.Tensor:
        return self.mask.size()

    def architecture_metrics(self) -> dict[str, float]:
        return {"depth": int((self.mask() > 0).sum()), "depth_nominal": self.mask.length}


# ---------------------------------------------------------------- operations


def _odd(low: int) -> Callable[[int], str | None]:
    def check(value: int) -> str | None:
        return None if value >= low and value % 2 else f"must be odd and >= {low}"

    return check


def _positive(value: int) -> str | None:
    return None if value >= 1 else "must be >= 1"


def _split(state: FeatureState) -> tuple[int, tuple[int, ...]]:
    """(channels, spatial axes): im (C, H, W) -> C, (H, W); col (S, D) -> D, (S,)."""
    if state.mode == COL:
        return state.shape[1], state.shape[:1]
    return state.shape[0], state.shape[1:]


def _fits(op: UnaryOperation, state: FeatureState, k: int) -> tuple[int, tuple[int, ...]]:
    channels, spatial = _split(state)
    if k > min(spatial):
        raise infeasible(f"{op.name}: kernel {k} larger than the spatial extent {spatial} of {state}")
    return channels, spatial


_D = Argument("d", int, _positive, "output features")


@register_op
class DNArchKernel(UnaryOperation):
    """DNArch learnable kernel size: a k-tap convolution to d channels under a Gaussian mask.

    im: (C, H, W) -> (d, H, W), a k×k kernel with one learnable sigma per spatial axis; col:
    (S, D) -> (S, d), k taps over S. Same padding. Params: d·C·k^r + d + r (r sigmas).
    FLOPs: (2·C·k^r + 1)·d per position. Infeasible when k exceeds a spatial axis.
    """

    name = "dnarch_kernel"
    group = Group.COMPUTATION
    arguments = (Argument("k", int, _odd(3), "largest kernel size (odd)"), _D)

    def apply(self, state: FeatureState, args: Mapping[str, Any]) -> FeatureState:
        channels, spatial = _fits(self, state, args["k"])
        d = args["d"]
        return state._replace(shape=spatial + (d,) if state.mode == COL else (d,) + spatial)

    def module(self, state: FeatureState, args: Mapping[str, Any]) -> nn.Module:
        channels, spatial = _split(state)
        return MaskedConv(channels, args["d"], args["k"], spatial)

    def _costs(self, state: FeatureState, args: Mapping[str, Any]) -> dict[str, Any]:
        channels, spatial = _split(state)
        return _conv_costs(channels, args["d"], math.prod(spatial), args["k"] ** len(spatial), len(spatial))

    def params(self, state: FeatureState, args: Mapping[str, Any]) -> int:
        return self._costs(state, args)["params"]

    def cost(self, state: FeatureState, args: Mapping[str, Any]) -> int:
        return self._costs(state, args)["flops"]


@register_op
class DNArchWidth(UnaryOperation):
    """DNArch learnable width: a linear to d features under a sigmoid channel mask (tau = 25).

    im: over the channels (a 1×1 convolution), (C, H, W) -> (d, H, W); col: over D, (S, D) ->
    (S, d). Params: (in + 1)·d + 1 (mu). FLOPs: (2·in + 2)·d per position (the mask multiply 1).
    """

    name = "dnarch_width"
    group = Group.COMPUTATION
    arguments = (_D,)

    def apply(self, state: FeatureState, args: Mapping[str, Any]) -> FeatureState:
        _, spatial = _split(state)
        d = args["d"]
        return state._replace(shape=spatial + (d,) if state.mode == COL else (d,) + spatial)

    def module(self, state: FeatureState, args: Mapping[str, Any]) -> nn.Module:
        channels, spatial = _split(state)
        return MaskedLinear(channels, args["d"], state.mode != COL, math.prod(spatial))

    def _costs(self, state: FeatureState, args: Mapping[str, Any]) -> dict[str, Any]:
        channels, spatial = _split(state)
        return _width_costs(channels, args["d"], math.prod(spatial))

    def params(self, state: FeatureState, args: Mapping[str, Any]) -> int:
        return self._costs(state, args)["params"]

    def cost(self, state: FeatureState, args: Mapping[str, Any]) -> int:
        return self._costs(state, args)["flops"]


@register_op
class DNArchResolution(UnaryOperation):
    """DNArch learnable resolution: a Fourier low-pass with a learnable cut-off per spatial axis.

    Shape unchanged (masked frequencies are zeroed, not cropped). im: rfft2 over (H, W); col:
    rfft over S. Params: one mu per spatial axis. FLOPs per channel: forward and inverse real
    FFT, 2.5·n·log2(n) each (n = H·W or S), plus 2 per kept complex coefficient. Infeasible on an
    axis of one sample (no frequency to cut).
    """

    name = "dnarch_resolution"
    group = Group.COMPUTATION

    def apply(self, state: FeatureState, args: Mapping[str, Any]) -> FeatureState:
        if min(_split(state)[1]) < 2:
            raise infeasible(f"{self.name}: no frequencies to cut on a spatial axis of one sample in {state}")
        return state

    def module(self, state: FeatureState, args: Mapping[str, Any]) -> nn.Module:
        return LowPass(*_split(state))

    def params(self, state: FeatureState, args: Mapping[str, Any]) -> int:
        return len(_split(state)[1])

    def cost(self, state: FeatureState, args: Mapping[str, Any]) -> int:
        channels, spatial = _split(state)
        return int(round(_lowpass_model(channels, spatial)(math.prod(spatial))["flops"]))


@register_op
class DNArchDepth(UnaryOperation):
    """DNArch learnable depth: `blocks` residual conv-norm-act blocks under a sigmoid depth mask.

    Shape-preserving: x_{l+1} = x_l + m(l)·R_l(x_l), R_l a k-tap convolution (channels to
    channels, same padding), BatchNorm2d (im) or LayerNorm over D (col), leaky ReLU; m a sigmoid
    mask over the block index (tau = 8). Params: blocks·(C·C·k^r + 3·C) + 1. FLOPs per block:
    (2·C·k^r + 1)·C + 7·C per position. Infeasible when k exceeds a spatial axis.
    """

    name = "dnarch_depth"
    group = Group.COMPUTATION
    arguments = (
        Argument("blocks", int, _positive, "largest number of residual blocks"),
        Argument("k", int, _odd(1), "kernel size of each block's convolution (odd)"),
    )

    def apply(self, state: FeatureState, args: Mapping[str, Any]) -> FeatureState:
        _fits(self, state, args["k"])
        return state

    def module(self, state: FeatureState, args: Mapping[str, Any]) -> nn.Module:
        channels, spatial = _split(state)
        return ResidualStack(channels, args["k"], args["blocks"], spatial)

    def _costs(self, state: FeatureState, args: Mapping[str, Any]) -> dict[str, Any]:
        channels, spatial = _split(state)
        return _stack_costs(channels, math.prod(spatial), args["k"] ** len(spatial), args["blocks"])

    def params(self, state: FeatureState, args: Mapping[str, Any]) -> int:
        return self._costs(state, args)["params"]

    def cost(self, state: FeatureState, args: Mapping[str, Any]) -> int:
        return self._costs(state, args)["flops"]


# ---------------------------------------------------------------- complexity loss


class ComplexityLoss:
    """Eq. 11, (C / C_target - 1)^2, with C the network's cost at the current masks: the checked
    tree's nominal total with each DNArch module's nominal cost replaced by its differentiable one
    (the head, outside the tree, is not counted)."""

    def __init__(self, network: nn.Module, checked: Any, target: float, measure: str):
        check_complexity_options(target=target, measure=measure)
        self.measure = measure
        self.modules = [m for m in network.modules() if isinstance(m, DNArchModule)]
        self.nominal = {name: int(getattr(checked, name)) for name in MEASURES}
        self.fixed = {
            name: self.nominal[name] - sum(m.nominal[name] for m in self.modules) for name in MEASURES
        }
        self.target = target * self.nominal[measure] if target <= 1 else float(target)
        if self.target <= 0:
            raise EinspaceError(f"complexity loss: the network has no {measure} to set a target on")

    def current(self, measure: str) -> torch.Tensor:
        """The network's differentiable cost in `measure` at the current masks."""
        total: Any = self.fixed[measure]
        for module in self.modules:
            total = total + module.costs()[measure]
        return total if isinstance(total, torch.Tensor) else torch.tensor(float(total))

    def loss(self) -> torch.Tensor:
        return (self.current(self.measure) / self.target - 1) ** 2

    @torch.no_grad()
    def metrics(self) -> dict[str, float]:
        metrics = {f"{name}_effective": float(self.current(name)) for name in MEASURES}
        metrics.update({f"{name}_nominal": float(self.nominal[name]) for name in MEASURES})
        metrics["target"] = self.target
        metrics["ratio"] = metrics[f"{self.measure}_effective"] / self.target
        return metrics


def check_complexity_options(*, target: float = 0.5, measure: str = "flops") -> None:
    """The complexity loss's options, checked before a search starts (no network needed)."""
    if measure not in MEASURES:
        raise EinspaceError(f"complexity loss: measure must be flops or params, got {measure!r}")
    if isinstance(target, bool) or not isinstance(target, (int, float)) or target <= 0:
        raise EinspaceError(f"complexity loss: target must be a number > 0, got {target!r}")


@register_network_loss("complexity", check=check_complexity_options)
def complexity_loss(
    network: nn.Module, checked: Any, *, target: float = 0.5, measure: str = "flops"
) -> ComplexityLoss:
    """DNArch's complexity loss. `target`: a fraction of the nominal cost (the cost at the masks'
    initial sizes) when <= 1, else an absolute number of FLOPs or parameters; `measure`: flops
    (per sample) or params."""
    return ComplexityLoss(network, checked, target, measure)

"""The torch side of the DNArch terminals (`einspace.ops.dnarch`, which says how they work): the
masks, the masked modules with their differentiable costs, and the complexity network loss."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from functools import partial
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from einspace.errors import EinspaceError
from einspace.ops.dnarch import (
    MEASURES,
    check_complexity_options,
    conv_costs,
    lowpass_model,
    stack_costs,
    width_costs,
)
from einspace.ops.trainable import mark_architecture, register_network_loss

__all__ = [
    "ComplexityLoss",
    "DNArchModule",
    "GaussianMask",
    "LowPass",
    "MaskedConv",
    "MaskedLinear",
    "ResidualStack",
    "SigmoidMask",
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
        self._cost = partial(conv_costs, c_in, d, math.prod(spatial), masks=self.rank)
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
        self._cost = partial(width_costs, n_in, positions=positions)
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
        self._cost = lowpass_model(channels, spatial)
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
        self._cost = partial(stack_costs, channels, math.prod(spatial), k ** len(spatial))
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

    def metrics(self) -> dict[str, float]:
        with torch.no_grad():
            metrics = {f"{name}_effective": float(self.current(name)) for name in MEASURES}
        metrics.update({f"{name}_nominal": float(self.nominal[name]) for name in MEASURES})
        metrics["target"] = self.target
        metrics["ratio"] = metrics[f"{self.measure}_effective"] / self.target
        return metrics


def complexity_loss(
    network: nn.Module, checked: Any, *, target: float = 0.5, measure: str = "flops"
) -> ComplexityLoss:
    """DNArch's complexity loss. `target`: a fraction of the nominal cost (the cost at the masks'
    initial sizes) when <= 1, else an absolute number of FLOPs or parameters; `measure`: flops
    (per sample) or params."""
    return ComplexityLoss(network, checked, target, measure)


# registered by a call, not a decorator: mutmut (scripts/mutation.py) skips decorated functions
register_network_loss("complexity", check=check_complexity_options)(complexity_loss)

"""DNArch terminals (Romero & Zeghidour, 2023): kernel size, width, resolution and depth learnt by
backpropagation through differentiable masks, and the complexity loss that steers their cost.

Masks. A Gaussian mask (Eq. 1) learns kernel sizes, a sigmoid mask (Eq. 2) widths, frequency
cut-offs and depths. Every mask lives on coordinates normalised to [-1, 1] and is zero where it
falls below the threshold T_m = 0.1. Its differentiable size follows Eq. 9 (Gaussian) or Eq. 10
(sigmoid) with the reference "cut-off at the last coordinate (x_T = 1) is the full length N",
clipped at N with a straight-through estimator, so a mask that has grown past its axis still
feels the complexity loss and can shrink again. Mask parameters are architecture parameters
(einspace.ops.trainable) and are clamped after every optimiser step as in the paper's App. E: sigma
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

The terminals' shape rules and nominal costs are here, without torch; the masks, the modules and
the complexity loss are in `einspace.ops._dnarch_modules`, imported when the first is built.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from functools import partial
from typing import TYPE_CHECKING, Any

from einspace.errors import EinspaceError
from einspace.ops.core import UnaryOperation
from einspace.ops.registry import Argument, Group, infeasible, register_op, torch_side
from einspace.state import COL, FeatureState

if TYPE_CHECKING:
    from torch import nn

__all__ = [
    "MEASURES",
    "DNArchDepth",
    "DNArchKernel",
    "DNArchResolution",
    "DNArchWidth",
    "check_complexity_options",
    "conv_costs",
    "lowpass_model",
    "stack_costs",
    "width_costs",
]

#: What the cost measures count.
MEASURES = ("flops", "params")

#: The masks and modules, imported at the first build.
_modules = torch_side("einspace.ops._dnarch_modules")


# ---------------------------------------------------------------- cost models


def conv_costs(c_in: int, d: int, positions: int, taps: Any, masks: int) -> dict[str, Any]:
    """Convolution with `taps` kernel taps (int, or a tensor of masked taps), bias, same padding."""
    return {"flops": (2 * c_in * taps + 1) * d * positions, "params": (c_in * taps + 1) * d + masks}


def width_costs(n_in: int, d: Any, positions: int) -> dict[str, Any]:
    """Linear to d features, bias, mask multiply (d an int or a tensor of masked channels)."""
    return {"flops": (2 * n_in + 2) * d * positions, "params": (n_in + 1) * d + 1}


def fft_flops(n: Any) -> Any:
    """A real FFT or its inverse on n points: 2.5 n log2 n, half of a complex FFT's 5 n log2 n."""
    log2 = math.log2(n) if isinstance(n, (int, float)) else n.clamp(min=1).log2()  # or a tensor
    return 2.5 * n * log2


def lowpass_costs(channels: int, points: int, bins: int, kept: Any, masks: int) -> dict[str, Any]:
    """Forward FFT and mask (complex times real: 2) at full resolution; the inverse at the `kept`
    resolution, as if cropped (Eq. 5)."""
    flops = channels * (fft_flops(points) + 2 * bins + fft_flops(kept))
    return {"flops": flops, "params": masks}


def lowpass_model(channels: int, spatial: tuple[int, ...]) -> Callable[[Any], dict[str, Any]]:
    """The low-pass costs as a function of the kept resolution (points of the spatial axes together)."""
    bins = math.prod(spatial[:-1]) * (spatial[-1] // 2 + 1)  # rfft/rfft2: the last axis one-sided
    return partial(lowpass_costs, channels, math.prod(spatial), bins, masks=len(spatial))


def stack_costs(channels: int, positions: int, taps: int, blocks: Any) -> dict[str, Any]:
    """`blocks` residual blocks conv(taps)-norm-act, each scaled by its mask and added (4 + 1 + 1 + 1
    FLOPs per element besides the convolution; norm params 2 per channel)."""
    block = conv_costs(channels, channels, positions, taps, 0)
    flops = block["flops"] + 7 * channels * positions
    params = block["params"] + 2 * channels
    return {"flops": flops * blocks, "params": params * blocks + 1}


# ---------------------------------------------------------------- operations


def _odd(low: int, value: int) -> str | None:
    """An argument check (bound to `low` with partial, so that it runs at check time)."""
    return None if value >= low and value % 2 else f"must be odd and >= {low}"


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

#: Why export refuses every DNArch terminal.
_NOT_EXPORTED = (
    "DNArch terminals learn their size through masks while training (mask parameters, a clamp after "
    "every step, a network loss), which plain PyTorch layers do not express"
)


@register_op
class DNArchKernel(UnaryOperation):
    """DNArch learnable kernel size: a k-tap convolution to d channels under a Gaussian mask.

    im: (C, H, W) -> (d, H, W), a k×k kernel with one learnable sigma per spatial axis; col:
    (S, D) -> (S, d), k taps over S. Same padding. Params: d·C·k^r + d + r (r sigmas).
    FLOPs: (2·C·k^r + 1)·d per position. Infeasible when k exceeds a spatial axis.
    """

    name = "dnarch_kernel"
    group = Group.COMPUTATION
    export_refusal = _NOT_EXPORTED
    arguments = (Argument("k", int, partial(_odd, 3), "largest kernel size (odd)"), _D)

    def apply(self, state: FeatureState, args: Mapping[str, Any]) -> FeatureState:
        channels, spatial = _fits(self, state, args["k"])
        d = args["d"]
        return state._replace(shape=spatial + (d,) if state.mode == COL else (d,) + spatial)

    def module(self, state: FeatureState, args: Mapping[str, Any]) -> nn.Module:
        channels, spatial = _split(state)
        return _modules.MaskedConv(channels, args["d"], args["k"], spatial)

    def _costs(self, state: FeatureState, args: Mapping[str, Any]) -> dict[str, Any]:
        channels, spatial = _split(state)
        return conv_costs(channels, args["d"], math.prod(spatial), args["k"] ** len(spatial), len(spatial))

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
    export_refusal = _NOT_EXPORTED
    arguments = (_D,)

    def apply(self, state: FeatureState, args: Mapping[str, Any]) -> FeatureState:
        _, spatial = _split(state)
        d = args["d"]
        return state._replace(shape=spatial + (d,) if state.mode == COL else (d,) + spatial)

    def module(self, state: FeatureState, args: Mapping[str, Any]) -> nn.Module:
        channels, spatial = _split(state)
        return _modules.MaskedLinear(channels, args["d"], state.mode != COL, math.prod(spatial))

    def _costs(self, state: FeatureState, args: Mapping[str, Any]) -> dict[str, Any]:
        channels, spatial = _split(state)
        return width_costs(channels, args["d"], math.prod(spatial))

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
    export_refusal = _NOT_EXPORTED

    def apply(self, state: FeatureState, args: Mapping[str, Any]) -> FeatureState:
        if min(_split(state)[1]) < 2:
            raise infeasible(f"{self.name}: no frequencies to cut on a spatial axis of one sample in {state}")
        return state

    def module(self, state: FeatureState, args: Mapping[str, Any]) -> nn.Module:
        return _modules.LowPass(*_split(state))

    def params(self, state: FeatureState, args: Mapping[str, Any]) -> int:
        return len(_split(state)[1])

    def cost(self, state: FeatureState, args: Mapping[str, Any]) -> int:
        channels, spatial = _split(state)
        return int(round(lowpass_model(channels, spatial)(math.prod(spatial))["flops"]))


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
    export_refusal = _NOT_EXPORTED
    arguments = (
        Argument("blocks", int, _positive, "largest number of residual blocks"),
        Argument("k", int, partial(_odd, 1), "kernel size of each block's convolution (odd)"),
    )

    def apply(self, state: FeatureState, args: Mapping[str, Any]) -> FeatureState:
        _fits(self, state, args["k"])
        return state

    def module(self, state: FeatureState, args: Mapping[str, Any]) -> nn.Module:
        channels, spatial = _split(state)
        return _modules.ResidualStack(channels, args["k"], args["blocks"], spatial)

    def _costs(self, state: FeatureState, args: Mapping[str, Any]) -> dict[str, Any]:
        channels, spatial = _split(state)
        return stack_costs(channels, math.prod(spatial), args["k"] ** len(spatial), args["blocks"])

    def params(self, state: FeatureState, args: Mapping[str, Any]) -> int:
        return self._costs(state, args)["params"]

    def cost(self, state: FeatureState, args: Mapping[str, Any]) -> int:
        return self._costs(state, args)["flops"]


def check_complexity_options(*, target: float = 0.5, measure: str = "flops") -> None:
    """The complexity loss's options, checked before a search starts (no network needed)."""
    if measure not in MEASURES:
        raise EinspaceError(f"complexity loss: measure must be flops or params, got {measure!r}")
    if isinstance(target, bool) or not isinstance(target, (int, float)) or target <= 0:
        raise EinspaceError(f"complexity loss: target must be a number > 0, got {target!r}")

"""XD-operations (papers 000, 001): a convolution whose Fourier basis is searched, Real(K diag(L w + b) M x).

A convolution is diagonalised by the DFT, conv(w)(x) = F^-1 diag(F w) F x. Replacing the three
DFTs by learnable butterfly matrices K, L, M (the FFT's sparsity pattern with free complex
twiddles) gives an operation space that contains the convolution, and also dilated convolutions,
permuted inputs, skips and poolings. Each spatial axis has its own butterflies, applied one
axis at a time (a Kronecker product), on the axis zero-padded to a power of two so that the
circular computation equals the linear convolution with zero padding p.

The operation's shape rule and analytic costs are here, without torch; its module, `XDConv`, and
the butterflies are in `einspace.ops._xd_modules`, imported when the first XD-operation is built.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from einspace.ops.core import UnaryOperation
from einspace.ops.registry import Argument, Group, infeasible, register_op, torch_side
from einspace.state import COL, FeatureState

if TYPE_CHECKING:
    from torch import nn

__all__ = ["XD", "fourier_sizes", "xd_flops", "xd_parameter_count"]

#: Sizes of spatial axes.
Sizes = tuple[int, ...]

#: The module and the butterflies, imported at the first build.
_modules = torch_side("einspace.ops._xd_modules")


# ----------------------------------------------------------------------------- geometry and costs


def fourier_sizes(input_size: Sequence[int], k: int, p: int) -> tuple[int, ...]:
    """The power-of-two size n of each axis: circular correlation on n points equals the linear
    one with zero padding p when n >= size + p (the wrapped-around tail only meets zeros), and
    the filter needs n >= k."""
    return tuple(1 << (max(size + p, k) - 1).bit_length() for size in input_size)


def xd_parameter_count(c_in: int, c_out: int, k: int, fourier: Sequence[int], bias: bool = True) -> int:
    """Parameters of an `XDConv`: weights and bias as a convolution's, plus K, L, M, b and C."""
    butterflies = sum(4 * n * (n.bit_length() - 1) for n in fourier)
    return (
        c_out * c_in * k ** len(fourier)
        + (c_out if bias else 0)
        + 2 * c_out * c_in
        + 2 * math.prod(fourier)
        + 3 * butterflies
    )


def xd_flops(c_in: int, c_out: int, fourier: Sequence[int], out_size: Sequence[int]) -> int:
    """Floating-point operations for one sample, counting the operation in its O(n log n) form.

    A complex multiply-add counts 8. Each channel's transform (M on the c_in inputs, K on the
    c_out outputs) takes, per axis a, log2(n_a) butterfly factors of 2 n_a complex multiply-adds
    on each of the prod(n)/n_a lines: 16 prod(n) log2(n_a). The diagonal and the channel gates
    take one complex multiply-add per channel pair and frequency, the bias one add per output.
    L w + b depends on the parameters only (computed once per batch, cacheable at inference)
    and is not counted; nor are the zero padding, the crop and the real part.
    """
    grid = math.prod(fourier)
    transform = 16 * grid * sum(n.bit_length() - 1 for n in fourier)
    return (c_in + c_out) * transform + 8 * c_out * c_in * grid + c_out * math.prod(out_size)


# ----------------------------------------------------------------------------- the operation


def _positive(value: int) -> str | None:
    return None if value >= 1 else "must be >= 1"


def _non_negative(value: int) -> str | None:
    return None if value >= 0 else "must be >= 0"


@register_op
class XD(UnaryOperation):
    """XD-operation: a k-kernel convolution (stride s, zero padding p) to d channels whose
    Fourier basis (K, L, M, b, C) is learnt, starting exactly at the convolution.

    im mode (C, H, W) -> (d, h, w) over both spatial axes, h = (H + 2p - k) // s + 1 as im2col
    computes; col mode (S, D) -> (S', d), one-dimensional over the tokens with D as channels
    (it mixes positions globally, so it is not causal). Params: `xd_parameter_count`; FLOPs:
    `xd_flops` (the butterflies, diagonal and channel gates; a multiply-add counts 2).
    """

    name = "xd"
    group = Group.COMPUTATION
    exportable = True  # export writes the operation as a small helper class, `XD`
    arguments = (
        Argument("d", int, _positive, "output channels"),
        Argument("k", int, _positive, "kernel size"),
        Argument("s", int, _positive, "stride"),
        Argument("p", int, _non_negative, "zero padding"),
    )
    description = "XD-operation: a convolution whose DFTs are learnt butterfly (K-)matrices"

    @staticmethod
    def _geometry(state: FeatureState, args: Mapping[str, Any]) -> tuple[int, Sizes, Sizes]:
        """(input channels, spatial sizes, output sizes), or Infeasible where the kernel does not fit."""
        k, s, p = args["k"], args["s"], args["p"]
        if state.mode == COL:
            channels, spatial = state.shape[1], state.shape[:1]
        else:
            channels, spatial = state.shape[0], state.shape[1:]
        if min(spatial) + 2 * p < k:
            padded = "x".join(str(size + 2 * p) for size in spatial)
            raise infeasible(f"xd kernel {k} larger than the padded input {padded} of {state}")
        return channels, tuple(spatial), tuple((size + 2 * p - k) // s + 1 for size in spatial)

    def apply(self, state: FeatureState, args: Mapping[str, Any]) -> FeatureState:
        _, _, out = self._geometry(state, args)
        shape = (*out, args["d"]) if state.mode == COL else (args["d"], *out)
        return state._replace(shape=shape)

    def module(self, state: FeatureState, args: Mapping[str, Any]) -> nn.Module:
        channels, spatial, _ = self._geometry(state, args)
        return _modules.XDConv(
            channels, args["d"], args["k"], spatial, args["s"], args["p"], channels_last=state.mode == COL
        )

    def params(self, state: FeatureState, args: Mapping[str, Any]) -> int:
        channels, spatial, _ = self._geometry(state, args)
        fourier = fourier_sizes(spatial, args["k"], args["p"])
        return xd_parameter_count(channels, args["d"], args["k"], fourier)

    def cost(self, state: FeatureState, args: Mapping[str, Any]) -> int:
        channels, spatial, out = self._geometry(state, args)
        return xd_flops(channels, args["d"], fourier_sizes(spatial, args["k"], args["p"]), out)

"""The paper's fundamental operations (Sec. 3.1, App. A.2): branching, aggregation, routing, computation.

Shapes exclude the batch axis; `dim` and `order` count feature axes from 1 (im: 1 = C, 2 = H,
3 = W; col: 1 = S, 2 = D). FLOPs are per sample with a multiply-add counted as 2.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from einspace.ops.registry import Argument, Group, Operation, infeasible, register_op, torch_side
from einspace.state import COL, IM, RANK_OF_MODE, FeatureState, Signal, describe

if TYPE_CHECKING:
    from torch import nn

#: The modules these operations build, imported at the first build (sampling and checking need
#: only the shape rules below, and do not load torch).
_modules = torch_side("einspace.ops._modules")


def _at_least(low: int) -> Callable[[int], str | None]:
    """An argument check that an integer is >= low."""

    def check(value: int) -> str | None:
        return None if value >= low else f"must be >= {low}"

    return check


def _permutation(order: tuple) -> str | None:
    if not all(isinstance(i, int) and not isinstance(i, bool) for i in order):
        return "must be a tuple of integers"
    if sorted(order) != list(range(1, len(order) + 1)):
        return f"must be a permutation of 1..{len(order)}"
    return None


_B = Argument("b", int, _at_least(2), "number of branches")
_DIM = Argument("dim", int, _at_least(1), "feature axis, counted from 1")


def _numel(state: FeatureState) -> int:
    return math.prod(state.shape)


def _single(op: Operation, signal: Signal) -> FeatureState:
    """The one branch a branching or one-to-one operation takes."""
    if len(signal) != 1:
        raise infeasible(f"{op.name} takes one branch, got {len(signal)}: {describe(signal)}")
    return signal[0]


def _without(shape: tuple[int, ...], dim: int) -> tuple[int, ...]:
    return shape[: dim - 1] + shape[dim:]


def _check_dim(state: FeatureState, dim: int) -> None:
    if dim > len(state.shape):
        raise infeasible(f"dim {dim} does not exist in {state} (it has {len(state.shape)} axes)")


def _branches(op: Operation, signal: Signal, count: int | None = None) -> Signal:
    """The branches of an aggregation's input: exactly `count`, or at least 2; one mode and rank."""
    if count is not None and len(signal) != count:
        raise infeasible(f"{op.name} needs exactly {count} branches, got {len(signal)}: {describe(signal)}")
    if len(signal) < 2:
        raise infeasible(f"{op.name} needs at least 2 branches, got {len(signal)}: {describe(signal)}")
    first = signal[0]
    for other in signal[1:]:
        if other.mode != first.mode or len(other.shape) != len(first.shape):
            raise infeasible(f"{op.name} needs one mode and rank in all branches, got {first} and {other}")
    return signal


# ---------------------------------------------------------------- branching


@register_op
class Clone(Operation):
    """b copies of the input, for parallel branches (FLOPs 0)."""

    name = "clone"
    group = Group.BRANCHING
    arguments = (_B,)
    exportable = True

    def infer(self, signal: Signal, args: Mapping[str, Any]) -> Signal:
        state = _single(self, signal)
        return (state,) * args["b"]

    def build(self, signal: Signal, args: Mapping[str, Any]) -> nn.Module:
        self.infer(signal, args)
        return _modules.Clone(args["b"])


@register_op
class GroupDim(Operation):
    """Split feature axis `dim` into b equal parts, one per branch (FLOPs 0)."""

    name = "group_dim"
    group = Group.BRANCHING
    arguments = (_DIM, _B)
    exportable = True

    def infer(self, signal: Signal, args: Mapping[str, Any]) -> Signal:
        state = _single(self, signal)
        dim, b = args["dim"], args["b"]
        _check_dim(state, dim)
        size = state.shape[dim - 1]
        if size % b:
            raise infeasible(f"axis {dim} of {state} has size {size}, not divisible into {b} groups")
        shape = state.shape[: dim - 1] + (size // b,) + state.shape[dim:]
        return (state._replace(shape=shape),) * b

    def build(self, signal: Signal, args: Mapping[str, Any]) -> nn.Module:
        self.infer(signal, args)
        return _modules.GroupDim(args["dim"], args["b"])

    def abstract(self, mode: str, b: int, args: Mapping[str, Any]) -> tuple[str, int] | None:
        return (mode, args["b"]) if b == 1 and args["dim"] <= RANK_OF_MODE[mode] else None


# ---------------------------------------------------------------- aggregation


@register_op
class MatMul(Operation):
    """Matrix product of two branches over their last two axes; leading axes must agree.

    col: (S, D) @ (D, M) -> (S, M); im: per channel, (C, H, W) @ (C, W, V) -> (C, H, V).
    `scaled` multiplies by 1/sqrt(inner size), as in scaled dot-product attention.
    FLOPs: 2 * lead * a[-2] * a[-1] * b[-1], plus one per output element when scaled.
    """

    name = "matmul"
    group = Group.AGGREGATION
    arguments = (Argument("scaled", bool, doc="multiply by 1/sqrt(inner size)"),)
    exportable = True

    def infer(self, signal: Signal, args: Mapping[str, Any]) -> Signal:
        a, b = _branches(self, signal, 2)
        if a.shape[:-2] != b.shape[:-2] or a.shape[-1] != b.shape[-2]:
            raise infeasible(
                f"matmul cannot multiply {a} by {b}: needs equal leading axes and "
                f"inner sizes that match ({a.shape[-1]} vs {b.shape[-2]})"
            )
        return (a._replace(shape=a.shape[:-1] + (b.shape[-1],)),)

    def build(self, signal: Signal, args: Mapping[str, Any]) -> nn.Module:
        self.infer(signal, args)
        return _modules.MatMul(1 / math.sqrt(signal[0].shape[-1]) if args["scaled"] else None)

    def flops(self, signal: Signal, args: Mapping[str, Any]) -> int:
        (out,) = self.infer(signal, args)
        return 2 * _numel(out) * signal[0].shape[-1] + (_numel(out) if args["scaled"] else 0)

    def abstract(self, mode: str, b: int, args: Mapping[str, Any]) -> tuple[str, int] | None:
        return (mode, 1) if b == 2 else None


@register_op
class Add(Operation):
    """Elementwise sum of two or more branches of one shape. FLOPs: (b - 1) * numel."""

    name = "add"
    group = Group.AGGREGATION
    exportable = True

    def infer(self, signal: Signal, args: Mapping[str, Any]) -> Signal:
        first, *rest = _branches(self, signal)
        for other in rest:
            if other.shape != first.shape:
                raise infeasible(f"add needs equal shapes, got {first} and {other}")
        return (first,)

    def build(self, signal: Signal, args: Mapping[str, Any]) -> nn.Module:
        self.infer(signal, args)
        return _modules.Add()

    def flops(self, signal: Signal, args: Mapping[str, Any]) -> int:
        self.infer(signal, args)
        return (len(signal) - 1) * _numel(signal[0])


@register_op
class Concat(Operation):
    """Join exactly b branches along feature axis `dim`; the other axes must agree (FLOPs 0).

    `b` must equal the incoming branching factor: the paper's code did not check it, and its
    inferred shapes then diverged from the real ones.
    """

    name = "concat"
    group = Group.AGGREGATION
    arguments = (_DIM, _B)
    exportable = True

    def infer(self, signal: Signal, args: Mapping[str, Any]) -> Signal:
        dim = args["dim"]
        first, *rest = _branches(self, signal, args["b"])
        _check_dim(first, dim)
        for other in rest:
            if _without(other.shape, dim) != _without(first.shape, dim):
                raise infeasible(
                    f"concat along axis {dim} needs the other axes equal, got {first} and {other}"
                )
        size = sum(s.shape[dim - 1] for s in signal)
        return (first._replace(shape=first.shape[: dim - 1] + (size,) + first.shape[dim:]),)

    def build(self, signal: Signal, args: Mapping[str, Any]) -> nn.Module:
        self.infer(signal, args)
        return _modules.Concat(args["dim"])

    def abstract(self, mode: str, b: int, args: Mapping[str, Any]) -> tuple[str, int] | None:
        return (mode, 1) if b == args["b"] and args["dim"] <= RANK_OF_MODE[mode] else None


# ---------------------------------------------------------------- one-to-one operations


class UnaryOperation(Operation):
    """Routing and computation: one branch in, one out. Subclasses work on that branch's state.

    They override `apply` (default: the state passes unchanged), `module`, and where they have
    them `params` and `cost`. `build` runs `apply` first, so no module is ever made for a state
    it cannot take.
    """

    def apply(self, state: FeatureState, args: Mapping[str, Any]) -> FeatureState:
        return state

    def module(self, state: FeatureState, args: Mapping[str, Any]) -> nn.Module:
        raise NotImplementedError

    def params(self, state: FeatureState, args: Mapping[str, Any]) -> int:
        return 0

    def cost(self, state: FeatureState, args: Mapping[str, Any]) -> int:
        return 0

    def infer(self, signal: Signal, args: Mapping[str, Any]) -> Signal:
        state = _single(self, signal)
        return (self.apply(state, args),)

    def build(self, signal: Signal, args: Mapping[str, Any]) -> nn.Module:
        state = _single(self, signal)
        self.apply(state, args)
        return self.module(state, args)

    def param_count(self, signal: Signal, args: Mapping[str, Any]) -> int:
        return self.params(_single(self, signal), args)

    def flops(self, signal: Signal, args: Mapping[str, Any]) -> int:
        return self.cost(_single(self, signal), args)


# ---------------------------------------------------------------- routing


@register_op
class Identity(UnaryOperation):
    """Pass the input on; the grammar uses it both as a routing and as a computation function."""

    name = "identity"
    group = Group.ROUTING
    exportable = True

    def module(self, state: FeatureState, args: Mapping[str, Any]) -> nn.Module:
        return _modules.Identity()


def _im2col_out(state: FeatureState, k: int, s: int, p: int) -> tuple[int, int]:
    if state.mode != IM:
        raise infeasible(f"im2col needs im mode, got {state}")
    _, h, w = state.shape
    if min(h, w) + 2 * p < k:
        raise infeasible(f"kernel {k} larger than the padded input {h + 2 * p}x{w + 2 * p} of {state}")
    return (h + 2 * p - k) // s + 1, (w + 2 * p - k) // s + 1


@register_op
class Im2Col(UnaryOperation):
    """Sliding k×k patches (stride s, zero padding p) of (a, H, W) as tokens (h·w, a·k·k).

    The first axis counts as channels, also after a permute. (h, w) is pushed on the folds for
    the col2im that closes this routing module (paper App. A.3).
    """

    name = "im2col"
    group = Group.ROUTING
    exportable = True
    arguments = (
        Argument("k", int, _at_least(1), "kernel size"),
        Argument("s", int, _at_least(1), "stride"),
        Argument("p", int, _at_least(0), "zero padding"),
    )

    def apply(self, state: FeatureState, args: Mapping[str, Any]) -> FeatureState:
        k = args["k"]
        h, w = _im2col_out(state, k, args["s"], args["p"])
        return FeatureState((h * w, state.shape[0] * k * k), COL, state.folds + ((h, w),))

    def module(self, state: FeatureState, args: Mapping[str, Any]) -> nn.Module:
        return _modules.Im2Col(args["k"], args["s"], args["p"])

    def abstract(self, mode: str, b: int, args: Mapping[str, Any]) -> tuple[str, int] | None:
        return (COL, 1) if b == 1 and mode == IM else None


@register_op
class Col2Im(UnaryOperation):
    """Tokens (h·w, D) back to an image (D, h, w), with (h, w) taken from the pending im2col fold."""

    name = "col2im"
    group = Group.ROUTING
    exportable = True

    def apply(self, state: FeatureState, args: Mapping[str, Any]) -> FeatureState:
        if state.mode != COL:
            raise infeasible(f"col2im needs col mode, got {state}")
        if not state.folds:
            raise infeasible(f"col2im needs a pending fold from an enclosing im2col, and {state} has none")
        h, w = state.folds[-1]
        if state.shape[0] != h * w:
            raise infeasible(
                f"col2im cannot fold {state} into {h}x{w}: the sequence length changed since the "
                f"im2col ({state.shape[0]} != {h}*{w})"
            )
        return FeatureState((state.shape[1], h, w), IM, state.folds[:-1])

    def module(self, state: FeatureState, args: Mapping[str, Any]) -> nn.Module:
        h, w = state.folds[-1]
        return _modules.Col2Im(h, w)

    def abstract(self, mode: str, b: int, args: Mapping[str, Any]) -> tuple[str, int] | None:
        return (IM, 1) if b == 1 and mode == COL else None


@register_op
class Permute(UnaryOperation):
    """Reorder the feature axes: output axis i is input axis order[i]; mode and folds stay."""

    name = "permute"
    group = Group.ROUTING
    arguments = (Argument("order", tuple, _permutation, "feature axes (from 1) in their new order"),)
    exportable = True

    def apply(self, state: FeatureState, args: Mapping[str, Any]) -> FeatureState:
        order = args["order"]
        if len(order) != len(state.shape):
            raise infeasible(
                f"permute order {order} has {len(order)} axes but {state} has {len(state.shape)}"
            )
        return state._replace(shape=tuple(state.shape[i - 1] for i in order))

    def module(self, state: FeatureState, args: Mapping[str, Any]) -> nn.Module:
        return _modules.Permute(args["order"])

    def abstract(self, mode: str, b: int, args: Mapping[str, Any]) -> tuple[str, int] | None:
        return (mode, 1) if b == 1 and len(args["order"]) == RANK_OF_MODE[mode] else None


# ---------------------------------------------------------------- computation


def _features(state: FeatureState) -> int:
    """The axis a linear or norm acts on: the last in col mode, the first (channels) in im mode."""
    return state.shape[-1] if state.mode == COL else state.shape[0]


@register_op
class Linear(UnaryOperation):
    """A fully connected layer to d features.

    col mode: over the last axis D (nn.Linear). im mode: over the first axis, the channels,
    i.e. a 1×1 convolution with nn.Linear's parameters. (The paper's code acts on the last
    axis, the width, in im mode; mixing channels is what a linear means to convolutional
    networks, and it makes im2col·linear·col2im the only way to mix space.)
    Params: in·d + d. FLOPs: (2·in·d + d) per position.
    """

    name = "linear"
    group = Group.COMPUTATION
    arguments = (Argument("d", int, _at_least(1), "output features"),)
    exportable = True

    def apply(self, state: FeatureState, args: Mapping[str, Any]) -> FeatureState:
        d = args["d"]
        shape = state.shape[:-1] + (d,) if state.mode == COL else (d,) + state.shape[1:]
        return state._replace(shape=shape)

    def module(self, state: FeatureState, args: Mapping[str, Any]) -> nn.Module:
        layer = _modules.Linear if state.mode == COL else _modules.ChannelLinear
        return layer(_features(state), args["d"])

    def params(self, state: FeatureState, args: Mapping[str, Any]) -> int:
        return (_features(state) + 1) * args["d"]

    def cost(self, state: FeatureState, args: Mapping[str, Any]) -> int:
        n_in = _features(state)
        return (2 * n_in + 1) * args["d"] * (_numel(state) // n_in)


@register_op
class Norm(UnaryOperation):
    """BatchNorm2d over the first axis in im mode, LayerNorm over the last in col mode.

    Params: 2 per feature (scale, shift). FLOPs ≈ 4·numel (centre, divide, scale, shift).
    """

    name = "norm"
    group = Group.COMPUTATION
    exportable = True

    def module(self, state: FeatureState, args: Mapping[str, Any]) -> nn.Module:
        return (_modules.LayerNorm if state.mode == COL else _modules.BatchNorm2d)(_features(state))

    def params(self, state: FeatureState, args: Mapping[str, Any]) -> int:
        return 2 * _features(state)

    def cost(self, state: FeatureState, args: Mapping[str, Any]) -> int:
        return 4 * _numel(state)


@register_op
class LeakyReLU(UnaryOperation):
    """max(x, 0.01·x). FLOPs: numel."""

    name = "leaky_relu"
    group = Group.COMPUTATION
    exportable = True

    def module(self, state: FeatureState, args: Mapping[str, Any]) -> nn.Module:
        return _modules.LeakyReLU(0.01)

    def cost(self, state: FeatureState, args: Mapping[str, Any]) -> int:
        return _numel(state)


@register_op
class Softmax(UnaryOperation):
    """Softmax over the last axis. FLOPs ≈ 3·numel (exponent, sum, divide)."""

    name = "softmax"
    group = Group.COMPUTATION
    exportable = True

    def module(self, state: FeatureState, args: Mapping[str, Any]) -> nn.Module:
        return _modules.Softmax(dim=-1)

    def cost(self, state: FeatureState, args: Mapping[str, Any]) -> int:
        return 3 * _numel(state)


@register_op
class PosEnc(UnaryOperation):
    """A learnable positional encoding of the feature shape, added. Params and FLOPs: numel."""

    name = "pos_enc"
    group = Group.COMPUTATION
    exportable = True

    def module(self, state: FeatureState, args: Mapping[str, Any]) -> nn.Module:
        return _modules.PositionalEncoding(state.shape)

    def params(self, state: FeatureState, args: Mapping[str, Any]) -> int:
        return _numel(state)

    def cost(self, state: FeatureState, args: Mapping[str, Any]) -> int:
        return _numel(state)

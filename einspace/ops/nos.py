"""Neural Operator Search's self-calibration operations (paper 003) as terminals.

A calibration generates, from a generator tensor G, either an attention map A(G) that scales
the features F (channel or spatial attention) or per-sample, per-channel kernels D(G) that
filter them (dynamic convolution), and adds the result to F:

    F + F · A(G)        F + F ⊛ D(G)

Two forms, one module each kind:
- unary computation terminals `channel_attention`, `spatial_attention`, `dynamic_conv(k)`:
  the generator is the features themselves (G = F), x + x · A(x) and x + x ⊛ D(x);
- the paper's calibrating combination as aggregations of a two-branch module,
  `channel_calibrate`, `spatial_calibrate`, `dynamic_calibrate(k)`: branch 1 carries the
  features F, branch 2 the generator G, which may have another width (and, for channel
  attention and dynamic convolution, another resolution). In a grammar that is
  `B (M, M) A` with `clone(b = 2)` and one of these as A, so the search chooses both what
  is calibrated and what generates the calibration.

Generators as the notes (`shared/notes/nos.md`) give them, every convolution without bias:
channel attention: global average pool, 1×1 conv C_g -> C_g//16, ReLU, 1×1 conv -> C_f,
sigmoid. Spatial attention: 1×1 conv C_g -> C_g//16, BatchNorm, ReLU, 3×3 conv -> 1 (padding
1), sigmoid. Dynamic convolution (C' = C_g//8): u = ReLU(BN(1×1 conv C_g -> C')(G)) as (C', HW),
m = softmax over HW of (1×1 conv C_g -> k²)(G), u·mᵀ viewed (C', k, k), 1×1 conv C' -> C_f,
softmax over the k² taps; applied depth-wise with padding k//2. im mode only; an op whose
reduced width would be 0 (C_g < 16, or < 8 for dynamic convolution) is infeasible.

FLOPs per sample (a multiply-add counts 2, as in core): convolutions 2·in·out·positions;
BatchNorm 4 and softmax 3 per element, ReLU and sigmoid 1, average pool 1 per input element;
the calibration itself 2 per element of F (product and sum); the depth-wise filter 2·k² per
element of F.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from einspace.ops.core import UnaryOperation
from einspace.ops.registry import Argument, Group, Operation, infeasible, register_op
from einspace.state import IM, FeatureState, Signal, describe


def _odd(value: int) -> str | None:
    return None if value >= 1 and value % 2 == 1 else "must be an odd kernel size >= 1"


_K = Argument("k", int, _odd, "kernel size of the dynamic convolution")


# ---------------------------------------------------------------- the generators


def _conv1x1(c_in: int, c_out: int) -> nn.Conv2d:
    return nn.Conv2d(c_in, c_out, 1, bias=False)


class _Generator(nn.Module):
    """What a calibration kind needs besides its forward: its reduction, whether the generator
    must have the features' resolution, and its analytic parameter and FLOP counts."""

    reduction: int
    same_resolution: bool = False

    @staticmethod
    def param_count(c_f: int, c_g: int, r: int, args: Mapping[str, Any]) -> int:
        raise NotImplementedError

    @staticmethod
    def flop_count(c_f: int, c_g: int, r: int, hw: int, args: Mapping[str, Any]) -> int:
        """FLOPs of generating (not applying) the calibration; hw = the generator's H·W."""
        raise NotImplementedError


class ChannelAttention(_Generator):
    """A(G) of shape (N, C_f, 1, 1), in (0, 1)."""

    reduction = 16

    def __init__(self, c_features: int, c_generator: int, args: Mapping[str, Any]):
        super().__init__()
        hidden = c_generator // self.reduction
        self.reduce = _conv1x1(c_generator, hidden)
        self.expand = _conv1x1(hidden, c_features)

    def forward(self, g: torch.Tensor) -> torch.Tensor:
        pooled = g.mean(dim=(2, 3), keepdim=True)
        return torch.sigmoid(self.expand(F.relu(self.reduce(pooled))))

    @staticmethod
    def param_count(c_f: int, c_g: int, r: int, args: Mapping[str, Any]) -> int:
        return c_g * r + r * c_f

    @staticmethod
    def flop_count(c_f: int, c_g: int, r: int, hw: int, args: Mapping[str, Any]) -> int:
        return c_g * hw + 2 * c_g * r + r + 2 * r * c_f + c_f


class SpatialAttention(_Generator):
    """A(G) of shape (N, 1, H, W), in (0, 1)."""

    reduction = 16
    same_resolution = True

    def __init__(self, c_features: int, c_generator: int, args: Mapping[str, Any]):
        super().__init__()
        hidden = c_generator // self.reduction
        self.reduce = _conv1x1(c_generator, hidden)
        self.norm = nn.BatchNorm2d(hidden)
        self.spatial = nn.Conv2d(hidden, 1, 3, padding=1, bias=False)

    def forward(self, g: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(self.spatial(F.relu(self.norm(self.reduce(g)))))

    @staticmethod
    def param_count(c_f: int, c_g: int, r: int, args: Mapping[str, Any]) -> int:
        return c_g * r + 2 * r + 9 * r

    @staticmethod
    def flop_count(c_f: int, c_g: int, r: int, hw: int, args: Mapping[str, Any]) -> int:
        return (2 * c_g * r + 5 * r + 18 * r + 1) * hw


class DynamicKernel(_Generator):
    """D(G) of shape (N, C_f, k, k): per sample and channel, positive taps that sum to 1."""

    reduction = 8

    def __init__(self, c_features: int, c_generator: int, args: Mapping[str, Any]):
        super().__init__()
        hidden = c_generator // self.reduction
        self.k = args["k"]
        self.values = _conv1x1(c_generator, hidden)
        self.norm = nn.BatchNorm2d(hidden)
        self.taps = _conv1x1(c_generator, self.k**2)
        self.expand = _conv1x1(hidden, c_features)

    def forward(self, g: torch.Tensor) -> torch.Tensor:
        u = F.relu(self.norm(self.values(g))).flatten(2)  # (N, C', HW)
        m = torch.softmax(self.taps(g).flatten(2), dim=-1)  # (N, k², HW)
        pooled = torch.bmm(u, m.transpose(1, 2))  # (N, C', k²)
        kernel = self.expand(pooled.unflatten(2, (self.k, self.k)))  # (N, C_f, k, k)
        return torch.softmax(kernel.flatten(2), dim=-1).unflatten(2, (self.k, self.k))

    @staticmethod
    def param_count(c_f: int, c_g: int, r: int, args: Mapping[str, Any]) -> int:
        return c_g * r + 2 * r + c_g * args["k"] ** 2 + r * c_f

    @staticmethod
    def flop_count(c_f: int, c_g: int, r: int, hw: int, args: Mapping[str, Any]) -> int:
        k2 = args["k"] ** 2
        per_position = 2 * c_g * r + 5 * r + 2 * c_g * k2 + 3 * k2 + 2 * r * k2
        return per_position * hw + 2 * r * c_f * k2 + 3 * c_f * k2


def _depthwise(x: torch.Tensor, kernel: torch.Tensor) -> torch.Tensor:
    """Filter each channel of each sample with its own kernel (N, C, k, k), same size out."""
    n, c, h, w = x.shape
    k = kernel.shape[-1]
    out = F.conv2d(x.reshape(1, n * c, h, w), kernel.reshape(n * c, 1, k, k), padding=k // 2, groups=n * c)
    return out.reshape(n, c, h, w)


class Calibration(nn.Module):
    """F + F · A(G) for attention generators, F + F ⊛ D(G) for dynamic kernels.

    Called with one tensor (the unary form, G = F) or with the list [F, G] (the aggregation).
    """

    def __init__(self, generator: _Generator):
        super().__init__()
        self.generator = generator

    def forward(self, inputs: torch.Tensor | list[torch.Tensor]) -> torch.Tensor:
        f, g = (inputs, inputs) if isinstance(inputs, torch.Tensor) else inputs
        made = self.generator(g)
        if isinstance(self.generator, DynamicKernel):
            return f + _depthwise(f, made)
        return f + f * made


# ---------------------------------------------------------------- what the operations share


class _Calibrating:
    """Checks and counts for one generator class, shared by the unary and the two-branch form."""

    name: str
    generator: type[_Generator]

    def _check(self, f: FeatureState, g: FeatureState) -> None:
        """Infeasible unless both are images, the reduced width is >= 1 and the shapes meet."""
        for state in (f, g):
            if state.mode != IM or len(state.shape) != 3:
                raise infeasible(f"{self.name} needs im-mode features (C, H, W), got {state}")
        reduction = self.generator.reduction
        if g.shape[0] // reduction < 1:
            raise infeasible(
                f"{self.name} reduces {g.shape[0]} channels by {reduction} to none: "
                f"it needs at least {reduction}"
            )
        if self.generator.same_resolution and f.shape[1:] != g.shape[1:]:
            raise infeasible(f"{self.name} needs features and generator of one resolution, got {f} and {g}")

    def _module(self, f: FeatureState, g: FeatureState, args: Mapping[str, Any]) -> nn.Module:
        self._check(f, g)
        return Calibration(self.generator(f.shape[0], g.shape[0], args))

    def _params(self, f: FeatureState, g: FeatureState, args: Mapping[str, Any]) -> int:
        self._check(f, g)
        reduced = g.shape[0] // self.generator.reduction
        return self.generator.param_count(f.shape[0], g.shape[0], reduced, args)

    def _flops(self, f: FeatureState, g: FeatureState, args: Mapping[str, Any]) -> int:
        self._check(f, g)
        c_g, h, w = g.shape
        r = c_g // self.generator.reduction
        made = self.generator.flop_count(f.shape[0], c_g, r, h * w, args)
        n_f = math.prod(f.shape)
        applied = 2 * args["k"] ** 2 * n_f + n_f if "k" in args else 2 * n_f
        return made + applied


# ---------------------------------------------------------------- the registered operations


class _SelfCalibration(_Calibrating, UnaryOperation):
    """x + x · A(x) or x + x ⊛ D(x): the calibration generated from the features themselves."""

    group = Group.COMPUTATION

    def apply(self, state: FeatureState, args: Mapping[str, Any]) -> FeatureState:
        self._check(state, state)
        return state

    def module(self, state: FeatureState, args: Mapping[str, Any]) -> nn.Module:
        return self._module(state, state, args)

    def params(self, state: FeatureState, args: Mapping[str, Any]) -> int:
        return self._params(state, state, args)

    def cost(self, state: FeatureState, args: Mapping[str, Any]) -> int:
        return self._flops(state, state, args)

    def abstract(self, mode: str, b: int, args: Mapping[str, Any]) -> tuple[str, int] | None:
        return (mode, 1) if b == 1 and mode == IM else None


class _CalibratingCombination(_Calibrating, Operation):
    """Two branches in, F then G: F calibrated by what G generates (NOS's combination)."""

    group = Group.AGGREGATION

    def _pair(self, signal: Signal) -> tuple[FeatureState, FeatureState]:
        if len(signal) != 2:
            raise infeasible(f"{self.name} needs 2 branches (features, generator), got {describe(signal)}")
        f, g = signal
        self._check(f, g)
        return f, g

    def infer(self, signal: Signal, args: Mapping[str, Any]) -> Signal:
        return (self._pair(signal)[0],)

    def build(self, signal: Signal, args: Mapping[str, Any]) -> nn.Module:
        return self._module(*self._pair(signal), args)

    def param_count(self, signal: Signal, args: Mapping[str, Any]) -> int:
        return self._params(*self._pair(signal), args)

    def flops(self, signal: Signal, args: Mapping[str, Any]) -> int:
        return self._flops(*self._pair(signal), args)

    def abstract(self, mode: str, b: int, args: Mapping[str, Any]) -> tuple[str, int] | None:
        return (mode, 1) if b == 2 and mode == IM else None


#: (unary name, two-branch name, generator, arguments, what it is, how it calibrates).
_TABLE = (
    ("channel_attention", "channel_calibrate", ChannelAttention, (), "channel attention (r = 16)", "·A"),
    ("spatial_attention", "spatial_calibrate", SpatialAttention, (), "spatial attention (r = 16)", "·A"),
    ("dynamic_conv", "dynamic_calibrate", DynamicKernel, (_K,), "dynamic convolution (r = 8)", " ⊛ D"),
)

for _unary, _combination, _generator, _arguments, _what, _by in _TABLE:
    for _name, _base, _description in (
        (_unary, _SelfCalibration, f"NOS self-calibration by {_what}: x + x{_by}(x), im mode"),
        (_combination, _CalibratingCombination, f"NOS calibrating combination by {_what}: F + F{_by}(G)"),
    ):
        _fields = dict(name=_name, generator=_generator, arguments=_arguments, description=_description)
        register_op(type(_name, (_base,), _fields))

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

The operations' shape rules and counts are here, without torch; the generators and the
calibration module are in `einspace.ops._nos_modules`, imported when the first is built.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from einspace.ops.core import UnaryOperation
from einspace.ops.registry import Argument, Group, Operation, infeasible, register_op, torch_side
from einspace.state import IM, FeatureState, Signal, describe

if TYPE_CHECKING:
    from torch import nn

__all__ = ["CHANNEL_ATTENTION", "DYNAMIC_KERNEL", "SPATIAL_ATTENTION", "GeneratorKind"]


def _odd(value: int) -> str | None:
    return None if value >= 1 and value % 2 == 1 else "must be an odd kernel size >= 1"


_K = Argument("k", int, _odd, "kernel size of the dynamic convolution")


# ---------------------------------------------------------------- the generators' counts


@dataclass(frozen=True)
class GeneratorKind:
    """What the operations need of a kind of generator, without building it: the module that
    generates (in `einspace.ops._nos_modules`), its channel reduction, whether the generator must
    have the features' resolution, and its analytic parameter and FLOP counts (of generating,
    not applying, the calibration; c_f, c_g the features' and generator's channels, r the reduced
    width, hw the generator's H·W)."""

    module: str
    reduction: int
    same_resolution: bool
    param_count: Callable[[int, int, int, Mapping[str, Any]], int]
    flop_count: Callable[[int, int, int, int, Mapping[str, Any]], int]


def _dynamic_flops(c_f: int, c_g: int, r: int, hw: int, args: Mapping[str, Any]) -> int:
    k2 = args["k"] ** 2
    per_position = 2 * c_g * r + 5 * r + 2 * c_g * k2 + 3 * k2 + 2 * r * k2
    return per_position * hw + 2 * r * c_f * k2 + 3 * c_f * k2


#: A(G) of shape (N, C_f, 1, 1), in (0, 1).
CHANNEL_ATTENTION = GeneratorKind(
    "ChannelAttention",
    16,
    False,
    lambda c_f, c_g, r, args: c_g * r + r * c_f,
    lambda c_f, c_g, r, hw, args: c_g * hw + 2 * c_g * r + r + 2 * r * c_f + c_f,
)
#: A(G) of shape (N, 1, H, W), in (0, 1).
SPATIAL_ATTENTION = GeneratorKind(
    "SpatialAttention",
    16,
    True,
    lambda c_f, c_g, r, args: c_g * r + 2 * r + 9 * r,
    lambda c_f, c_g, r, hw, args: (2 * c_g * r + 5 * r + 18 * r + 1) * hw,
)
#: D(G) of shape (N, C_f, k, k): per sample and channel, positive taps that sum to 1.
DYNAMIC_KERNEL = GeneratorKind(
    "DynamicKernel",
    8,
    False,
    lambda c_f, c_g, r, args: c_g * r + 2 * r + c_g * args["k"] ** 2 + r * c_f,
    _dynamic_flops,
)

#: The generators and the calibration, imported at the first build.
_modules = torch_side("einspace.ops._nos_modules")


# ---------------------------------------------------------------- what the operations share


class _Calibrating:
    """Checks and counts for one generator class, shared by the unary and the two-branch form."""

    name: str
    generator: GeneratorKind
    exportable = True  # export writes the calibrations as small helper classes

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
        generator = getattr(_modules, self.generator.module)(f.shape[0], g.shape[0], args)
        return _modules.Calibration(generator)

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
    ("channel_attention", "channel_calibrate", CHANNEL_ATTENTION, (), "channel attention (r = 16)", "·A"),
    ("spatial_attention", "spatial_calibrate", SPATIAL_ATTENTION, (), "spatial attention (r = 16)", "·A"),
    ("dynamic_conv", "dynamic_calibrate", DYNAMIC_KERNEL, (_K,), "dynamic convolution (r = 8)", " ⊛ D"),
)

for _unary, _combination, _generator, _arguments, _what, _by in _TABLE:
    for _name, _base, _description in (
        (_unary, _SelfCalibration, f"NOS self-calibration by {_what}: x + x{_by}(x), im mode"),
        (_combination, _CalibratingCombination, f"NOS calibrating combination by {_what}: F + F{_by}(G)"),
    ):
        _fields = dict(name=_name, generator=_generator, arguments=_arguments, description=_description)
        register_op(type(_name, (_base,), _fields))

"""The terminals of the architectures people use (issue 25), for the `einspace_zoo` grammar:
activations, dropout, max and average pooling, depthwise and grouped convolution,
squeeze-and-excitation, layer scale, a layer norm over an image's channels, a class token and
class-token pooling (the first token), and ResMLP's affine norm.

Shapes exclude the batch axis; FLOPs are per sample with a multiply-add counted as 2 (as in
`core`). Per element: ReLU 1, ReLU6 2 (two clamps), SiLU 4 (x·σ(x): exponent, sum, divide,
product), Hardswish 4 (add, clamp twice, product and divide counted as 4), GELU 8 (the erf form:
a rational approximation of erf and the product), dropout 1 (the mask's product, in training).
Layer scale: a learnt scale per feature (channels in im mode, the last axis in col mode), 1 FLOP
per element, a parameter per feature; affine (ResMLP): a scale and a shift per feature, 2 FLOPs
per element (a multiply-add), two parameters per feature. Pooling: max (k²−1) comparisons and
average k² operations (k²−1 sums, one division) per output element. Depthwise convolution
(C → C, one k×k filter per channel, with a bias): (2·k² + 1) per output element, C·k² + C
parameters; grouped (g groups): (2·(C/g)·k² + 1) per output element, C·(C/g)·k² + C parameters.

The shape rules are here, without torch; the modules are in `einspace.ops._zoo_modules`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from einspace.ops.core import UnaryOperation
from einspace.ops.registry import Argument, Group, infeasible, register_op, torch_side
from einspace.state import IM, FeatureState

if TYPE_CHECKING:
    from torch import nn

_modules = torch_side("einspace.ops._zoo_modules")


def _numel(state: FeatureState) -> int:
    return math.prod(state.shape)


# ---------------------------------------------------------------- activations and dropout


class _Elementwise(UnaryOperation):
    """An elementwise computation: the state passes unchanged; `per_element` FLOPs each."""

    group = Group.COMPUTATION
    exportable = True
    per_element = 1
    module_name = ""

    def module(self, state: FeatureState, args: Mapping[str, Any]) -> nn.Module:
        return getattr(_modules, self.module_name)()

    def cost(self, state: FeatureState, args: Mapping[str, Any]) -> int:
        return self.per_element * _numel(state)


#: The activations: operation name -> (torch module, FLOPs per element, what it computes).
ACTIVATIONS = {
    "relu": ("ReLU", 1, "max(x, 0)."),
    "relu6": ("ReLU6", 2, "min(max(x, 0), 6)."),
    "gelu": ("GELU", 8, "x·Φ(x), with the exact (erf) Φ."),
    "silu": ("SiLU", 4, "x·σ(x) (swish)."),
    "hardswish": ("Hardswish", 4, "x·min(max(x + 3, 0), 6)/6."),
}

for _name, (_module, _flops, _doc) in ACTIVATIONS.items():
    register_op(
        type(
            _module,
            (_Elementwise,),
            {"__doc__": _doc, "name": _name, "module_name": _module, "per_element": _flops},
        )
    )


def _probability(value: float) -> str | None:
    return None if 0.0 <= value < 1.0 else "must be in [0, 1)"


@register_op
class Dropout(_Elementwise):
    """Zero each element with probability p in training (the rest scaled by 1/(1 − p)); the
    identity at inference."""

    name, per_element = "dropout", 1
    arguments = (Argument("p", float, _probability, "probability of zeroing an element"),)

    def module(self, state: FeatureState, args: Mapping[str, Any]) -> nn.Module:
        return _modules.Dropout(args["p"])


# ---------------------------------------------------------------- pooling and depthwise convolution

_KSP = (
    Argument("k", int, lambda v: None if v >= 1 else "must be >= 1", "kernel size"),
    Argument("s", int, lambda v: None if v >= 1 else "must be >= 1", "stride"),
    Argument("p", int, lambda v: None if v >= 0 else "must be >= 0", "zero padding"),
)


class _Window(UnaryOperation):
    """A k×k window (stride s, padding p) over an image (C, H, W): to (C, h, w), im mode only;
    torch allows padding up to half the kernel."""

    group = Group.COMPUTATION
    exportable = True
    arguments = _KSP

    def apply(self, state: FeatureState, args: Mapping[str, Any]) -> FeatureState:
        k, s, p = args["k"], args["s"], args["p"]
        if state.mode != IM:
            raise infeasible(f"{self.name} needs im mode, got {state}")
        if p > k // 2:
            raise infeasible(f"{self.name} padding {p} is more than half the kernel {k}")
        c, h, w = state.shape
        if min(h, w) + 2 * p < k:
            raise infeasible(f"kernel {k} larger than the padded input {h + 2 * p}x{w + 2 * p} of {state}")
        return state._replace(shape=(c, (h + 2 * p - k) // s + 1, (w + 2 * p - k) // s + 1))

    def abstract(self, mode: str, b: int, args: Mapping[str, Any]) -> tuple[str, int] | None:
        return (mode, 1) if b == 1 and mode == IM else None


@register_op
class MaxPool(_Window):
    """The maximum of each window (padding never wins: torch pads with −∞)."""

    name = "max_pool"

    def module(self, state: FeatureState, args: Mapping[str, Any]) -> nn.Module:
        return _modules.MaxPool2d(args["k"], args["s"], args["p"])

    def cost(self, state: FeatureState, args: Mapping[str, Any]) -> int:
        return (args["k"] ** 2 - 1) * _numel(self.apply(state, args))


@register_op
class AvgPool(_Window):
    """The mean of each window, zero padding counted (torch's default, as torchvision uses it)."""

    name = "avg_pool"

    def module(self, state: FeatureState, args: Mapping[str, Any]) -> nn.Module:
        return _modules.AvgPool2d(args["k"], args["s"], args["p"])

    def cost(self, state: FeatureState, args: Mapping[str, Any]) -> int:
        return args["k"] ** 2 * _numel(self.apply(state, args))


@register_op
class DepthwiseConv(_Window):
    """One k×k filter per channel, with a bias (`nn.Conv2d(C, C, k, s, p, groups=C)`)."""

    name = "depthwise_conv"

    def module(self, state: FeatureState, args: Mapping[str, Any]) -> nn.Module:
        return _modules.DepthwiseConv(state.shape[0], args["k"], args["s"], args["p"])

    def params(self, state: FeatureState, args: Mapping[str, Any]) -> int:
        return state.shape[0] * (args["k"] ** 2 + 1)

    def cost(self, state: FeatureState, args: Mapping[str, Any]) -> int:
        return (2 * args["k"] ** 2 + 1) * _numel(self.apply(state, args))


@register_op
class GroupedConv(_Window):
    """A k×k convolution C → C in g groups of C/g channels, with a bias (ResNeXt, RegNet:
    `nn.Conv2d(C, C, k, s, p, groups=g)`); g = 1 is a full convolution, g = C a depthwise one.
    Needs g to divide C."""

    name = "grouped_conv"
    arguments = (Argument("g", int, lambda v: None if v >= 1 else "must be >= 1", "groups"), *_KSP)

    def apply(self, state: FeatureState, args: Mapping[str, Any]) -> FeatureState:
        out = super().apply(state, args)
        if state.shape[0] % args["g"]:
            raise infeasible(f"grouped_conv: {args['g']} groups do not divide {state.shape[0]} channels")
        return out

    def module(self, state: FeatureState, args: Mapping[str, Any]) -> nn.Module:
        return _modules.GroupedConv(state.shape[0], args["g"], args["k"], args["s"], args["p"])

    def params(self, state: FeatureState, args: Mapping[str, Any]) -> int:
        c = state.shape[0]
        return c * (c // args["g"]) * args["k"] ** 2 + c

    def cost(self, state: FeatureState, args: Mapping[str, Any]) -> int:
        per_output = 2 * (state.shape[0] // args["g"]) * args["k"] ** 2 + 1
        return per_output * _numel(self.apply(state, args))


# ---------------------------------------------------------------- squeeze-and-excitation


def _activation(value: str) -> str | None:
    return None if value in SQUEEZE_ACTIVATIONS else f"must be one of {', '.join(SQUEEZE_ACTIVATIONS)}"


#: The activations between squeeze-and-excitation's two layers, with their FLOPs per element.
SQUEEZE_ACTIVATIONS = {"relu": ACTIVATIONS["relu"][1], "silu": ACTIVATIONS["silu"][1]}


def squeezed(channels: int, r: int) -> int:
    """The width of the squeeze, C / r (torchvision's EfficientNet: the block's input C_in / 4,
    C / 24 after an expansion by 6; SENet: C / 16). r must divide C, so that each r gives its own
    width (and an imported tree its one r)."""
    return channels // r


@register_op
class SqueezeExcite(UnaryOperation):
    """x · σ(W₂ act(W₁ mean(x) + b₁) + b₂): each channel rescaled by a gate computed from the
    mean of all channels (SENet, MobileNet, EfficientNet), im mode only; W₁ is C → C/r (r must
    divide C), W₂ back to C. Params: 2·C·(C/r) + C/r + C. FLOPs: the mean and the product 1 per
    element each, the two layers 2·C·(C/r) plus a bias each, the activation as `relu` or `silu`
    per squeezed element, the sigmoid 4 per channel (as SiLU: exponent, sum, divide)."""

    name = "squeeze_excite"
    group = Group.COMPUTATION
    exportable = True
    arguments = (
        Argument("r", int, lambda v: None if v >= 1 else "must be >= 1", "reduction of the squeeze"),
        Argument("act", str, _activation, "activation between the two layers"),
    )

    def apply(self, state: FeatureState, args: Mapping[str, Any]) -> FeatureState:
        if state.mode != IM:
            raise infeasible(f"squeeze_excite needs im mode, got {state}")
        if state.shape[0] % args["r"]:
            raise infeasible(f"squeeze_excite: r = {args['r']} does not divide {state.shape[0]} channels")
        return state

    def module(self, state: FeatureState, args: Mapping[str, Any]) -> nn.Module:
        c = state.shape[0]
        return _modules.SqueezeExcite(c, squeezed(c, args["r"]), args["act"])

    def params(self, state: FeatureState, args: Mapping[str, Any]) -> int:
        c = state.shape[0]
        d = squeezed(c, args["r"])
        return 2 * c * d + d + c

    def cost(self, state: FeatureState, args: Mapping[str, Any]) -> int:
        c = state.shape[0]
        d = squeezed(c, args["r"])
        layers = 4 * c * d + d + c
        return 2 * _numel(state) + layers + SQUEEZE_ACTIVATIONS[args["act"]] * d + 4 * c

    def abstract(self, mode: str, b: int, args: Mapping[str, Any]) -> tuple[str, int] | None:
        return (mode, 1) if b == 1 and mode == IM else None


# ---------------------------------------------------------------- layer scale


def _features(state: FeatureState) -> int:
    return state.shape[-1] if state.mode != IM else state.shape[0]


@register_op
class LayerScale(UnaryOperation):
    """x times a learnt scale per feature (CaiT, ConvNeXt: `x * gamma`), initialised at 0.1."""

    name = "layer_scale"
    group = Group.COMPUTATION
    exportable = True
    #: The learnt tensors per feature (one parameter and one FLOP per element each), and the module.
    tensors, module_name = 1, "LayerScale"

    def module(self, state: FeatureState, args: Mapping[str, Any]) -> nn.Module:
        return getattr(_modules, self.module_name)(_features(state), image=state.mode == IM)

    def params(self, state: FeatureState, args: Mapping[str, Any]) -> int:
        return self.tensors * _features(state)

    def cost(self, state: FeatureState, args: Mapping[str, Any]) -> int:
        return self.tensors * _numel(state)


@register_op
class Affine(LayerScale):
    """x times a learnt scale plus a learnt shift per feature (ResMLP's norm, timm's `Affine`:
    `torch.addcmul(beta, alpha, x)`), initialised at 1 and 0, so the identity at first."""

    name = "affine"
    tensors, module_name = 2, "Affine"


# ---------------------------------------------------------------- layer norm over an image's channels


@register_op
class ChannelNorm(UnaryOperation):
    """LayerNorm over the channels at each position of an image (ConvNeXt's LayerNorm2d, eps
    1e-6), im mode only. Params: 2·C (scale, shift). FLOPs ≈ 4·numel, as `norm`."""

    name = "channel_norm"
    group = Group.COMPUTATION
    exportable = True

    def apply(self, state: FeatureState, args: Mapping[str, Any]) -> FeatureState:
        if state.mode != IM:
            raise infeasible(f"channel_norm needs im mode, got {state}")
        return state

    def module(self, state: FeatureState, args: Mapping[str, Any]) -> nn.Module:
        return _modules.ChannelNorm(state.shape[0])

    def params(self, state: FeatureState, args: Mapping[str, Any]) -> int:
        return 2 * state.shape[0]

    def cost(self, state: FeatureState, args: Mapping[str, Any]) -> int:
        return 4 * _numel(state)

    def abstract(self, mode: str, b: int, args: Mapping[str, Any]) -> tuple[str, int] | None:
        return (mode, 1) if b == 1 and mode == IM else None


# ---------------------------------------------------------------- class token (ViT, DeiT)


class _Tokens(UnaryOperation):
    """An operation on tokens [N, D] (col mode only) that computes nothing (FLOPs 0)."""

    group = Group.COMPUTATION
    exportable = True

    def _tokens_only(self, state: FeatureState) -> None:
        if state.mode == IM:
            raise infeasible(f"{self.name} needs tokens (col mode), got {state}")

    def abstract(self, mode: str, b: int, args: Mapping[str, Any]) -> tuple[str, int] | None:
        return (mode, 1) if b == 1 and mode != IM else None


@register_op
class ClassToken(_Tokens):
    """A learnt token put in front of the tokens (ViT's class token): [N, D] -> [N + 1, D].
    Params: D."""

    name = "class_token"

    def apply(self, state: FeatureState, args: Mapping[str, Any]) -> FeatureState:
        self._tokens_only(state)
        return state._replace(shape=(state.shape[0] + 1, *state.shape[1:]))

    def module(self, state: FeatureState, args: Mapping[str, Any]) -> nn.Module:
        return _modules.ClassToken(state.shape[-1])

    def params(self, state: FeatureState, args: Mapping[str, Any]) -> int:
        return state.shape[-1]


@register_op
class FirstToken(_Tokens):
    """The first token alone, [N, D] -> [1, D]: class-token pooling, the head's mean over one
    token being that token (ViT's `x[:, 0]`)."""

    name = "first_token"

    def apply(self, state: FeatureState, args: Mapping[str, Any]) -> FeatureState:
        self._tokens_only(state)
        return state._replace(shape=(1, *state.shape[1:]))

    def module(self, state: FeatureState, args: Mapping[str, Any]) -> nn.Module:
        return _modules.FirstToken()

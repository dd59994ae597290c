"""How the importer turns one-input operations and layers with weights into the grammar's operations:
activations, softmax, dropout, pooling, a positional encoding, layer scale and affine,
convolutions, linears and norms.

`LayerRules` is a part of `Converter` (converter.py), which provides the traced model (`values`,
`modules`, `fail`, `short`, `constants`), the grammar's grid (`terminal`, `grid`) and the record of
substitutions (`substituted`) and used modules (`use`).
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable
from typing import Any

import torch
import torch.fx as fx
import torch.nn.functional as F
from torch import nn

from einspace.network.importer.graph import target_name
from einspace.network.importer.pieces import Entry, Piece, Route
from einspace.network.importer.weights import linear_entry
from einspace.seeds import architectures as arch

__all__ = ["MODULE_HANDLERS", "LayerRules", "activation_name", "exact_but_groups", "is_addcmul"]

#: Activations the paper's grammar lacks: each becomes its leaky ReLU, as a substitution.
_ACTIVATION_MODULES = tuple(
    getattr(nn, n) for n in "ReLU GELU SiLU ELU Tanh Sigmoid ReLU6 Hardswish Mish".split()
)
_ACTIVATION_FUNCTIONS = (torch.relu, torch.tanh, torch.sigmoid) + tuple(
    getattr(F, n) for n in "relu gelu silu elu relu6 hardswish mish".split()
)
_ACTIVATION_METHODS = {"relu", "sigmoid", "tanh"}
#: The activations that the zoo grammar has, by module type and by function or method.
_ZOO_ACTIVATIONS = {
    nn.ReLU: "relu",
    nn.ReLU6: "relu6",
    nn.GELU: "gelu",
    nn.SiLU: "silu",
    nn.Hardswish: "hardswish",
}
_ZOO_FUNCTIONS = {
    F.relu: "relu",
    torch.relu: "relu",
    "relu": "relu",
    F.relu6: "relu6",
    F.gelu: "gelu",
    F.silu: "silu",
    F.hardswish: "hardswish",
}
_POOL_MODULES = (nn.MaxPool2d, nn.AvgPool2d)
_POOL_FUNCTIONS = {F.max_pool2d, F.avg_pool2d}


class LayerRules:
    """One-input operations (by module type through `MODULE_HANDLERS`, else by function) and
    layers with weights, each as the pieces and routes of the grammar that compute it.

    Long because it holds one short rule per layer kind the importer maps (22 methods, the zoo
    grammar's pooling, depthwise and grouped convolution, activations, norms, layer scale and affine
    among them); a mixin of the converter, it shares the converter's values and failure reporting,
    so splitting it by kind would only spread one dispatch over several classes."""

    # ------------------------------------------------------------- one-input operations

    def unary(self, node: fx.Node, source: fx.Node) -> list[Piece | Route]:
        value = self.values[source]
        if node.op == "call_module":
            module = self.modules[node.target]
            handler = next((h for kinds, h in MODULE_HANDLERS if isinstance(module, kinds)), None)
            if handler is not None:
                return handler(self, node, module, value)
            if self.passes_unchanged(node):  # e.g. a stochastic depth: the identity at inference
                return []
            raise self.fail(node, f"{type(module).__name__} has no counterpart in the grammar")
        target = node.target
        if target is F.leaky_relu:
            slope = node.args[1] if len(node.args) > 1 else node.kwargs.get("negative_slope", 0.01)
            return self.activation(node, slope)
        if target in _ACTIVATION_FUNCTIONS or (node.op == "call_method" and target in _ACTIVATION_METHODS):
            exact = target is not F.gelu or node.kwargs.get("approximate", "none") == "none"
            return self.activation(node, None, _ZOO_FUNCTIONS.get(target) if exact else None)
        if target in (F.softmax, torch.softmax) or (node.op == "call_method" and target == "softmax"):
            dim = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim")
            return self.softmax(node, dim, value)
        if target is F.dropout:
            return self.dropout(node, self.dropout_p(node) or 0.0)
        if target is F.unfold:
            return self.unfold(node)
        if target is F.layer_norm and value.dim() == 4 and "channel_norm" in self.grid:
            names = ("input", "normalized_shape", "weight", "bias", "eps")
            given = {**dict(zip(names, node.args, strict=False)), **node.kwargs}
            weight, bias = (self.values.get(given.get(n)) for n in ("weight", "bias"))
            return self.channel_norm(
                node, given["normalized_shape"], weight, bias, given.get("eps", 1e-5), value
            )
        if self.passes_unchanged(node):
            return []
        if target in _POOL_FUNCTIONS:
            kernel = node.args[1] if len(node.args) > 1 else node.kwargs["kernel_size"]
            stride = node.args[2] if len(node.args) > 2 else node.kwargs.get("stride") or kernel
            padding = node.args[3] if len(node.args) > 3 else node.kwargs.get("padding", 0)
            return self.pool(node, target_name(target), value, kernel, stride, padding)
        if target in (operator.add, torch.add) or (node.op == "call_method" and target == "add"):
            return self.positional(node, value)
        if target in (operator.mul, torch.mul) or (node.op == "call_method" and target in ("mul", "mul_")):
            return self.layer_scale(node, value)
        raise self.fail(node, f"{target_name(target)} has no counterpart in the grammar")

    def activation(self, node: fx.Node, slope: float | None, name: str | None = None) -> list[Piece | Route]:
        """The grammar's operation `name` (relu, gelu, ...) where it has it; leaky ReLU as it is,
        or as the substitute of any other."""
        if name is not None and name in self.grid:
            self.terminal(node, name)
            return [Piece(arch.computation(name), ())]
        if slope != 0.01:
            what = f"leaky ReLU with slope {slope}" if slope is not None else self.short(node)
            self.substituted(node, what, "leaky_relu (slope 0.01), the grammar's activation")
        self.terminal(node, "leaky_relu")
        return [Piece(arch.act(), ())]

    def softmax(self, node: fx.Node, dim: int | None, value: torch.Tensor) -> list[Piece | Route]:
        if dim is None or dim % value.dim() != value.dim() - 1:
            raise self.fail(node, f"softmax over axis {dim}: the grammar's softmax is over the last axis")
        self.terminal(node, "softmax")
        return [Piece(arch.softmax(), ())]

    def dropout_p(self, node: fx.Node) -> float | None:
        """The p of a dropout (module or function); None for anything else."""
        if node.op == "call_module" and isinstance(self.modules[node.target], nn.Dropout):
            return float(self.modules[node.target].p)
        if node.target is F.dropout:
            return float(node.args[1] if len(node.args) > 1 else node.kwargs.get("p", 0.5))
        return None

    def kept_dropout(self, node: fx.Node) -> bool:
        """Whether `node` is a dropout that the grammar has (imported as it is, not left out)."""
        p = self.dropout_p(node)
        return bool(p) and ("p", p) in {a for args in self.grid.get("dropout", ()) for a in args}

    def dropout(self, node: fx.Node, p: float) -> list[Piece | Route]:
        """The grammar's dropout of this p where it has one (the same in training too); else left
        out, as it is the identity at inference (what the import reproduces)."""
        if self.kept_dropout(node):
            return [Piece(arch.computation("dropout", p=float(p)), ())]
        return []

    def unfold_grid(self, node: fx.Node) -> Any:
        """The im2col of an `F.unfold(x, k, dilation, padding, stride)`: patches [B, C·k·k, L]."""
        names = ("input", "kernel_size", "dilation", "padding", "stride")
        given = {**dict(zip(names, node.args, strict=False)), **node.kwargs}
        k, s, p = (square(given.get(n, d)) for n, d in (("kernel_size", 1), ("stride", 1), ("padding", 0)))
        if square(given.get("dilation", 1)) != 1 or any(
            isinstance(given.get(n), (tuple, list)) and len(set(given[n])) != 1
            for n in ("kernel_size", "stride", "padding", "dilation")
        ):
            raise self.fail(node, "an unfold with dilation, or unequal sizes along height and width")
        return self.terminal(node, "im2col", k=k, s=s, p=p)

    def unfold(self, node: fx.Node) -> list[Piece | Route]:
        """F.unfold read as it is, [B, C·k·k, L]: im2col (tokens [B, L, C·k·k]), then the swap
        of the two axes. (Followed by a transpose, as export writes it, the swaps cancel.)"""
        return [
            Route(self.unfold_grid(node), node),
            Route(self.terminal(node, "permute", order=(2, 1)), node),
        ]

    def pool(
        self, node: fx.Node, what: str, value: torch.Tensor, kernel: Any, stride: Any, padding: Any
    ) -> list[Piece | Route]:
        """The grammar's max_pool or avg_pool of these (k, s, p) where it has one; else a
        convolution of the same output size (the paper's ResNet seed replaces the max-pool by a
        3×3 stride-2 convolution), with fresh weights."""
        channels = value.shape[1]
        out = self.values[node].shape[2:]
        k, s, p = (square(v) for v in (kernel, stride, padding))
        name = "max_pool" if "max" in what.lower() else "avg_pool"
        if self._plain_pool(node, kernel, stride, padding) and (
            ("k", k),
            ("s", s),
            ("p", p),
        ) in self.grid.get(name, ()):
            self.terminal(node, name, k=k, s=s, p=p)
            return [Piece(arch.computation(name, k=k, s=s, p=p), ())]
        grid = self._conv_substitute(node, value, k, s, p, out)
        d = self._width(node, channels, "the pooled channels")
        described = f"{what} (kernel {k}, stride {s}, padding {p})"
        self.substituted(node, described, f"{self._conv_text(grid, d)}, with new weights")
        return self._conv_items(node, grid, d, None)

    def _plain_pool(self, node: fx.Node, *sizes: Any) -> bool:
        """Square, no dilation, no ceil mode, padding counted in the mean: as the grammar's pools."""
        if any(isinstance(v, (tuple, list)) and len(set(v)) != 1 for v in sizes):
            return False
        if node.op == "call_module":
            module = self.modules[node.target]
            options = {n: getattr(module, n, None) for n in ("dilation", "ceil_mode", "count_include_pad")}
            options["divisor_override"] = getattr(module, "divisor_override", None)
        else:
            options = dict(node.kwargs)
            if len(node.args) > 4:
                return False
        return (
            options.get("dilation") in (None, 1, (1, 1))
            and not options.get("ceil_mode")
            and options.get("count_include_pad") in (None, True)
            and options.get("divisor_override") is None
            and not options.get("return_indices")
        )

    def layer_scale(self, node: fx.Node, value: torch.Tensor) -> list[Piece | Route]:
        """x times a learnt scale per feature (channels of an image, last axis of tokens)."""
        constants = [c for c in self.constants(node) if isinstance(c, torch.Tensor)]
        shapes = per_feature_shapes(value)
        if len(constants) != 1 or tuple(constants[0].shape) not in shapes or len(self.constants(node)) != 1:
            raise self.fail(
                node,
                "a product with a constant is in the grammar only as a learnt scale per feature "
                "(layer scale)",
            )
        self.terminal(node, "layer_scale")
        weight = constants[0].detach().reshape(shapes[0]).clone()
        return [Piece(arch.computation("layer_scale"), ({"weight": weight},))]

    def affine(self, node: fx.Node) -> tuple[list[Piece | Route], fx.Node]:
        """`torch.addcmul(shift, scale, x)` (or `scale` and `x` swapped, or the method on
        `shift`): shift + scale · x, a learnt scale and shift per feature (timm's Affine), the
        grammar's affine; and x, where the chain goes on. Anything else addcmul computes is
        refused, naming what the grammar lacks."""
        given = {**dict(zip(("input", "tensor1", "tensor2"), node.args, strict=False)), **node.kwargs}
        computed = [n for n in ("input", "tensor1", "tensor2") if given.get(n) in self.dynamic]
        if given.get("value", 1) != 1:
            raise self.fail(
                node, f"addcmul with value={given['value']!r}: the grammar's affine is shift + scale · x"
            )
        if "input" in computed:
            raise self.fail(
                node,
                "addcmul adds a product to a computed tensor: the grammar's affine is "
                "torch.addcmul(shift, scale, x), a learnt shift plus x times a learnt scale",
            )
        if len(computed) != 1:
            raise self.fail(
                node,
                "addcmul of the product of two computed tensors: the grammar's affine scales x by a "
                "learnt scale",
            )
        (factor,) = computed
        source = given[factor]
        value = self.values[source]
        scale = self.values.get(given.get("tensor2" if factor == "tensor1" else "tensor1"))
        shift = self.values.get(given.get("input"))
        shapes = per_feature_shapes(value)
        if value.dim() not in (3, 4) or any(
            not isinstance(c, torch.Tensor) or tuple(c.shape) not in shapes for c in (scale, shift)
        ):
            sizes = ", ".join(
                f"{n} {tuple(getattr(c, 'shape', ()))}" for n, c in (("shift", shift), ("scale", scale))
            )
            raise self.fail(
                node,
                f"addcmul with {sizes} on x {tuple(value.shape)}: the grammar's affine has one learnt scale "
                "and shift per feature, (D,) or (1, 1, D) on tokens [B, S, D], (C, 1, 1) or (1, C, 1, 1) "
                "on an image [B, C, H, W]",
            )
        self.terminal(node, "affine")
        entry = {n: c.detach().reshape(shapes[0]).clone() for n, c in (("weight", scale), ("bias", shift))}
        return [Piece(arch.computation("affine"), (entry,))], source

    def positional(self, node: fx.Node, value: torch.Tensor) -> list[Piece | Route]:
        """x + a learnt tensor of x's shape (or with a leading 1): a positional encoding."""
        constants = [c for c in self.constants(node) if isinstance(c, torch.Tensor)]
        if not unscaled(node):
            raise self.fail(node, "a sum that scales its second term (alpha) is not in the grammar")
        if len(constants) != 1 or constants[0].shape not in (value.shape[1:], (1, *value.shape[1:])):
            raise self.fail(
                node, "adding a constant is in the grammar only as a learnt positional encoding of x's shape"
            )
        self.terminal(node, "pos_enc")
        weight = constants[0].detach().reshape(1, *value.shape[1:]).clone()
        return [Piece(arch.pos_enc(), ({"weight": weight},))]

    # ------------------------------------------------------------- layers with weights

    def conv(self, node: fx.Node, module: nn.Conv2d, value: torch.Tensor) -> list[Piece | Route]:
        self.use(node)
        k, s, p = module.kernel_size, module.stride, conv_padding(module)
        out = self.values[node].shape[2:]
        exact = module.groups == 1 and exact_but_groups(module)
        if exact_but_groups(module) and module.groups > 1 and module.in_channels == module.out_channels:
            name, args = "grouped_conv", {"g": module.groups, "k": k[0], "s": s[0], "p": p[0]}
            if module.groups == module.in_channels:
                name, args = "depthwise_conv", {"k": k[0], "s": s[0], "p": p[0]}
            if arch.op(name, **args).args in self.grid.get(name, ()):
                return [Piece(arch.computation(name, **args), (linear_entry(module.weight, module.bias),))]
        if exact and (("k", k[0]), ("s", s[0]), ("p", p[0])) in self.grid.get("im2col", ()):
            d = self._width(node, module.out_channels, "the output channels")
            weight = module.weight.reshape(module.out_channels, -1)
            entry = linear_entry(weight, module.bias) if d == module.out_channels else None
            return self._conv_items(node, (k[0], s[0], p[0]), d, entry)
        grid = self._conv_substitute(node, value, k[0], s[0], p[0] if isinstance(p, tuple) else 0, out)
        d = self._width(node, module.out_channels, "the output channels")
        shape = f"a {k[0]}x{k[1]} stride-{s[0]} convolution, padding {p}"
        if module.groups != 1 or module.dilation != (1, 1) or module.padding_mode != "zeros":
            shape += f", groups {module.groups}, dilation {module.dilation}, {module.padding_mode} padding"
        self.substituted(node, shape, f"{self._conv_text(grid, d)}, with new weights")
        return self._conv_items(node, grid, d, None)

    def _conv_items(
        self, node: fx.Node, grid: tuple[int, int, int], d: int, entry: Entry
    ) -> list[Piece | Route]:
        k, s, p = grid
        opened, closed = self.terminal(node, "im2col", k=k, s=s, p=p), self.terminal(node, "col2im")
        return [Route(opened, node), Piece(arch.linear(d), (entry,)), Route(closed, node)]

    def _conv_substitute(
        self, node: fx.Node, value: torch.Tensor, k: int, s: int, p: int, out: tuple[int, ...]
    ) -> tuple[int, int, int]:
        """The im2col (k, s, p) of the grid with the same output size, nearest in stride then kernel."""
        height, width = value.shape[2:]
        same = []
        for args in self.grid.get("im2col", ()):
            kk, ss, pp = (dict(args)[a] for a in ("k", "s", "p"))
            size = ((height + 2 * pp - kk) // ss + 1, (width + 2 * pp - kk) // ss + 1)
            if size == tuple(out) and min(height, width) + 2 * pp >= kk:
                same.append((abs(ss - s), abs(kk - k), abs(pp - p), (kk, ss, pp)))
        if not same:
            raise self.fail(
                node, f"no convolution of the grammar's grid turns {height}x{width} into {tuple(out)}"
            )
        return min(same)[-1]

    def _conv_text(self, grid: tuple[int, int, int], d: int) -> str:
        k, s, p = grid
        return (
            f"a {k}x{k} stride-{s} convolution to {d} channels "
            f"(im2col(k={k}, s={s}, p={p}) · linear(d={d}) · col2im)"
        )

    def _width(self, node: fx.Node, d: int, what: str) -> int:
        """d, or the grid's nearest width (substituted)."""
        widths = sorted(dict(a)["d"] for a in self.grid.get("linear", ()))
        if not widths:
            raise self.fail(node, f"the grammar {self.grammar.path} has no linear layer")
        if d in widths:
            return d
        nearest = min(widths, key=lambda w: (abs(math.log2(w / d)), w))
        self.substituted(
            node, f"width {d} ({what})", f"width {nearest}, the grid's nearest (linear(d={nearest}))"
        )
        return nearest

    def linear(self, node: fx.Node, module: nn.Linear, value: torch.Tensor) -> list[Piece | Route]:
        self.use(node)
        if value.dim() != 3:
            raise self.fail(
                node,
                "nn.Linear on a tensor of rank "
                f"{value.dim()}: the grammar's linear acts on tokens [B, S, D] (on an image's channels "
                "it is a 1x1 convolution)",
            )
        d = self._width(node, module.out_features, "the output features")
        entry = linear_entry(module.weight, module.bias) if d == module.out_features else None
        return [Piece(arch.linear(d), (entry,))]

    def batch_norm(self, node: fx.Node, module: nn.BatchNorm2d, value: torch.Tensor) -> list[Piece | Route]:
        self.use(node)
        if not (module.affine and module.track_running_stats):
            raise self.fail(
                node, "the grammar's norm is a BatchNorm2d with affine parameters and running statistics"
            )
        if module.eps != 1e-5 or module.momentum != 0.1:
            self.substituted(
                node, f"{module}", "norm (BatchNorm2d with eps 1e-5, momentum 0.1), same weights"
            )
        self.terminal(node, "norm")
        return [Piece(arch.norm(), (dict(module.state_dict()),))]

    def layer_norm(self, node: fx.Node, module: nn.LayerNorm, value: torch.Tensor) -> list[Piece | Route]:
        self.use(node)
        if value.dim() == 4 and "channel_norm" in self.grid:
            return self.channel_norm(
                node, module.normalized_shape, module.weight, module.bias, module.eps, value
            )
        if value.dim() != 3 or module.normalized_shape != (value.shape[-1],) or not module.elementwise_affine:
            raise self.fail(
                node, "the grammar's norm in col mode is a LayerNorm over the last axis of [B, S, D]"
            )
        if module.eps != 1e-5 or module.bias is None:
            # spelt out: the repr of torch 2.11 (not 2.13) leaves bias=False out
            what = f"LayerNorm({module.normalized_shape}, eps={module.eps}, bias={module.bias is not None})"
            self.substituted(node, what, "norm (LayerNorm with eps 1e-5 and a bias)")
        self.terminal(node, "norm")
        entry = linear_entry(module.weight, module.bias)
        return [Piece(arch.norm(), (entry,))]

    def channel_norm(
        self,
        node: fx.Node,
        shape: Any,
        weight: torch.Tensor | None,
        bias: torch.Tensor | None,
        eps: float,
        value: torch.Tensor,
    ) -> list[Piece | Route]:
        """A layer norm over the last axis of a channels-last image [B, H, W, C]: the grammar's
        channel_norm, once the permutes around it are found (`pieces.cancel`)."""
        if tuple(shape) != (value.shape[-1],) or weight is None or bias is None:
            raise self.fail(node, "the grammar's channel_norm is a LayerNorm with weights over the channels")
        if eps != 1e-6:
            self.substituted(node, f"a layer norm over channels with eps {eps}", "channel_norm (eps 1e-6)")
        self.terminal(node, "channel_norm")
        piece = Piece(arch.computation("channel_norm"), (linear_entry(weight, bias),), channels_last=node)
        return [piece]


MODULE_HANDLERS: tuple[tuple[type | tuple[type, ...], Callable[..., list[Piece | Route]]], ...] = (
    (nn.Conv2d, LayerRules.conv),
    (nn.Linear, LayerRules.linear),
    (nn.BatchNorm2d, LayerRules.batch_norm),
    (nn.LayerNorm, LayerRules.layer_norm),
    (nn.LeakyReLU, lambda self, node, module, value: self.activation(node, module.negative_slope)),
    (
        _ACTIVATION_MODULES,
        lambda self, node, module, value: self.activation(
            node,
            None,
            None if getattr(module, "approximate", "none") != "none" else _ZOO_ACTIVATIONS.get(type(module)),
        ),
    ),
    (nn.Softmax, lambda self, node, module, value: self.softmax(node, module.dim, value)),
    (nn.Dropout, lambda self, node, module, value: self.dropout(node, module.p)),
    (
        _POOL_MODULES,
        lambda self, node, module, value: self.pool(
            node, type(module).__name__, value, module.kernel_size, module.stride, module.padding
        ),
    ),
)


def activation_name(node: fx.Node, modules: dict[str, nn.Module]) -> str | None:
    """The zoo grammar's name of an activation node (module, function or method), else None."""
    if node.op == "call_module":
        return _ZOO_ACTIVATIONS.get(type(modules[node.target]))
    return _ZOO_FUNCTIONS.get(node.target)  # a function, or a method's name ("relu")


def conv_padding(module: nn.Conv2d) -> tuple[int, ...] | str:
    """A convolution's padding as numbers: "valid" is none, "same" (stride 1) is (k - 1) / 2 on
    each side where that is whole (odd kernels, no dilation); any other the name as given (torch
    pads "same" unevenly there, which no grammar's convolution does)."""
    p = module.padding
    if p == "valid":
        return (0,) * len(module.kernel_size)
    k = module.kernel_size
    if p == "same" and all(d == 1 and n % 2 for n, d in zip(k, module.dilation, strict=True)):
        return tuple(n // 2 for n in k)
    return p


def exact_but_groups(module: nn.Conv2d) -> bool:
    """Square kernel, stride and padding, no dilation, zero padding: the grammar's convolutions
    up to their groups."""
    k, s, p = module.kernel_size, module.stride, conv_padding(module)
    plain = module.dilation == (1, 1) and module.padding_mode == "zeros"
    return plain and k[0] == k[1] and s[0] == s[1] and isinstance(p, tuple) and p[0] == p[1]


def is_addcmul(node: fx.Node) -> bool:
    """`torch.addcmul(...)` or the method `t.addcmul(...)`: the grammar's affine, if anything."""
    return node.target is torch.addcmul or (node.op == "call_method" and node.target == "addcmul")


def per_feature_shapes(value: torch.Tensor) -> list[tuple[int, ...]]:
    """The shapes of a learnt tensor with one entry per feature of `value` (the module's own first):
    an image's channels, or the last axis of tokens."""
    if value.dim() == 4:
        return [(value.shape[1], 1, 1), (1, value.shape[1], 1, 1)]
    return [(value.shape[-1],), (1, 1, value.shape[-1])]


def square(value: Any) -> int:
    return int(value[0]) if isinstance(value, (tuple, list)) else int(value)


def unscaled(node: fx.Node) -> bool:
    """A sum without a scale (`alpha`) on its second term."""
    return not any(isinstance(a, (int, float)) and a != 1 for a in node.kwargs.values())

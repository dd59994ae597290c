"""Writing a compiled network's modules as layers and forward lines of the exported file: one handler
per module type, branching modules and attention as classes of their own."""

from __future__ import annotations

import re
from collections.abc import Callable

import torch
from torch import nn

from einspace.errors import EinspaceError
from einspace.network.compiler import HEAD_POOLINGS, Branches, ClassificationHead, Network
from einspace.network.export.parts import DEPTHWISE, DYNAMIC, XD, Helper, Instance, generator_layer
from einspace.network.lowering import Attention, AttentionHead, BranchLinear, Conv, Folded
from einspace.ops import _modules, _zoo_modules
from einspace.ops._nos_modules import Calibration
from einspace.ops._xd_modules import XDConv

__all__ = ["Writer"]

_CONV2D = "nn.Conv2d({}, {}, {}, {}, {})"
_COUNTS = {2: "Two", 4: "Four", 8: "Eight"}
_CONV_ROLES = ("in_channels", "out_channels", "kernel_size", "stride", "padding")


def _conv_slots(c: int, d: int, k: int = 1, s: int = 1, p: int = 0) -> tuple[tuple[str, int], ...]:
    return tuple(zip(_CONV_ROLES, (c, d, k, s, p), strict=True))


def _linear_slots(n_in: int, n_out: int) -> tuple[tuple[str, int], ...]:
    return (("in_features", n_in), ("out_features", n_out))


class Writer:
    """Turns modules into layers and forward lines; each handler returns the variable holding
    the result (the input's own when nothing is computed)."""

    def __init__(self) -> None:
        self.helpers: set[Helper] = set()

    def network(self, name: str, doc: str, network: Network) -> Instance:
        root = Instance(name, doc)
        x = self.emit(root, network.backbone, "x", "x")
        head = network.head
        if not isinstance(head, ClassificationHead):
            raise EinspaceError(f"export writes the paper's classification head, not {type(head).__name__}")
        slots = (("in_features", head.linear.in_features), ("classes", head.linear.out_features))
        layer = root.add("head", "nn.Linear({}, {})", slots, head.linear.state_dict(), numbered=False)
        axes = "(2, 3)" if head.pooled == (2, 3) else "1"
        pool = f"{HEAD_POOLINGS[head.pooling].__name__}({axes})"  # torch.mean -> x.mean(...)
        root.line(f"return {layer}({x}.{pool})")
        return root

    def emit(self, scope: Instance, module: nn.Module, x: str, out: str) -> str:
        if isinstance(module, nn.Sequential):
            return self.sequence(scope, list(module), x, out)
        handler = _HANDLERS.get(type(module))
        if handler is None:
            raise EinspaceError(
                f"export cannot write a {type(module).__name__} module as plain PyTorch (an operation "
                "that declares `exportable = True` must build modules export knows)"
            )
        return handler(self, scope, module, x, out)

    def sequence(self, scope: Instance, modules: list[nn.Module], x: str, out: str) -> str:
        i = 0
        while i < len(modules):
            module = modules[i]
            if isinstance(module, (_modules.Clone, _modules.GroupDim)):
                if i + 2 >= len(modules) or not isinstance(modules[i + 1], Branches):
                    raise EinspaceError(
                        f"export needs a {type(module).__name__} followed by branches and an aggregation"
                    )
                x = self.branching(scope, module, modules[i + 1], modules[i + 2], x, out)
                i += 3
            else:
                x = self.emit(scope, module, x, out)
                i += 1
        return x

    def branching(
        self, scope: Instance, split: nn.Module, branches: Branches, merge: nn.Module, x: str, out: str
    ) -> str:
        """A class of its own: split x, each branch into a local variable, then the aggregation."""
        b = len(branches)
        block = Instance("", "")
        if isinstance(split, _modules.GroupDim):
            starts = [f"x{i + 1}" for i in range(b)]
            block.line(f"{', '.join(starts)} = x.chunk({b}, dim={split.dim})")
        else:
            starts = ["x"] * b
        ends = [
            self.emit(block, branch, start, f"x{i + 1}")
            for i, (branch, start) in enumerate(zip(branches, starts, strict=True))
        ]
        passing = "x" in ends  # a branch that leaves x as it is: a shortcut
        if isinstance(merge, _modules.Add):
            # x first: a sum takes its first operand's layout, and a branch may end transposed
            # (the Mixer's token MLP); x + y and y + x are the same floats.
            order = ends[::-1] if b == 2 and ends[1] == "x" else ends
            kind, joined, how = ("Residual" if b == 2 else "Sum"), " + ".join(order), "added"
        elif isinstance(merge, _modules.Concat):
            kind, how = ("Dense" if passing else "Concat"), f"concatenated along dim {merge.dim}"
            joined = f"torch.cat([{', '.join(ends)}], dim={merge.dim})"
        elif isinstance(merge, _modules.MatMul):
            kind, how = "Product", "multiplied as matrices"
            scale = "" if merge.scale is None else f" * {merge.scale!r}"
            joined = f"{ends[0]} @ {ends[1]}" if not scale else f"({ends[0]} @ {ends[1]}){scale}"
        elif isinstance(merge, Calibration):
            kind, how = "Calibrated", "the first calibrated by the second"
            joined = self.calibration(block, merge, ends[0], ends[1])
        else:
            raise EinspaceError(f"export cannot write the aggregation {type(merge).__name__}")
        if isinstance(split, _modules.GroupDim):
            kind, source = "Grouped" + kind, f"x split into {b} parts along dim {split.dim}, a branch each"
        else:
            source = f"{_COUNTS.get(b, b)} branches of x" + (", one of them x itself" if passing else "")
        block.kind, block.doc = kind, f"{source}, {how}."
        block.line(f"return {joined}")
        call = scope.add(_snake(kind), child=block)
        scope.line(f"{out} = {call}({x})")
        return out

    def calibration(self, scope: Instance, module: Calibration, f: str, g: str) -> str:
        helper, slots = generator_layer(module.generator)
        self.helpers.add(helper)
        template = f"{helper.name}({', '.join('{}' for _ in slots)})"
        layer = scope.add(_snake(helper.name), template, slots, module.generator.state_dict())
        if helper is DYNAMIC:
            self.helpers.add(DEPTHWISE)
            return f"{f} + depthwise({f}, {layer}({g}))"
        return f"{f} + {f} * {layer}({g})"

    def attention(self, scope: Instance, module: Attention, x: str, out: str) -> str:
        heads = module.heads
        block = Instance("Attention", "")
        if heads[0].linears is None:
            self.one_head(block, heads[0])
        else:
            self.fused_heads(block, module)
        call = scope.add("attention", child=block)
        scope.line(f"{out} = {call}({x})")
        return out

    def one_head(self, block: Instance, head: AttentionHead) -> None:
        """Attention whose projections are not plain linears: each branch written out."""
        s = self.sequence(block, list(head.pre), "x", "s")
        q = self.emit(block, head.query, s, "q")
        k = self.emit(block, head.key, s, "k")
        v = self.emit(block, head.value, "x", "v")
        block.doc = "Self-attention softmax(q k^T * scale) v, with q, k, v computed by the branches below."
        block.line(
            f"x = F.scaled_dot_product_attention({q}, {k}.transpose(-2, -1), {v}, scale={head.scale!r})"
        )
        block.line("return x" if head.outer is None else f"return x * {head.outer!r}")

    def fused_heads(self, block: Instance, module: Attention) -> None:
        """Heads with plain projections: one qkv linear, then attention with a head axis."""
        heads = module.heads
        h = len(heads)
        parts = [[head.linears[i] for head in heads] for i in range(3)]
        e, e_v = parts[0][0].out_features, parts[2][0].out_features
        width = parts[0][0].in_features
        state = {
            "weight": torch.cat([m.weight for group in parts for m in group]),
            "bias": torch.cat([m.bias for group in parts for m in group]),
        }
        qkv = block.add(
            "qkv", "nn.Linear({}, {})", _linear_slots(width, h * (2 * e + e_v)), state, numbered=False
        )
        block.line(f"q, k, v = {qkv}(x).split([{h * e}, {h * e}, {h * e_v}], dim=-1)")
        if module.combine is not None:
            block.line(f"q, k, v = (t.unflatten(-1, ({h}, -1)).transpose(1, 2) for t in (q, k, v))")
        first = heads[0]
        scale = "" if first.scale == 1 / e**0.5 else f", scale={first.scale!r}"
        block.line(f"x = F.scaled_dot_product_attention(q, k, v{scale})")
        if first.outer is not None:
            block.line(f"x = x * {first.outer!r}")
        joined = {
            None: "x",
            "add": "x.sum(1)",
            "sequence": "x.flatten(1, 2)",
            "features": "x.transpose(1, 2).flatten(2)",
        }
        block.line(f"return {joined[module.combine]}")
        what = {
            None: "",
            "add": ", added",
            "sequence": ", joined along the tokens",
            "features": ", concatenated",
        }
        block.kind = "MultiHeadAttention" if module.combine is not None else "Attention"
        block.doc = (
            f"Self-attention, {h} head{'s' * (h > 1)} of {e}{what[module.combine]}: one qkv projection."
        )


def _passing(writer: Writer, scope: Instance, module: nn.Module, x: str, out: str) -> str:
    return x


def _conv(writer: Writer, scope: Instance, module: Conv, x: str, out: str) -> str:
    d, features = module.weight.shape
    c, k = features // module.k**2, module.k
    state = {"weight": module.weight.reshape(d, c, k, k), "bias": module.bias}
    conv = scope.add("conv", _CONV2D, _conv_slots(c, d, k, module.s, module.p), state)
    tokens = "" if module.fold else ".flatten(2).transpose(1, 2)"
    scope.line(f"{out} = {conv}({x}){tokens}")
    return out


def _linear(writer: Writer, scope: Instance, module: nn.Linear, x: str, out: str) -> str:
    layer = scope.add(
        "linear",
        "nn.Linear({}, {})",
        _linear_slots(module.in_features, module.out_features),
        module.state_dict(),
    )
    scope.line(f"{out} = {layer}({x})")
    return out


def _channel_linear(writer: Writer, scope: Instance, module: nn.Linear, x: str, out: str) -> str:
    state = {"weight": module.weight[:, :, None, None], "bias": module.bias}
    conv = scope.add("conv", _CONV2D, _conv_slots(module.in_features, module.out_features), state)
    scope.line(f"{out} = {conv}({x})")
    return out


def _branch_linear(writer: Writer, scope: Instance, module: BranchLinear, x: str, out: str) -> str:
    """Lowering's one matrix product for b linear branches, written as the b layers the tree has
    (a ModuleList when they have one width), summed or concatenated: so that the file imports
    back to the same tree (one layer of the summed width would import as one linear)."""
    linears = module.linears
    n_in, b = linears[0].in_features, len(linears)
    weights = [m.weight[:, :, None, None] if module.image else m.weight for m in linears]
    each = "nn.Conv2d({}, {}, 1)" if module.image else "nn.Linear({}, {})"
    stem = "conv" if module.image else "linear"
    dim = {"add": 0, "sequence": 1, "features": 1 if module.image else 2}[module.combine]
    if len({m.out_features for m in linears}) > 1:  # concatenated along the features
        layers = []
        for weight, m in zip(weights, linears, strict=True):
            slots = _conv_slots(n_in, m.out_features) if module.image else _linear_slots(n_in, m.out_features)
            template = _CONV2D if module.image else "nn.Linear({}, {})"
            layers.append(scope.add(stem, template, slots, {"weight": weight, "bias": m.bias}))
        scope.line(f"{out} = torch.cat([{', '.join(f'{layer}({x})' for layer in layers)}], dim={dim})")
        return out
    state = {}
    for i, (weight, m) in enumerate(zip(weights, linears, strict=True)):
        state[f"{i}.weight"], state[f"{i}.bias"] = weight, m.bias
    d = linears[0].out_features
    slots = (*(_conv_slots(n_in, d)[:2] if module.image else _linear_slots(n_in, d)), ("branches", b))
    layers = scope.add(f"{stem}s", f"nn.ModuleList({each} for _ in range({{}}))", slots, state)
    each_out = f"layer({x}) for layer in {layers}"
    # a sum as one expression: the importer tells it from a sum around it (x1 + x2 + ...)
    joined = (
        f"torch.stack([{each_out}]).sum(0)"
        if module.combine == "add"
        else f"torch.cat([{each_out}], dim={dim})"
    )
    scope.line(f"{out} = {joined}")
    return out


def _norm(writer: Writer, scope: Instance, module: nn.Module, x: str, out: str) -> str:
    if isinstance(module, nn.BatchNorm2d):
        layer = scope.add(
            "norm", "nn.BatchNorm2d({})", (("channels", module.num_features),), module.state_dict()
        )
    else:
        (features,) = module.normalized_shape
        layer = scope.add("norm", "nn.LayerNorm({})", (("features", features),), module.state_dict())
    scope.line(f"{out} = {layer}({x})")
    return out


def _leaky_relu(writer: Writer, scope: Instance, module: nn.LeakyReLU, x: str, out: str) -> str:
    scope.line(f"{out} = F.leaky_relu({x}, {module.negative_slope!r})")
    return out


def _softmax(writer: Writer, scope: Instance, module: nn.Softmax, x: str, out: str) -> str:
    scope.line(f"{out} = {x}.softmax(dim={-1 if module.dim is None else module.dim})")
    return out


def _positional(
    writer: Writer, scope: Instance, module: _modules.PositionalEncoding, x: str, out: str
) -> str:
    shape = tuple(module.weight.shape[1:])
    roles = ("tokens", "features") if len(shape) == 2 else ("channels", "height", "width")
    template = f"nn.Parameter(torch.randn(1, {', '.join('{}' for _ in shape)}) * 0.02)"
    position = scope.add("position", template, tuple(zip(roles, shape, strict=True)), {"": module.weight})
    scope.line(f"{out} = {x} + {position}")
    return out


def _im2col(writer: Writer, scope: Instance, module: _modules.Im2Col, x: str, out: str) -> str:
    scope.line(f"{out} = F.unfold({x}, {module.k}, padding={module.p}, stride={module.s}).transpose(1, 2)")
    return out


def _col2im(writer: Writer, scope: Instance, module: _modules.Col2Im, x: str, out: str) -> str:
    scope.line(f"{out} = {x}.transpose(1, 2).unflatten(2, ({module.h}, {module.w}))")
    return out


def _permute(writer: Writer, scope: Instance, module: _modules.Permute, x: str, out: str) -> str:
    order = [0, *module.order]  # tensor axes, batch first
    moved = [i for i, axis in enumerate(order) if axis != i]
    if len(moved) == 2:
        scope.line(f"{out} = {x}.transpose({moved[0]}, {moved[1]})")
    else:
        scope.line(f"{out} = {x}.permute({', '.join(map(str, order))})")
    return out


def _xd(writer: Writer, scope: Instance, module: XDConv, x: str, out: str) -> str:
    writer.helpers.add(XD)
    roles = ("length",) if len(module.input_size) == 1 else ("height", "width")
    slots = (
        *_conv_slots(
            module.in_channels, module.out_channels, module.kernel_size, module.stride, module.padding
        ),
        *zip(roles, module.input_size, strict=True),
    )
    last = ", channels_last=True" if module.channels_last else ""
    template = f"XD({', '.join('{}' for _ in slots)}{last})"
    layer = scope.add("xd", template, slots, module.state_dict())
    scope.line(f"{out} = {layer}({x})")
    return out


#: Activations of the zoo grammar, as the functional call each is written as.
_ACTIVATIONS = {
    _zoo_modules.ReLU: "F.relu({})",
    _zoo_modules.ReLU6: "F.relu6({})",
    _zoo_modules.GELU: "F.gelu({})",
    _zoo_modules.SiLU: "F.silu({})",
    _zoo_modules.Hardswish: "F.hardswish({})",
}


def _activation(writer: Writer, scope: Instance, module: nn.Module, x: str, out: str) -> str:
    scope.line(f"{out} = {_ACTIVATIONS[type(module)].format(x)}")
    return out


def _dropout(writer: Writer, scope: Instance, module: nn.Dropout, x: str, out: str) -> str:
    scope.line(f"{out} = F.dropout({x}, {module.p!r}, self.training)")
    return out


def _pool(writer: Writer, scope: Instance, module: nn.Module, x: str, out: str) -> str:
    kind = "max_pool2d" if isinstance(module, nn.MaxPool2d) else "avg_pool2d"
    scope.line(f"{out} = F.{kind}({x}, {module.kernel_size}, {module.stride}, {module.padding})")
    return out


def _depthwise(writer: Writer, scope: Instance, module: nn.Conv2d, x: str, out: str) -> str:
    c, (k,), (s,), (p,) = module.in_channels, module.kernel_size[:1], module.stride[:1], module.padding[:1]
    slots = (("channels", c), ("kernel_size", k), ("stride", s), ("padding", p))
    template = "nn.Conv2d({0}, {0}, {1}, {2}, {3}, groups={0})"
    conv = scope.add("depthwise", template, slots, module.state_dict())
    scope.line(f"{out} = {conv}({x})")
    return out


def _grouped(writer: Writer, scope: Instance, module: nn.Conv2d, x: str, out: str) -> str:
    (k,), (s,), (p,) = module.kernel_size[:1], module.stride[:1], module.padding[:1]
    slots = (("channels", module.in_channels), ("groups", module.groups), ("kernel_size", k))
    slots += (("stride", s), ("padding", p))
    template = "nn.Conv2d({0}, {0}, {2}, {3}, {4}, groups={1})"
    conv = scope.add("grouped", template, slots, module.state_dict())
    scope.line(f"{out} = {conv}({x})")
    return out


def _squeeze_excite(
    writer: Writer, scope: Instance, module: _zoo_modules.SqueezeExcite, x: str, out: str
) -> str:
    slots = (("channels", module.fc1.in_channels), ("squeezed", module.fc1.out_channels))
    fc1 = scope.add("squeeze", "nn.Conv2d({0}, {1}, 1)", slots, module.fc1.state_dict())
    fc2 = scope.add("excite", "nn.Conv2d({1}, {0}, 1)", slots, module.fc2.state_dict())
    gate = f"{fc2}(F.{module.act}({fc1}({x}.mean((2, 3), keepdim=True))))"
    scope.line(f"{out} = {x} * torch.sigmoid({gate})")
    return out


def _layer_scale(writer: Writer, scope: Instance, module: _zoo_modules.LayerScale, x: str, out: str) -> str:
    shape = tuple(module.weight.shape)
    template = (
        "nn.Parameter(torch.full(({}, 1, 1), 0.1))"
        if len(shape) == 3
        else "nn.Parameter(torch.full(({},), 0.1))"
    )
    scale = scope.add("scale", template, (("features", shape[0]),), {"": module.weight})
    scope.line(f"{out} = {x} * {scale}")
    return out


def _affine(writer: Writer, scope: Instance, module: _zoo_modules.Affine, x: str, out: str) -> str:
    shape = tuple(module.weight.shape)
    size = "({}, 1, 1)" if len(shape) == 3 else "({},)"
    slots = (("features", shape[0]),)
    scale = scope.add("scale", f"nn.Parameter(torch.ones({size}))", slots, {"": module.weight})
    shift = scope.add("shift", f"nn.Parameter(torch.zeros({size}))", slots, {"": module.bias})
    scope.line(f"{out} = torch.addcmul({shift}, {scale}, {x})")
    return out


def _channel_norm(writer: Writer, scope: Instance, module: _zoo_modules.ChannelNorm, x: str, out: str) -> str:
    slots = (("channels", module.normalized_shape[0]),)
    layer = scope.add("norm", "nn.LayerNorm({}, eps=1e-06)", slots, module.state_dict())
    scope.line(f"{out} = {layer}({x}.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)")
    return out


def _class_token(writer: Writer, scope: Instance, module: _zoo_modules.ClassToken, x: str, out: str) -> str:
    slots = (("width", module.token.shape[-1]),)
    token = scope.add("cls_token", "nn.Parameter(torch.zeros(1, 1, {}))", slots, {"": module.token})
    scope.line(f"{out} = torch.cat([{token}.expand({x}.shape[0], -1, -1), {x}], dim=1)")
    return out


def _first_token(writer: Writer, scope: Instance, module: _zoo_modules.FirstToken, x: str, out: str) -> str:
    scope.line(f"{out} = {x}[:, :1]")
    return out


def _unary_calibration(writer: Writer, scope: Instance, module: Calibration, x: str, out: str) -> str:
    scope.line(f"{out} = {writer.calibration(scope, module, x, x)}")
    return out


_Handler = Callable[[Writer, Instance, nn.Module, str, str], str]

#: Module type (exactly; ChannelLinear is an nn.Linear) -> how it is written.
_HANDLERS: dict[type, _Handler] = {
    Folded: _passing,
    nn.Identity: _passing,
    Conv: _conv,
    BranchLinear: _branch_linear,
    Attention: Writer.attention,
    nn.Linear: _linear,
    _modules.ChannelLinear: _channel_linear,
    nn.BatchNorm2d: _norm,
    nn.LayerNorm: _norm,
    nn.LeakyReLU: _leaky_relu,
    nn.Softmax: _softmax,
    _modules.PositionalEncoding: _positional,
    _modules.Im2Col: _im2col,
    _modules.Col2Im: _col2im,
    _modules.Permute: _permute,
    Calibration: _unary_calibration,
    XDConv: _xd,
    **dict.fromkeys(_ACTIVATIONS, _activation),
    _zoo_modules.Dropout: _dropout,
    _zoo_modules.MaxPool2d: _pool,
    _zoo_modules.AvgPool2d: _pool,
    _zoo_modules.DepthwiseConv: _depthwise,
    _zoo_modules.GroupedConv: _grouped,
    _zoo_modules.SqueezeExcite: _squeeze_excite,
    _zoo_modules.LayerScale: _layer_scale,
    _zoo_modules.Affine: _affine,
    _zoo_modules.ChannelNorm: _channel_norm,
    _zoo_modules.ClassToken: _class_token,
    _zoo_modules.FirstToken: _first_token,
}


def _snake(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()

"""Export: a compiled network as one readable PyTorch file that needs torch only, and its weights.

Why from the compiled, lowered network rather than from the tree: lowering has already found
what a person would write as one layer (im2col·linear·col2im is `nn.Conv2d`, the attention
branches are `F.scaled_dot_product_attention`, linear branches joined by a concatenation are one
`nn.Linear`), and the modules carry every size a constructor needs. Whatever lowering did not
recognise is written literally (`F.unfold`, `permute`, `@`).

The file reads like hand-written code: every branching module (clone or split → branches →
aggregation) and every attention is a small class whose `forward` keeps the branches as local
variables joined by their aggregation; uses of one structure share one class, whose constructor
takes the sizes that differ between the uses (a ResNet's blocks become one class per block shape,
`Residual(channels)` and `Residual2(in_channels, out_channels)`). The head is the paper's: the
mean over the spatial axes (or the tokens), then `nn.Linear`.

Exported tensors are the compiled network's own, reshaped where a layer stores them differently
(a conv weight [d, C·k·k] as [d, C, k, k]), so the exported module computes what the compiled one
does with the same weights. NOS calibrations are written as small helper classes; DNArch and XD
terminals (masks and butterflies learnt while training) and plugin operations are refused with
the operation named.
"""

from __future__ import annotations

import keyword
import re
import warnings
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import torch
from einops.layers.torch import Rearrange
from torch import nn

from einspace.checker import CheckedTree, check_tree
from einspace.compiler import Branches, ClassificationHead, Network, compile_network
from einspace.errors import EinspaceError
from einspace.grammar.model import Grammar
from einspace.lowering import Attention, AttentionHead, BranchLinear, Conv, Folded
from einspace.ops import _modules
from einspace.ops.nos import Calibration, ChannelAttention, DynamicKernel, SpatialAttention
from einspace.ops.registry import get_op
from einspace.outputs import write_output
from einspace.state import FeatureState, Signal
from einspace.tree import Node, Terminal, content_hash, describe_path, walk

__all__ = [
    "Export",
    "check_exportable",
    "class_name",
    "export_networks",
    "export_tree",
    "load_weights",
    "save_weights",
]

#: Why the operations of a module of einspace.ops are not exported; modules not named here are.
_REFUSED = {
    "einspace.ops.dnarch": "DNArch terminals learn their size through masks while training (mask "
    "parameters, a clamp after every step, a network loss), which plain PyTorch layers do not express",
    "einspace.ops.xd": "XD-operations learn their Fourier basis (butterfly K-matrices) while training, "
    "which plain PyTorch layers do not express",
}
_EXPORTED = ("einspace.ops.core", "einspace.ops.nos")


@dataclass(frozen=True)
class Export:
    """A Python source file and, per network class in it, the `state_dict` that loads into it."""

    source: str
    state_dicts: dict[str, dict[str, torch.Tensor]]


def check_exportable(tree: CheckedTree) -> None:
    """Raise EinspaceError naming the first operation that has no plain-PyTorch form here."""
    for path, node in walk(tree.tree):
        if not isinstance(node, Terminal):
            continue
        module = type(get_op(node.op)).__module__
        if module in _EXPORTED:
            continue
        reason = _REFUSED.get(
            module, "only einspace's own operations are exported, and it comes from a plugin"
        )
        where = describe_path(tree.tree, path)
        raise EinspaceError(f"export of {node.op} is not supported: {reason} (node {where})")


def export_tree(
    tree: Node | CheckedTree,
    input: FeatureState | Signal | None = None,
    classes: int = 10,
    grammar: Grammar | None = None,
    *,
    name: str = "Network",
    network: Network | None = None,
) -> Export:
    """The file for a tree's network (`compile_network(tree, input, classes)`, or `network` when
    given, e.g. a trained one), its class called `name`."""
    checked = tree if isinstance(tree, CheckedTree) else check_tree(tree, grammar, _need(input))
    check_exportable(checked)
    if network is None:
        network = compile_network(checked, classes=classes)
    what = f"input [B, {', '.join(map(str, checked.input[0].shape))}] ({checked.input[0].mode} mode)"
    doc = f"{name}: {what}, {network.head.linear.out_features} classes; tree {content_hash(checked.tree)}."
    return export_networks({name: network}, {name: doc})


def export_networks(networks: Mapping[str, Network], docs: Mapping[str, str] | None = None) -> Export:
    """One file holding a class per network (named by the keys), sharing the classes of the
    structures they have in common; `docs` are the classes' docstrings."""
    writer = _Writer()
    roots = []
    reserved = {"torch", "nn", "F"} | {h.name for h in _HELPERS}
    for name, network in networks.items():
        if not name.isidentifier() or keyword.iskeyword(name) or name in reserved:
            raise EinspaceError(
                f"{name!r} cannot name the exported class (a Python keyword or name the file uses)"
            )
        doc = (docs or {}).get(name) or f"{name}: exported by einspace."
        roots.append(writer.network(name, doc, network))
    classes = _classes(roots, set(networks) | reserved)
    body = "\n\n\n".join([*(h.source for h in _HELPERS if h in writer.helpers), *map(_render, classes)])
    imports = ["import torch"]
    if re.search(r"\bF\.", body):
        imports.append("import torch.nn.functional as F")
    header = (
        '"""Exported by einspace (`einspace export`): plain PyTorch, einspace is not needed.\n\n'
        "Weights written beside it load with\n"
        '    model.load_state_dict(torch.load("weights.pt", weights_only=True))\n"""'
    )
    source = "\n".join([header, "", *imports, "from torch import nn", "", "", body, ""])
    return Export(source, {name: _state(root) for name, root in zip(networks, roots, strict=True)})


def save_weights(state_dict: Mapping[str, torch.Tensor], path: str | Path) -> None:
    """Write a state_dict in torch's format, tensors only: `torch.load(path, weights_only=True)`."""
    tensors = {k: v.detach().cpu().contiguous() for k, v in state_dict.items()}
    write_output(path, lambda target: torch.save(tensors, target))


def load_weights(module: nn.Module, path: str | Path) -> None:
    """Load a state_dict file (tensors only, never pickled objects) into `module`; a file that is
    not one, or does not fit, is an EinspaceError naming it."""
    try:
        with warnings.catch_warnings():  # torch warns about pickle protocols: not the user's concern
            warnings.simplefilter("ignore")
            state = torch.load(Path(path), weights_only=True, map_location="cpu")
    except OSError as exc:
        raise EinspaceError(f"cannot read weights {path}: {exc.strerror or exc}") from None
    except Exception:  # noqa: BLE001 - whatever a foreign file makes the unpickler raise
        # torch's own message advises weights_only=False, which would run code from the file: never relay it
        raise EinspaceError(
            f"cannot read weights {path}: not a file of tensors saved with torch.save (einspace loads "
            "tensors only, never other pickled objects)"
        ) from None
    if not isinstance(state, Mapping):
        raise EinspaceError(f"weights {path} hold a {type(state).__name__}, not a state_dict")
    try:
        module.load_state_dict(state)
    except RuntimeError as exc:
        raise EinspaceError(
            f"weights {path} do not fit the network: {str(exc).splitlines()[-1].strip()}"
        ) from None


def class_name(stem: str) -> str:
    """A class name from a file or seed name: `wide_resnet16_4` -> `WideResnet16_4`."""
    name = ""
    for part in (p for p in re.split(r"[^0-9A-Za-z]+", stem) if p):
        name += ("_" if name and part[0].isdigit() else "") + part[0].upper() + part[1:]
    return name if name[:1].isalpha() else f"Network{name}"


def _need(input: FeatureState | Signal | None) -> FeatureState | Signal:
    if input is None:
        raise EinspaceError("exporting a tree needs the input state (shape and mode)")
    return input


# ----------------------------------------------------------------------------- what is written


@dataclass
class _Layer:
    """One attribute set in `__init__`: `template` with a `{}` per slot, slots as (role, value)."""

    attr: str
    template: str
    slots: tuple[tuple[str, int], ...]
    state: dict[str, torch.Tensor]
    child: _Instance | None = None


@dataclass(eq=False)
class _Instance:
    """One use of a generated class: its layers and forward code with the sizes written out."""

    kind: str
    doc: str
    layers: list[_Layer] = field(default_factory=list)
    lines: list[str] = field(default_factory=list)
    counts: Counter[str] = field(default_factory=Counter)
    cls: _Class | None = None
    arguments: tuple[int, ...] = ()

    def add(
        self,
        stem: str,
        template: str = "",
        slots: tuple[tuple[str, int], ...] = (),
        state: Mapping[str, torch.Tensor] | None = None,
        child: _Instance | None = None,
        numbered: bool = True,
    ) -> str:
        """A new attribute `stem1`, `stem2`, ... (or `stem`); returns `self.<name>`."""
        self.counts[stem] += 1
        attr = f"{stem}{self.counts[stem]}" if numbered else stem
        self.layers.append(_Layer(attr, template, slots, dict(state or {}), child))
        return f"self.{attr}"

    def line(self, text: str) -> None:
        self.lines.append(text)


@dataclass(frozen=True, eq=False)
class _Helper:
    """A fixed class or function the file needs for some layers (the NOS calibrations)."""

    name: str
    source: str


_DEPTHWISE = _Helper(
    "depthwise",
    '''def depthwise(x: torch.Tensor, kernel: torch.Tensor) -> torch.Tensor:
    """Filter each channel of each sample with its own k x k kernel [N, C, k, k], same size out."""
    n, c, h, w = x.shape
    k = kernel.shape[-1]
    out = F.conv2d(x.reshape(1, n * c, h, w), kernel.reshape(n * c, 1, k, k), padding=k // 2, groups=n * c)
    return out.reshape(n, c, h, w)''',
)

_CHANNEL = _Helper(
    "ChannelAttention",
    '''class ChannelAttention(nn.Module):
    """NOS channel attention: sigmoid(1x1 conv(ReLU(1x1 conv to C_g // 16 (mean of g over H, W))))."""

    def __init__(self, channels: int, generator_channels: int) -> None:
        super().__init__()
        self.reduce = nn.Conv2d(generator_channels, generator_channels // 16, 1, bias=False)
        self.expand = nn.Conv2d(generator_channels // 16, channels, 1, bias=False)

    def forward(self, g: torch.Tensor) -> torch.Tensor:
        pooled = g.mean(dim=(2, 3), keepdim=True)
        return torch.sigmoid(self.expand(F.relu(self.reduce(pooled))))''',
)

_SPATIAL = _Helper(
    "SpatialAttention",
    '''class SpatialAttention(nn.Module):
    """NOS spatial attention: sigmoid(3x3 conv to 1 (ReLU(BN(1x1 conv to C_g // 16 (g)))))."""

    def __init__(self, generator_channels: int) -> None:
        super().__init__()
        self.reduce = nn.Conv2d(generator_channels, generator_channels // 16, 1, bias=False)
        self.norm = nn.BatchNorm2d(generator_channels // 16)
        self.spatial = nn.Conv2d(generator_channels // 16, 1, 3, padding=1, bias=False)

    def forward(self, g: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(self.spatial(F.relu(self.norm(self.reduce(g)))))''',
)

_DYNAMIC = _Helper(
    "DynamicKernel",
    '''class DynamicKernel(nn.Module):
    """NOS dynamic convolution: per sample and channel k x k taps (a softmax) generated from g."""

    def __init__(self, channels: int, generator_channels: int, k: int) -> None:
        super().__init__()
        hidden = generator_channels // 8
        self.k = k
        self.values = nn.Conv2d(generator_channels, hidden, 1, bias=False)
        self.norm = nn.BatchNorm2d(hidden)
        self.taps = nn.Conv2d(generator_channels, k * k, 1, bias=False)
        self.expand = nn.Conv2d(hidden, channels, 1, bias=False)

    def forward(self, g: torch.Tensor) -> torch.Tensor:
        u = F.relu(self.norm(self.values(g))).flatten(2)
        m = torch.softmax(self.taps(g).flatten(2), dim=-1)
        kernel = self.expand(torch.bmm(u, m.transpose(1, 2)).unflatten(2, (self.k, self.k)))
        return torch.softmax(kernel.flatten(2), dim=-1).unflatten(2, (self.k, self.k))''',
)

_HELPERS = (_DEPTHWISE, _CHANNEL, _SPATIAL, _DYNAMIC)


def _generator_layer(generator: nn.Module) -> tuple[_Helper, tuple[tuple[str, int], ...]]:
    """The helper class that writes a NOS generator, and its constructor's (role, value) slots."""
    if isinstance(generator, ChannelAttention):
        channels = (
            ("channels", generator.expand.out_channels),
            ("generator_channels", generator.reduce.in_channels),
        )
        return _CHANNEL, channels
    if isinstance(generator, SpatialAttention):
        return _SPATIAL, (("generator_channels", generator.reduce.in_channels),)
    if isinstance(generator, DynamicKernel):
        slots = (
            ("channels", generator.expand.out_channels),
            ("generator_channels", generator.values.in_channels),
            ("kernel_size", generator.k),
        )
        return _DYNAMIC, slots
    raise EinspaceError(f"export cannot write a calibration by {type(generator).__name__}")


# ----------------------------------------------------------------------------- writing modules

_CONV2D = "nn.Conv2d({}, {}, {}, {}, {})"
_COUNTS = {2: "Two", 4: "Four", 8: "Eight"}
_CONV_ROLES = ("in_channels", "out_channels", "kernel_size", "stride", "padding")


def _conv_slots(c: int, d: int, k: int = 1, s: int = 1, p: int = 0) -> tuple[tuple[str, int], ...]:
    return tuple(zip(_CONV_ROLES, (c, d, k, s, p), strict=True))


def _linear_slots(n_in: int, n_out: int) -> tuple[tuple[str, int], ...]:
    return (("in_features", n_in), ("out_features", n_out))


def _permutation(pattern: str) -> list[int]:
    """Tensor axes (batch = 0) in their new order, from a permute's einops pattern."""
    left, right = (side.split() for side in pattern.split("->"))
    return [left.index(axis) for axis in right]


class _Writer:
    """Turns modules into layers and forward lines; each handler returns the variable holding
    the result (the input's own when nothing is computed)."""

    def __init__(self) -> None:
        self.helpers: set[_Helper] = set()

    def network(self, name: str, doc: str, network: Network) -> _Instance:
        root = _Instance(name, doc)
        x = self.emit(root, network.backbone, "x", "x")
        head = network.head
        if not isinstance(head, ClassificationHead):
            raise EinspaceError(f"export writes the paper's classification head, not {type(head).__name__}")
        slots = (("in_features", head.linear.in_features), ("classes", head.linear.out_features))
        layer = root.add("head", "nn.Linear({}, {})", slots, head.linear.state_dict(), numbered=False)
        pool = "mean((2, 3))" if head.pooled == (2, 3) else "mean(1)"
        root.line(f"return {layer}({x}.{pool})")
        return root

    def emit(self, scope: _Instance, module: nn.Module, x: str, out: str) -> str:
        if isinstance(module, nn.Sequential):
            return self.sequence(scope, list(module), x, out)
        handler = _HANDLERS.get(type(module))
        if handler is None:
            raise EinspaceError(f"export cannot write a {type(module).__name__} module as plain PyTorch")
        return handler(self, scope, module, x, out)

    def sequence(self, scope: _Instance, modules: list[nn.Module], x: str, out: str) -> str:
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
        self, scope: _Instance, split: nn.Module, branches: Branches, merge: nn.Module, x: str, out: str
    ) -> str:
        """A class of its own: split x, each branch into a local variable, then the aggregation."""
        b = len(branches)
        block = _Instance("", "")
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

    def calibration(self, scope: _Instance, module: Calibration, f: str, g: str) -> str:
        helper, slots = _generator_layer(module.generator)
        self.helpers.add(helper)
        template = f"{helper.name}({', '.join('{}' for _ in slots)})"
        layer = scope.add(_snake(helper.name), template, slots, module.generator.state_dict())
        if helper is _DYNAMIC:
            self.helpers.add(_DEPTHWISE)
            return f"{f} + depthwise({f}, {layer}({g}))"
        return f"{f} + {f} * {layer}({g})"

    def attention(self, scope: _Instance, module: Attention, x: str, out: str) -> str:
        heads = module.heads
        block = _Instance("Attention", "")
        if heads[0].linears is None:
            self.one_head(block, heads[0])
        else:
            self.fused_heads(block, module)
        call = scope.add("attention", child=block)
        scope.line(f"{out} = {call}({x})")
        return out

    def one_head(self, block: _Instance, head: AttentionHead) -> None:
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

    def fused_heads(self, block: _Instance, module: Attention) -> None:
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


def _passing(writer: _Writer, scope: _Instance, module: nn.Module, x: str, out: str) -> str:
    return x


def _conv(writer: _Writer, scope: _Instance, module: Conv, x: str, out: str) -> str:
    d, features = module.weight.shape
    c, k = features // module.k**2, module.k
    state = {"weight": module.weight.reshape(d, c, k, k), "bias": module.bias}
    conv = scope.add("conv", _CONV2D, _conv_slots(c, d, k, module.s, module.p), state)
    tokens = "" if module.fold else ".flatten(2).transpose(1, 2)"
    scope.line(f"{out} = {conv}({x}){tokens}")
    return out


def _linear(writer: _Writer, scope: _Instance, module: nn.Linear, x: str, out: str) -> str:
    layer = scope.add(
        "linear",
        "nn.Linear({}, {})",
        _linear_slots(module.in_features, module.out_features),
        module.state_dict(),
    )
    scope.line(f"{out} = {layer}({x})")
    return out


def _channel_linear(writer: _Writer, scope: _Instance, module: nn.Linear, x: str, out: str) -> str:
    state = {"weight": module.weight[:, :, None, None], "bias": module.bias}
    conv = scope.add("conv", _CONV2D, _conv_slots(module.in_features, module.out_features), state)
    scope.line(f"{out} = {conv}({x})")
    return out


def _branch_linear(writer: _Writer, scope: _Instance, module: BranchLinear, x: str, out: str) -> str:
    linears = module.linears
    n_in, d, b = linears[0].in_features, linears[0].out_features, len(linears)
    weights = [m.weight[:, :, None, None] if module.image else m.weight for m in linears]
    if module.combine == "features":  # stacked: one layer to b·d features
        state = {"weight": torch.cat(weights), "bias": torch.cat([m.bias for m in linears])}
        if module.image:
            layer = scope.add("conv", _CONV2D, _conv_slots(n_in, b * d), state)
        else:
            layer = scope.add("linear", "nn.Linear({}, {})", _linear_slots(n_in, b * d), state)
        scope.line(f"{out} = {layer}({x})")
        return out
    state = {}
    for i, (weight, m) in enumerate(zip(weights, linears, strict=True)):
        state[f"{i}.weight"], state[f"{i}.bias"] = weight, m.bias
    each = "nn.Conv2d({}, {}, 1)" if module.image else "nn.Linear({}, {})"
    slots = (*(_conv_slots(n_in, d)[:2] if module.image else _linear_slots(n_in, d)), ("branches", b))
    stem = "convs" if module.image else "linears"
    layers = scope.add(stem, f"nn.ModuleList({each} for _ in range({{}}))", slots, state)
    each_out = f"layer({x}) for layer in {layers}"
    scope.line(
        f"{out} = sum({each_out})" if module.combine == "add" else f"{out} = torch.cat([{each_out}], dim=1)"
    )
    return out


def _norm(writer: _Writer, scope: _Instance, module: nn.Module, x: str, out: str) -> str:
    if isinstance(module, nn.BatchNorm2d):
        layer = scope.add(
            "norm", "nn.BatchNorm2d({})", (("channels", module.num_features),), module.state_dict()
        )
    else:
        (features,) = module.normalized_shape
        layer = scope.add("norm", "nn.LayerNorm({})", (("features", features),), module.state_dict())
    scope.line(f"{out} = {layer}({x})")
    return out


def _leaky_relu(writer: _Writer, scope: _Instance, module: nn.LeakyReLU, x: str, out: str) -> str:
    scope.line(f"{out} = F.leaky_relu({x}, {module.negative_slope!r})")
    return out


def _softmax(writer: _Writer, scope: _Instance, module: nn.Softmax, x: str, out: str) -> str:
    scope.line(f"{out} = {x}.softmax(dim={-1 if module.dim is None else module.dim})")
    return out


def _positional(
    writer: _Writer, scope: _Instance, module: _modules.PositionalEncoding, x: str, out: str
) -> str:
    shape = tuple(module.weight.shape[1:])
    roles = ("tokens", "features") if len(shape) == 2 else ("channels", "height", "width")
    template = f"nn.Parameter(torch.randn(1, {', '.join('{}' for _ in shape)}) * 0.02)"
    position = scope.add("position", template, tuple(zip(roles, shape, strict=True)), {"": module.weight})
    scope.line(f"{out} = {x} + {position}")
    return out


def _im2col(writer: _Writer, scope: _Instance, module: _modules.Im2Col, x: str, out: str) -> str:
    scope.line(f"{out} = F.unfold({x}, {module.k}, padding={module.p}, stride={module.s}).transpose(1, 2)")
    return out


def _rearrange(writer: _Writer, scope: _Instance, module: Rearrange, x: str, out: str) -> str:
    if module.pattern == "b (h w) d -> b d h w":  # col2im
        h, w = module.axes_lengths["h"], module.axes_lengths["w"]
        scope.line(f"{out} = {x}.transpose(1, 2).unflatten(2, ({h}, {w}))")
        return out
    order = _permutation(module.pattern)
    moved = [i for i, axis in enumerate(order) if axis != i]
    if len(moved) == 2:
        scope.line(f"{out} = {x}.transpose({moved[0]}, {moved[1]})")
    else:
        scope.line(f"{out} = {x}.permute({', '.join(map(str, order))})")
    return out


def _unary_calibration(writer: _Writer, scope: _Instance, module: Calibration, x: str, out: str) -> str:
    scope.line(f"{out} = {writer.calibration(scope, module, x, x)}")
    return out


_Handler = Callable[[_Writer, _Instance, nn.Module, str, str], str]

#: Module type (exactly; ChannelLinear is an nn.Linear) -> how it is written.
_HANDLERS: dict[type, _Handler] = {
    Folded: _passing,
    nn.Identity: _passing,
    Conv: _conv,
    BranchLinear: _branch_linear,
    Attention: _Writer.attention,
    nn.Linear: _linear,
    _modules.ChannelLinear: _channel_linear,
    nn.BatchNorm2d: _norm,
    nn.LayerNorm: _norm,
    nn.LeakyReLU: _leaky_relu,
    nn.Softmax: _softmax,
    _modules.PositionalEncoding: _positional,
    _modules.Im2Col: _im2col,
    Rearrange: _rearrange,
    Calibration: _unary_calibration,
}


def _snake(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


# ----------------------------------------------------------------------------- classes


@dataclass(eq=False)
class _Class:
    """A generated class: the instances that use it, its constructor parameters (a name per
    slot position that differs between instances, None where all write the same value)."""

    name: str
    instances: list[_Instance]
    params: list[str] = field(default_factory=list)
    slot_params: list[int | None] = field(default_factory=list)
    defaults: dict[str, int] = field(default_factory=dict)


def _tree_order(roots: list[_Instance]) -> list[_Instance]:
    """Every instance, children before their parents, in the order they are written."""
    order: list[_Instance] = []

    def visit(instance: _Instance) -> None:
        for layer in instance.layers:
            if layer.child is not None:
                visit(layer.child)
        order.append(instance)

    for root in roots:
        visit(root)
    return order


def _classes(roots: list[_Instance], taken: set[str]) -> list[_Class]:
    """Instances grouped into classes: the same layers and forward code, sizes aside, share one.

    Children are classed before their parents (by height), so a parent's key can name the
    classes of its children and the sizes it passes them.
    """
    order = _tree_order(roots)
    height: dict[int, int] = {}
    for instance in order:
        kids = [height[id(layer.child)] for layer in instance.layers if layer.child is not None]
        height[id(instance)] = 1 + max(kids, default=-1)
    classes: list[_Class] = []
    taken = set(taken)
    for level in sorted(set(height.values())):
        keyed: dict[tuple, _Class] = {}
        made: list[_Class] = []
        for instance in (i for i in order if height[id(i)] == level):
            for layer in instance.layers:
                if layer.child is not None:
                    cls = layer.child.cls
                    assert cls is not None
                    layer.template = f"{cls.name}({', '.join('{}' for _ in cls.params)})"
                    layer.slots = tuple(zip(cls.params, layer.child.arguments, strict=True))
            if any(instance is root for root in roots):
                cls = _Class(instance.kind, [instance])
                made.append(cls)
            else:
                layers = tuple(
                    (lay.attr, lay.template, tuple(r for r, _ in lay.slots)) for lay in instance.layers
                )
                key = (instance.kind, instance.doc, layers, tuple(instance.lines))
                cls = keyed.get(key)
                if cls is None:
                    cls = keyed[key] = _Class(_fresh(instance.kind, taken), [])
                    made.append(cls)
                cls.instances.append(instance)
            instance.cls = cls
        for cls in made:
            _parametrise(cls, is_root=cls.instances[0] in roots)
        classes.extend(made)
    return classes


def _fresh(stem: str, taken: set[str]) -> str:
    """`stem`, or `stem2`, `stem3`, ... whichever is free first; marked as taken."""
    name, n = stem, 1
    while name in taken:
        n += 1
        name = f"{stem}{n}"
    taken.add(name)
    return name


def _parametrise(cls: _Class, is_root: bool) -> None:
    """Constructor parameters: one per group of slot positions of one kind (channels, features,
    stride, ...) whose values vary alike over the instances (positions that never vary stay
    literal); a network's class count is a parameter."""
    slots = [[value for layer in inst.layers for _, value in layer.slots] for inst in cls.instances]
    roles = [role for layer in cls.instances[0].layers for role, _ in layer.slots]
    groups: dict[tuple[str, tuple[int, ...]], int] = {}
    members: list[list[int]] = []
    for position, role in enumerate(roles):
        values = tuple(row[position] for row in slots)
        varies = len(set(values)) > 1 or (is_root and role == "classes")
        if not varies:
            cls.slot_params.append(None)
            continue
        key = (_base(role), values)
        if key not in groups:
            groups[key] = len(members)
            members.append([])
        members[groups[key]].append(position)
        cls.slot_params.append(groups[key])
    cls.params = _param_names([[roles[p] for p in group] for group in members])
    if is_root and "classes" in cls.params:
        cls.defaults["classes"] = slots[0][roles.index("classes")]
    for inst, row in zip(cls.instances, slots, strict=True):
        inst.arguments = tuple(row[group[0]] for group in members)


def _base(role: str) -> str:
    """The kind of a slot: `in_channels`, `out_channels` and `channels` are all channels."""
    return role.removeprefix("in_").removeprefix("out_")


def _param_names(groups: list[list[str]]) -> list[str]:
    """A name per group of roles (of one kind): the kind itself for an in_/out_ pair where no
    other group is of that kind (`channels` for a block that keeps its width), else the first role."""
    names = []
    for i, roles in enumerate(groups):
        paired = any(r.startswith("in_") for r in roles) and any(r.startswith("out_") for r in roles)
        others = {_base(r) for j, g in enumerate(groups) if j != i for r in g}
        name = _base(roles[0]) if paired and _base(roles[0]) not in others else roles[0]
        names.append(name)
    taken: set[str] = set()
    return [_fresh(name, taken) for name in names]


_WIDTH = 100  # the longest line written: the file must pass linters set to 100 or more


def _call(indent: str, head: str, items: list[str], tail: str = "") -> list[str]:
    """`head(items)tail` on one line if it fits, else the items on their own line(s)."""
    line = f"{indent}{head}({', '.join(items)}){tail}"
    if len(line) <= _WIDTH:
        return [line]
    inner = indent + "    "
    if len(inner) + len(", ".join(items)) <= _WIDTH:
        return [f"{indent}{head}(", inner + ", ".join(items), f"{indent}){tail}"]
    return [f"{indent}{head}(", *(f"{inner}{item}," for item in items), f"{indent}){tail}"]


def _render(cls: _Class) -> str:
    first = cls.instances[0]
    params = [f"{p}: int" + (f" = {cls.defaults[p]}" if p in cls.defaults else "") for p in cls.params]
    lines = [f"class {cls.name}(nn.Module):", f'    """{first.doc}"""', ""]
    lines += _call("    ", "def __init__", ["self", *params], " -> None:")
    lines.append("        super().__init__()")
    position = 0
    for layer in first.layers:
        values = []
        for _, value in layer.slots:
            param = cls.slot_params[position]
            values.append(repr(value) if param is None else cls.params[param])
            position += 1
        if layer.child is not None:  # `Block(sizes...)`: the one constructor that can grow long
            assert layer.child.cls is not None
            lines += _call("        ", f"self.{layer.attr} = {layer.child.cls.name}", values)
        else:
            lines.append(f"        self.{layer.attr} = {layer.template.format(*values)}")
    lines += ["", "    def forward(self, x: torch.Tensor) -> torch.Tensor:"]
    lines += [f"        {line}" for line in first.lines]
    return "\n".join(lines)


def _state(instance: _Instance, prefix: str = "") -> dict[str, torch.Tensor]:
    """The tensors of an instance and its children under their keys in the exported module."""
    out: dict[str, torch.Tensor] = {}
    for layer in instance.layers:
        key = prefix + layer.attr
        if layer.child is not None:
            out.update(_state(layer.child, key + "."))
        for name, tensor in layer.state.items():
            out[f"{key}.{name}" if name else key] = tensor.detach().clone().contiguous()
    return out

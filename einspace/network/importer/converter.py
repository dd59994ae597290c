"""Import: a PyTorch model, traced with torch.fx, as a derivation tree that computes the same function.

The traced graph is turned into the grammar's modules from its outputs back to its input. A
value computed by one operation from one tensor extends a sequence; an operation that joins
several (`+`, `torch.cat`, `@`) is a branching module whose branches start where the joined
values part (the operation's immediate dominator) and are cloned there. Layers become the
grammar's operations (`nn.Conv2d` is im2col · linear · col2im, `nn.Linear` a linear, norms,
leaky ReLU, softmax, a learnt tensor added a positional encoding), and
`F.scaled_dot_product_attention` with its projections becomes attention heads. The trailing
mean over space (or tokens) and linear layer are the paper's classification head.

Reshapes and permutes are recognised by what they do, not by how they are written: each run of
them is applied to a tensor of indices, and the result is compared with the grammar's routings
(a permute of the feature axes, image to tokens, tokens to image); the same trick finds which
rows of a projection (one qkv linear, or three) feed which attention head. The graph, its
values on an example input and the source line of each node come from `einspace.network.importer.graph`.

Whatever the grammar cannot express (a max-pool, GELU, a kernel or width off its grid) is a
`ModelImportError` at the model's source line, naming the module and the closest expressible
substitute; with `substitute=True` the substitutes are used and listed. Weights transfer
wherever the layer keeps its shape; substituted layers start from a fresh initialisation.
"""

from __future__ import annotations

import importlib
import importlib.util
import itertools
import math
import operator
import sys
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch
import torch.fx as fx
import torch.nn.functional as F
from torch import nn

from einspace.bundled import load as load_grammar
from einspace.checker import check_tree
from einspace.errors import EinspaceError, TreeError
from einspace.grammar.model import Grammar, OpItem, ParallelItem, RepeatItem
from einspace.network.compiler import compile_backbone, compile_network
from einspace.network.importer.graph import ModelImportError, TracedModel, target_name
from einspace.seeds import architectures as arch
from einspace.state import FeatureState
from einspace.tree import Node, Nonterminal, Terminal, format_terminal, pretty

__all__ = ["ImportedModel", "ModelImportError", "import_model", "load_factory"]

#: Weights of one stateful terminal (linear, norm, positional encoding), keyed as in its
#: compiled module; None keeps the fresh initialisation (a substituted layer).
_Entry = dict[str, torch.Tensor] | None


@dataclass(frozen=True)
class ImportedModel:
    """The derivation tree of a model's backbone, its head's classes (None when it has no head of
    the paper's form), a state_dict with its weights for `compile_network(tree, input, classes)`
    (or `compile_backbone` without a head), and the substitutions made, each located."""

    tree: Node
    input: FeatureState
    classes: int | None
    state_dict: dict[str, torch.Tensor]
    substitutions: tuple[str, ...]

    def tree_file(self, origin: str) -> str:
        """The tree in a file's bracket form, after a `#` header: where it came from, its size and
        what was substituted."""
        checked = check_tree(self.tree, None, self.input)
        head = f"+ a head for {self.classes} classes" if self.classes else "no head"
        lines = [
            f"Imported by `{origin}`.",
            f"At {self.input}: {checked.params:,} backbone parameters ({head}).",
            *(f"substituted: {line}" for s in self.substitutions for line in s.splitlines()),
        ]
        return "".join(f"# {line}\n" for line in lines) + pretty(self.tree) + "\n"

    def network(self, grammar: Grammar | None = None) -> nn.Module:
        """The compiled network with the model's weights."""
        if self.classes is None:
            built = compile_backbone(self.tree, self.input, grammar)
        else:
            built = compile_network(self.tree, self.input, self.classes, grammar)
        built.load_state_dict(self.state_dict)
        return built


def load_factory(spec: str) -> nn.Module:
    """`MODULE:FACTORY` called without arguments: the model. MODULE is a .py file, or a module
    importable from the current directory or the installed packages."""
    module_name, _, factory_name = spec.rpartition(":")
    if not module_name or not factory_name:
        raise EinspaceError(f"{spec!r}: give the model as MODULE:FACTORY, e.g. my_models.py:ResNet18")
    try:
        if module_name.endswith(".py"):
            path = Path(module_name)
            found = importlib.util.spec_from_file_location(f"einspace_model_{path.stem}", path)
            if not path.is_file() or found is None or found.loader is None:
                raise EinspaceError(f"{spec!r}: no file {module_name}")
            module = importlib.util.module_from_spec(found)
            sys.modules[found.name] = module  # its own name: classes defined there can find it
            found.loader.exec_module(module)
        else:
            if str(Path.cwd()) not in sys.path:
                sys.path.insert(0, str(Path.cwd()))
            module = importlib.import_module(module_name)
    except EinspaceError:
        raise
    except Exception as exc:  # the user's module may fail in any way while it loads
        raise EinspaceError(f"{spec!r}: cannot import {module_name}: {type(exc).__name__}: {exc}") from None
    factory = getattr(module, factory_name, None)
    if not callable(factory):
        raise EinspaceError(f"{spec!r}: {module_name} has no callable {factory_name!r}")
    try:
        model = factory()
    except Exception as exc:  # e.g. a factory that needs arguments
        raise EinspaceError(f"{spec!r}: {factory_name}() failed: {type(exc).__name__}: {exc}") from None
    if not isinstance(model, nn.Module):
        raise EinspaceError(f"{spec!r}: {factory_name}() returned a {type(model).__name__}, not an nn.Module")
    return model


def import_model(
    model: nn.Module,
    input: FeatureState,
    grammar: Grammar | str = "einspace",
    *,
    substitute: bool = False,
) -> ImportedModel:
    """The tree of `grammar` (built with the paper's grammar symbols, then checked against it
    for `input`) that computes what `model` computes, with the model's weights.

    Raises ModelImportError for anything the grammar cannot express; with `substitute` the
    closest expressible operations are used instead and listed in `substitutions`.
    """
    grammar = load_grammar(grammar) if isinstance(grammar, str) else grammar
    converter = _Converter(model, input, grammar)
    tree, entries, head = converter.convert()
    made = converter.report()
    if made and not substitute:
        raise ModelImportError(
            f"grammar {grammar.path} cannot express {len(made)} kind(s) of operation of the model:\n"
            + "\n".join(made)
            + "\nimport with substitute=True (`einspace import-model --substitute`) to use these substitutes"
        )
    try:
        check_tree(tree, grammar, input)
    except TreeError as exc:
        raise ModelImportError(
            f"the imported tree does not fit grammar {grammar.path} at input {input}: {exc}"
        ) from None
    classes = None if head is None else head.out_features
    state, mismatched = _state_dict(tree, input, classes, entries, head)
    notes = [
        f"weights of {name} not transferred: their shape changed with a substitution" for name in mismatched
    ]
    return ImportedModel(tree, input, classes, state, (*made, *notes))


# ----------------------------------------------------------------------------- tree pieces


@dataclass(frozen=True)
class _Piece:
    """A module of the grammar, the weights of its stateful terminals in compiled order, and the
    model's submodule it comes from (its path; None for an identity), to group sequences by."""

    module: Nonterminal
    entries: tuple[_Entry, ...]
    owner: tuple[str, ...] | None = None


@dataclass(frozen=True)
class _Route:
    """A routing operation still to be paired into `R1 M R2`: opens (im2col, permute) or closes
    (col2im, permute) a routing module."""

    op: Terminal
    node: fx.Node


def _common(owners: list[tuple[str, ...] | None]) -> tuple[str, ...] | None:
    """The longest module path that all given paths start with (None when none is given)."""
    known = [o for o in owners if o is not None]
    if not known:
        return None
    common = known[0]
    for owner in known[1:]:
        n = 0
        while n < min(len(common), len(owner)) and common[n] == owner[n]:
            n += 1
        common = common[:n]
    return common


def _sequence(pieces: list[_Piece]) -> _Piece:
    """The pieces in sequence, nested as the model nests its submodules: the pieces of one child
    module form one module of the tree, so the tree reads like the model (and stays shallow)."""
    if not pieces:
        return _Piece(arch.identity(), ())
    if len(pieces) == 1:
        return pieces[0]
    common = _common([p.owner for p in pieces])
    depth = len(common) if common is not None else 0

    def child(index_piece: tuple[int, _Piece]) -> Any:
        index, piece = index_piece
        return piece.owner[depth] if piece.owner is not None and len(piece.owner) > depth else -index

    parts = [[p for _, p in run] for _, run in itertools.groupby(enumerate(pieces), key=child)]
    grouped = [_sequence(run) if len(run) < len(pieces) else _flat(run) for run in parts]
    return _flat(grouped, common)


def _flat(pieces: list[_Piece], owner: tuple[str, ...] | None = None) -> _Piece:
    if len(pieces) == 1:
        return pieces[0]
    entries = tuple(e for p in pieces for e in p.entries)
    return _Piece(arch.seq(*(p.module for p in pieces)), entries, owner or _common([p.owner for p in pieces]))


def _linear_entry(weight: torch.Tensor, bias: torch.Tensor | None) -> dict[str, torch.Tensor]:
    bias = torch.zeros(weight.shape[0], dtype=weight.dtype) if bias is None else bias
    return {"weight": weight.detach().clone(), "bias": bias.detach().clone()}


# ----------------------------------------------------------------------------- what the grammar lacks


#: Activations the paper's grammar lacks: each becomes its leaky ReLU, as a substitution.
_ACTIVATION_MODULES = tuple(
    getattr(nn, n) for n in "ReLU GELU SiLU ELU Tanh Sigmoid ReLU6 Hardswish Mish".split()
)
_ACTIVATION_FUNCTIONS = (torch.relu, torch.tanh, torch.sigmoid) + tuple(
    getattr(F, n) for n in "relu gelu silu elu relu6 hardswish mish".split()
)
_ACTIVATION_METHODS = {"relu", "sigmoid", "tanh"}
_POOL_MODULES = (nn.MaxPool2d, nn.AvgPool2d)
_POOL_FUNCTIONS = {F.max_pool2d, F.avg_pool2d}
_HEAD_POOLS = {"mean", "flatten", "view", "reshape", "squeeze"}


class _Converter(TracedModel):
    """A traced model and the tree of the grammar built from it."""

    def __init__(self, model: nn.Module, input: FeatureState, grammar: Grammar):
        super().__init__(model, input)
        self.grammar = grammar
        self.grid = _grid(grammar)
        self.substitutions: dict[tuple[str, str], list[fx.Node]] = {}
        self.used: dict[str, fx.Node] = {}

    def substituted(self, node: fx.Node, what: str, substitute: str) -> None:
        """Something the grammar cannot express, with the substitute used in its place."""
        self.substitutions.setdefault((what, substitute), []).append(node)

    def report(self) -> list[str]:
        """One entry per kind of substitution, in the model's order: the first place with its
        source line, the others by file:line:col."""
        order = {n: i for i, n in enumerate(self.graph.nodes)}
        out = []
        for (what, substitute), nodes in sorted(
            self.substitutions.items(), key=lambda i: min(map(order.get, i[1]))
        ):
            first, *others = sorted(nodes, key=order.get)
            places = list(dict.fromkeys(self.where(n).partition(": ")[0] for n in others))
            also = f"\n  (also at {', '.join(places)})" if places else ""
            out.append(
                f"{self.where(first)}\n  {what} is not in grammar {self.grammar.path}; "
                f"closest expressible: {substitute}{also}"
            )
        return out

    def use(self, node: fx.Node) -> None:
        """A module with weights goes into the tree once: a second call would share weights."""
        if node.op != "call_module" or not any(True for _ in self.modules[node.target].parameters()):
            return
        if node.target in self.used:
            first = self.used[node.target]
            why = "called twice" if first is not node else "needed by several branches"
            raise self.fail(
                node,
                f"module `{node.target}` is {why}: its weights would be shared, and the grammar's "
                "modules each have their own",
            )
        self.used[node.target] = node

    def terminal(self, node: fx.Node, name: str, **args: Any) -> Terminal:
        """The operation call, which the grammar must allow somewhere with these arguments."""
        if name not in self.grid:
            raise self.fail(node, f"the grammar {self.grammar.path} has no operation {name}")
        call = arch.op(name, **args)
        if call.args not in self.grid[name]:
            allowed = " | ".join(format_terminal(Terminal(name, a)) for a in sorted(self.grid[name], key=str))
            raise self.fail(
                node, f"{format_terminal(call)} is not in the grammar's grid, which has {allowed}"
            )
        return call

    # ------------------------------------------------------------- the whole model

    def convert(self) -> tuple[Node, tuple[_Entry, ...], nn.Linear | None]:
        (output,) = (n for n in self.graph.nodes if n.op == "output")
        end = output.args[0]
        if not isinstance(end, fx.Node) or not isinstance(self.values.get(end), torch.Tensor):
            raise self.fail(output, "the model must return one tensor")
        head, end = self._head(end)
        body = _sequence(self.assemble(self.chain(end, self.placeholder)))
        module = body.module
        if len(module.children) == 1:  # S derives no lone computation: pass on an identity after it
            module = arch.seq(module, arch.identity())
            body = _Piece(module, body.entries)
        return arch.network(module), body.entries, head

    def _head(self, end: fx.Node) -> tuple[nn.Linear | None, fx.Node]:
        """The paper's head at the end (a linear layer of the mean over space or tokens): its
        linear and the backbone's output; or no head. The mean is checked on the values."""
        if end.op != "call_module" or not isinstance(self.modules[end.target], nn.Linear):
            return None, end
        pooled = self.values[end.args[0]]
        if not isinstance(pooled, torch.Tensor) or pooled.dim() != 2:
            return None, end
        candidates, node = [], end.args[0]
        while isinstance(node, fx.Node) and self._head_pool(node) and len(self.inputs(node)) == 1:
            node = self.inputs(node)[0]
            candidates.append(node)
        for source in reversed(candidates):  # the earliest value whose mean is the pooled one
            value = self.values[source]
            if value.dim() not in (3, 4) or value.shape[0] != pooled.shape[0]:
                continue
            mean = value.mean((2, 3) if value.dim() == 4 else 1)
            if mean.shape == pooled.shape and torch.allclose(mean, pooled, rtol=1e-5, atol=1e-6):
                self.use(end)
                return self.modules[end.target], source
        return None, end

    def _head_pool(self, node: fx.Node) -> bool:
        if node.op == "call_module":
            return isinstance(self.modules[node.target], (nn.AdaptiveAvgPool2d, nn.Flatten))
        return target_name(node.target) in _HEAD_POOLS or node.target is F.adaptive_avg_pool2d

    # ------------------------------------------------------------- from an output back to its source

    def chain(self, end: fx.Node, start: fx.Node) -> list[_Piece | _Route]:
        """The pieces and routes that compute `end` from `start`, in forward order."""
        items: list[_Piece | _Route] = []
        node = end
        while node is not start:
            if node not in self.idom or node.op == "placeholder":
                raise self.fail(node, "this value does not come from the branch's input")
            made, previous = self.step(node, start)
            owner = self.owner(node)
            items[:0] = [
                replace(m, owner=owner) if isinstance(m, _Piece) and m.owner is None else m for m in made
            ]
            node = previous
        return items

    def step(self, node: fx.Node, start: fx.Node) -> tuple[list[_Piece | _Route], fx.Node]:
        """What one node (or a run of layout nodes, or an attention) contributes, and where the
        chain goes on (never past `start`)."""
        if self.is_layout(node):
            run = [node]
            while self.inputs(run[0])[0] is not start and self.is_layout(self.inputs(run[0])[0]):
                run.insert(0, self.inputs(run[0])[0])
            source = self.inputs(run[0])[0]
            if not isinstance(self.values[source], torch.Tensor):
                raise self.fail(source, f"{self.short(source)} has no counterpart in the grammar")
            if source.target is F.scaled_dot_product_attention:
                return self.attention(source, run)
            return self.layout(source, run), source
        if node.target is F.scaled_dot_product_attention:
            return self.attention(node, [])
        inputs = self.inputs(node)
        if len(inputs) >= 2 or self.scaled_matmul(node) is not None:
            piece, fork = self.branching(node)
            return [piece], fork
        if len(inputs) != 1:
            raise self.fail(node, "expected one input tensor")
        return self.unary(node, inputs[0]), inputs[0]

    def layout(self, source: fx.Node, run: list[fx.Node]) -> list[_Piece | _Route]:
        """A run of reshapes and permutes as the grammar's routing: nothing, a permute of the
        feature axes, image to tokens (im2col 1×1), or tokens to image (col2im)."""
        index = self.index_map(source, run)
        base = torch.arange(self.values[source].numel()).reshape(self.values[source].shape)
        if index.shape == base.shape and torch.equal(index, base):
            return []
        rank = base.dim()
        for order in itertools.permutations(range(1, rank)):
            if index.shape == base.permute(0, *order).shape and torch.equal(index, base.permute(0, *order)):
                return [_Route(self.terminal(run[-1], "permute", order=order), run[-1])]
        if rank == 4 and torch.equal(index, base.flatten(2).transpose(1, 2)):
            return [_Route(self.terminal(run[-1], "im2col", k=1, s=1, p=0), run[-1])]
        if rank == 3 and index.dim() == 4:
            image = base.transpose(1, 2).unflatten(2, tuple(index.shape[2:]))
            if torch.equal(index, image):
                return [_Route(self.terminal(run[-1], "col2im"), run[-1])]
        raise self.fail(
            run[-1],
            f"this reshape ({tuple(base.shape)} to {tuple(index.shape)}) is not a routing of the grammar: "
            "a permute of the feature axes, image to tokens (flatten(2).transpose(1, 2)) or back",
        )

    # ------------------------------------------------------------- one-input operations

    def unary(self, node: fx.Node, source: fx.Node) -> list[_Piece | _Route]:
        value = self.values[source]
        if node.op == "call_module":
            module = self.modules[node.target]
            handler = next((h for kinds, h in _MODULE_HANDLERS if isinstance(module, kinds)), None)
            if handler is not None:
                return handler(self, node, module, value)
            raise self.fail(node, f"{type(module).__name__} has no counterpart in the grammar")
        target = node.target
        if target is F.leaky_relu:
            slope = node.args[1] if len(node.args) > 1 else node.kwargs.get("negative_slope", 0.01)
            return self.activation(node, slope)
        if target in _ACTIVATION_FUNCTIONS or (node.op == "call_method" and target in _ACTIVATION_METHODS):
            return self.activation(node, None)
        if target in (F.softmax, torch.softmax) or (node.op == "call_method" and target == "softmax"):
            dim = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim")
            return self.softmax(node, dim, value)
        if target is F.dropout:
            return self.dropout(node, node.args[1] if len(node.args) > 1 else node.kwargs.get("p", 0.5))
        if target in _POOL_FUNCTIONS:
            kernel = node.args[1] if len(node.args) > 1 else node.kwargs["kernel_size"]
            stride = node.args[2] if len(node.args) > 2 else node.kwargs.get("stride") or kernel
            padding = node.args[3] if len(node.args) > 3 else node.kwargs.get("padding", 0)
            return self.pool(node, target_name(target), value, kernel, stride, padding)
        if target in (operator.add, torch.add) or (node.op == "call_method" and target == "add"):
            return self.positional(node, value)
        raise self.fail(node, f"{target_name(target)} has no counterpart in the grammar")

    def activation(self, node: fx.Node, slope: float | None) -> list[_Piece | _Route]:
        if slope != 0.01:
            what = f"leaky ReLU with slope {slope}" if slope is not None else self.short(node)
            self.substituted(node, what, "leaky_relu (slope 0.01), the grammar's activation")
        self.terminal(node, "leaky_relu")
        return [_Piece(arch.act(), ())]

    def softmax(self, node: fx.Node, dim: int | None, value: torch.Tensor) -> list[_Piece | _Route]:
        if dim is None or dim % value.dim() != value.dim() - 1:
            raise self.fail(node, f"softmax over axis {dim}: the grammar's softmax is over the last axis")
        self.terminal(node, "softmax")
        return [_Piece(arch.softmax(), ())]

    def dropout(self, node: fx.Node, p: float) -> list[_Piece | _Route]:
        """Left out: exactly so with p = 0 (as models often leave it), else a substitution."""
        if p:
            self.substituted(
                node, f"dropout (p = {p})", "nothing (dropout acts only in training; it is left out)"
            )
        return []

    def pool(
        self, node: fx.Node, what: str, value: torch.Tensor, kernel: Any, stride: Any, padding: Any
    ) -> list[_Piece | _Route]:
        """A pooling layer becomes a convolution of the same output size (the paper's ResNet seed
        replaces the max-pool by a 3×3 stride-2 convolution), with fresh weights."""
        channels = value.shape[1]
        out = self.values[node].shape[2:]
        k, s, p = (_square(v) for v in (kernel, stride, padding))
        grid = self._conv_substitute(node, value, k, s, p, out)
        d = self._width(node, channels, "the pooled channels")
        described = f"{what} (kernel {k}, stride {s}, padding {p})"
        self.substituted(node, described, f"{self._conv_text(grid, d)}, with new weights")
        return self._conv_items(node, grid, d, None)

    def positional(self, node: fx.Node, value: torch.Tensor) -> list[_Piece | _Route]:
        """x + a learnt tensor of x's shape (or with a leading 1): a positional encoding."""
        constants = [c for c in self.constants(node) if isinstance(c, torch.Tensor)]
        if len(constants) != 1 or constants[0].shape not in (value.shape[1:], (1, *value.shape[1:])):
            raise self.fail(
                node, "adding a constant is in the grammar only as a learnt positional encoding of x's shape"
            )
        self.terminal(node, "pos_enc")
        weight = constants[0].detach().reshape(1, *value.shape[1:]).clone()
        return [_Piece(arch.pos_enc(), ({"weight": weight},))]

    # ------------------------------------------------------------- layers with weights

    def conv(self, node: fx.Node, module: nn.Conv2d, value: torch.Tensor) -> list[_Piece | _Route]:
        self.use(node)
        k, s, p = module.kernel_size, module.stride, module.padding
        out = self.values[node].shape[2:]
        exact = (
            module.groups == 1
            and module.dilation == (1, 1)
            and module.padding_mode == "zeros"
            and k[0] == k[1]
            and s[0] == s[1]
            and isinstance(p, tuple)
            and p[0] == p[1]
        )
        if exact and (("k", k[0]), ("s", s[0]), ("p", p[0])) in self.grid.get("im2col", ()):
            d = self._width(node, module.out_channels, "the output channels")
            weight = module.weight.reshape(module.out_channels, -1)
            entry = _linear_entry(weight, module.bias) if d == module.out_channels else None
            return self._conv_items(node, (k[0], s[0], p[0]), d, entry)
        grid = self._conv_substitute(node, value, k[0], s[0], p[0] if isinstance(p, tuple) else 0, out)
        d = self._width(node, module.out_channels, "the output channels")
        shape = f"a {k[0]}x{k[1]} stride-{s[0]} convolution, padding {p}"
        if module.groups != 1 or module.dilation != (1, 1) or module.padding_mode != "zeros":
            shape += f", groups {module.groups}, dilation {module.dilation}, {module.padding_mode} padding"
        self.substituted(node, shape, f"{self._conv_text(grid, d)}, with new weights")
        return self._conv_items(node, grid, d, None)

    def _conv_items(
        self, node: fx.Node, grid: tuple[int, int, int], d: int, entry: _Entry
    ) -> list[_Piece | _Route]:
        k, s, p = grid
        opened, closed = self.terminal(node, "im2col", k=k, s=s, p=p), self.terminal(node, "col2im")
        return [_Route(opened, node), _Piece(arch.linear(d), (entry,)), _Route(closed, node)]

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

    def linear(self, node: fx.Node, module: nn.Linear, value: torch.Tensor) -> list[_Piece | _Route]:
        self.use(node)
        if value.dim() != 3:
            raise self.fail(
                node,
                "nn.Linear on a tensor of rank "
                f"{value.dim()}: the grammar's linear acts on tokens [B, S, D] (on an image's channels "
                "it is a 1x1 convolution)",
            )
        d = self._width(node, module.out_features, "the output features")
        entry = _linear_entry(module.weight, module.bias) if d == module.out_features else None
        return [_Piece(arch.linear(d), (entry,))]

    def batch_norm(self, node: fx.Node, module: nn.BatchNorm2d, value: torch.Tensor) -> list[_Piece | _Route]:
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
        return [_Piece(arch.norm(), (dict(module.state_dict()),))]

    def layer_norm(self, node: fx.Node, module: nn.LayerNorm, value: torch.Tensor) -> list[_Piece | _Route]:
        self.use(node)
        if value.dim() != 3 or module.normalized_shape != (value.shape[-1],) or not module.elementwise_affine:
            raise self.fail(
                node, "the grammar's norm in col mode is a LayerNorm over the last axis of [B, S, D]"
            )
        if module.eps != 1e-5 or module.bias is None:
            self.substituted(node, f"{module}", "norm (LayerNorm with eps 1e-5 and a bias)")
        self.terminal(node, "norm")
        entry = _linear_entry(module.weight, module.bias)
        return [_Piece(arch.norm(), (entry,))]

    # ------------------------------------------------------------- joins

    def scaled_matmul(self, node: fx.Node) -> fx.Node | None:
        """The matmul of `matmul(a, b) * c` (or `/ c`) when c is 1/sqrt (or sqrt) of the inner size."""
        if node.target not in (operator.mul, operator.truediv) or len(self.inputs(node)) != 1:
            return None
        (inner,) = self.inputs(node)
        if inner.target not in (operator.matmul, torch.matmul) or inner not in self.idom:
            return None
        size = self.values[self.inputs(inner)[0]].shape[-1]
        numbers = [c for c in self.constants(node) if isinstance(c, (int, float))]
        wanted = 1 / math.sqrt(size) if node.target is operator.mul else math.sqrt(size)
        return inner if len(numbers) == 1 and math.isclose(numbers[0], wanted, rel_tol=1e-6) else None

    def branching(self, node: fx.Node) -> tuple[_Piece, fx.Node]:
        """A join of several values: clone where they part (the fork, returned), one branch each,
        then the aggregation."""
        matmul = self.scaled_matmul(node)
        joined = matmul or node
        inputs = self.inputs(joined)
        target = joined.target
        if matmul is not None:
            merge = self.terminal(node, "matmul", scaled=True)
        elif target in (operator.add, torch.add) or (joined.op == "call_method" and target == "add"):
            if len(inputs) != 2 or any(
                isinstance(a, (int, float)) and a != 1 for a in joined.kwargs.values()
            ):
                raise self.fail(node, "only a plain sum of tensors is the grammar's add")
            merge = self.terminal(node, "add")
        elif target in (operator.matmul, torch.matmul, torch.bmm):
            merge = self.terminal(node, "matmul", scaled=False)
        elif target is torch.cat:
            rank = self.values[node].dim()
            dim = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim", 0)
            dim = dim % rank
            if dim == 0:
                raise self.fail(node, "concatenation along the batch axis")
            merge = self.terminal(node, "concat", dim=dim, b=len(inputs))
        else:
            raise self.fail(
                node, f"{self.short(node)} of {len(inputs)} tensors has no counterpart in the grammar"
            )
        fork = self.idom[joined]
        split = self.terminal(node, "clone", b=len(inputs))
        branches = [_sequence(self.assemble(self.chain(value, fork))) for value in inputs]
        if merge.op == "add":  # a sum in any order is the same: shortcuts last, as residual() writes them
            branches.sort(key=lambda branch: branch.module == arch.identity())
        modules = [branch.module for branch in branches]
        shared = modules[0] if len(modules) != 2 and all(m == modules[0] for m in modules) else modules
        entries = tuple(e for branch in branches for e in branch.entries)
        owner = _common([self.owner(node), *(branch.owner for branch in branches)])
        return _Piece(arch.branching(split, shared, merge), entries, owner), fork

    def attention(self, node: fx.Node, run: list[fx.Node]) -> tuple[list[_Piece | _Route], fx.Node]:
        """F.scaled_dot_product_attention of projections of one input: h attention heads,
        joined along the features (multi-head) or one head; the projection that may follow is
        a linear of its own."""
        q, k, v = self.inputs(node)[:3]
        options = dict(zip(("attn_mask", "dropout_p", "is_causal", "scale"), node.args[3:], strict=False))
        options.update(node.kwargs)
        if options.get("attn_mask") is not None or options.get("dropout_p", 0) or options.get("is_causal"):
            raise self.fail(node, "attention with a mask, dropout or causal masking is not in the grammar")
        found = [self.projection(t) for t in (q, k, v)]
        sources = {tuple(self.inputs(linear_node)) for linear_node, _, _ in found}
        if len(sources) != 1 or len(next(iter(sources))) != 1:
            raise self.fail(node, "queries, keys and values must be projections of one input")
        (source,) = sources.pop()
        for linear_node in dict.fromkeys(linear_node for linear_node, _, _ in found):
            self.use(linear_node)
        rows = [(module, head_rows) for _, module, head_rows in found]
        (heads, e), e_v = rows[0][1].shape, rows[2][1].shape[1]
        scale = options.get("scale")
        if e_v != e or (scale is not None and not math.isclose(scale, 1 / math.sqrt(e), rel_tol=1e-6)):
            raise self.fail(
                node, "the grammar's attention head has q, k, v of one width, scaled by 1/sqrt(width)"
            )
        output = self.values[node]
        index = self.index_map(node, run)
        base = torch.arange(output.numel()).reshape(output.shape)
        joined = base if output.dim() == 3 else base.transpose(1, 2).flatten(2)
        if index.shape != joined.shape or not torch.equal(index, joined):
            raise self.fail(
                run[-1] if run else node, "the heads must be joined along the features, [B, N, heads * width]"
            )
        entries = []
        for h in range(heads):
            for module, head_rows in rows:
                entries.append(_linear_entry(module.weight[head_rows[h]], _rows(module.bias, head_rows[h])))
        d = self._width(node, e, "the attention head width")
        for name, args in (("clone", {"b": 2}), ("matmul", {"scaled": True}), ("matmul", {"scaled": False})):
            self.terminal(node, name, **args)
        piece = arch.attention_head(d)
        if heads > 1:
            split, merge = (
                self.terminal(node, "clone", b=heads),
                self.terminal(node, "concat", dim=2, b=heads),
            )
            piece = arch.branching(split, piece, merge)
        if d != e:
            entries = [None] * len(entries)
        return [_Piece(piece, tuple(entries))], source

    def projection(self, value: fx.Node) -> tuple[fx.Node, nn.Linear, torch.Tensor]:
        """The linear that `value` (queries, keys or values) is a slice of, and which of its
        output rows feed each head: [heads, width]."""
        run = []
        node = value
        while self.is_layout(node):
            run.insert(0, node)
            node = self.inputs(node)[0]
        module = self.modules.get(node.target) if node.op == "call_module" else None
        if not isinstance(module, nn.Linear) or self.values[node].dim() != 3:
            raise self.fail(value, "queries, keys and values must be linear projections of tokens [B, N, D]")
        index = self.index_map(node, run)
        batch, tokens, features = self.values[node].shape
        heads = index.unsqueeze(1) if index.dim() == 3 else index  # [B, heads, N, width]
        b_at, n_at, f_at = heads // (tokens * features), heads // features % tokens, heads % features
        rows = f_at[0, :, 0, :]
        if not (
            torch.equal(b_at, torch.arange(batch).view(-1, 1, 1, 1).expand_as(b_at))
            and torch.equal(n_at, torch.arange(tokens).view(1, 1, -1, 1).expand_as(n_at))
            and torch.equal(f_at, rows[None, :, None, :].expand_as(f_at))
        ):
            raise self.fail(value, "the heads must be slices of the projection's features, per token")
        return node, module, rows

    # ------------------------------------------------------------- routing modules

    def assemble(self, items: list[_Piece | _Route]) -> list[_Piece]:
        """Pair routes into routing modules `R1 M R2`: im2col with the col2im that closes it (an
        image-to-tokens routing right after a col2im cancels it), a permute with the next one;
        an unpaired route wraps its neighbour, with identity on the other side."""
        items = _cancel(items)
        out: list[_Piece] = []
        i = 0
        while i < len(items):
            item = items[i]
            if isinstance(item, _Piece):
                out.append(item)
                i += 1
                continue
            if item.op.op == "col2im":
                raise self.fail(
                    item.node, "tokens folded back to an image without an im2col that opened the fold"
                )
            j = _partner(items, i)
            if j is not None:
                inner = _sequence(self.assemble(items[i + 1 : j]))
                owner = _common([self.owner(item.node), inner.owner, self.owner(items[j].node)])
                out.append(_Piece(arch.routing(item.op, inner.module, items[j].op), inner.entries, owner))
                i = j + 1
            elif item.op.op == "permute" and out:
                before = out.pop()
                owner = _common([before.owner, self.owner(item.node)])
                out.append(_Piece(arch.routing("identity", before.module, item.op), before.entries, owner))
                i += 1
            else:
                after = items[i + 1 : i + 2]
                inner = _sequence(self.assemble(after) if after and isinstance(after[0], _Piece) else [])
                owner = _common([self.owner(item.node), inner.owner])
                out.append(_Piece(arch.routing(item.op, inner.module, "identity"), inner.entries, owner))
                i += 1 + len(after if after and isinstance(after[0], _Piece) else [])
        return out


def _cancel(items: list[_Piece | _Route]) -> list[_Piece | _Route]:
    """Drop col2im followed by image-to-tokens (im2col 1×1): the pair changes nothing."""
    out: list[_Piece | _Route] = []
    for item in items:
        last = out[-1] if out else None
        if (
            isinstance(item, _Route)
            and item.op == arch.op("im2col", k=1, s=1, p=0)
            and isinstance(last, _Route)
            and last.op.op == "col2im"
        ):
            out.pop()
            continue
        out.append(item)
    return out


def _partner(items: list[_Piece | _Route], i: int) -> int | None:
    """The route that closes the one at i: the col2im of an im2col (nested pairs skipped), or
    the next permute."""
    opener = items[i].op.op  # type: ignore[union-attr]
    depth = 0
    for j in range(i + 1, len(items)):
        item = items[j]
        if not isinstance(item, _Route):
            continue
        if opener == "permute" and item.op.op == "permute":
            return j
        if opener == "im2col" and item.op.op == "im2col":
            depth += 1
        elif opener == "im2col" and item.op.op == "col2im":
            if depth == 0:
                return j
            depth -= 1
    return None


_MODULE_HANDLERS: tuple[tuple[type | tuple[type, ...], Callable[..., list[_Piece | _Route]]], ...] = (
    (nn.Conv2d, _Converter.conv),
    (nn.Linear, _Converter.linear),
    (nn.BatchNorm2d, _Converter.batch_norm),
    (nn.LayerNorm, _Converter.layer_norm),
    (nn.LeakyReLU, lambda self, node, module, value: self.activation(node, module.negative_slope)),
    (_ACTIVATION_MODULES, lambda self, node, module, value: self.activation(node, None)),
    (nn.Softmax, lambda self, node, module, value: self.softmax(node, module.dim, value)),
    (nn.Dropout, lambda self, node, module, value: self.dropout(node, module.p)),
    (
        _POOL_MODULES,
        lambda self, node, module, value: self.pool(
            node, type(module).__name__, value, module.kernel_size, module.stride, module.padding
        ),
    ),
)


# ----------------------------------------------------------------------------- helpers


def _square(value: Any) -> int:
    return int(value[0]) if isinstance(value, (tuple, list)) else int(value)


def _rows(bias: torch.Tensor | None, rows: torch.Tensor) -> torch.Tensor | None:
    return None if bias is None else bias[rows]


def _grid(grammar: Grammar) -> dict[str, set[tuple[tuple[str, Any], ...]]]:
    """Every operation the grammar names, with every argument combination it allows anywhere."""
    grid: dict[str, set[tuple[tuple[str, Any], ...]]] = {}

    def visit(item: Any) -> None:
        if isinstance(item, OpItem):
            grid.setdefault(item.name, set()).update(item.choices)
        elif isinstance(item, ParallelItem):
            for inner in item.items:
                visit(inner)
        elif isinstance(item, RepeatItem):
            visit(item.item)

    for rule in grammar.rules:
        for alternative in rule.alternatives:
            for item in alternative.items:
                visit(item)
    return grid


def _state_dict(
    tree: Node,
    input: FeatureState,
    classes: int | None,
    entries: tuple[_Entry, ...],
    head: nn.Linear | None,
) -> tuple[dict[str, torch.Tensor], list[str]]:
    """A state_dict for the compiled tree: the model's weights where the imported entries fit,
    a fresh initialisation elsewhere; and the names of the layers whose shapes did not fit."""
    if classes is None:
        built, prefix = compile_backbone(tree, input, lower=False), ""
    else:
        built, prefix = compile_network(tree, input, classes, lower=False), "backbone."
    backbone = built if classes is None else built.backbone
    state = built.state_dict()
    holders = [
        (name, m)
        for name, m in backbone.named_modules()
        if any(True for _ in m.parameters(recurse=False)) or any(True for _ in m.buffers(recurse=False))
    ]
    if len(holders) != len(entries):
        raise EinspaceError(f"internal: {len(entries)} imported layers for {len(holders)} compiled ones")
    mismatched = []
    for (name, _), entry in zip(holders, entries, strict=True):
        if entry is None:
            continue
        keys = {local: f"{prefix}{name}.{local}" if name else f"{prefix}{local}" for local in entry}
        if all(key in state and state[key].shape == entry[local].shape for local, key in keys.items()):
            for local, key in keys.items():
                state[key] = entry[local].detach().clone().to(state[key].dtype)
        else:
            mismatched.append(name)
    if head is not None:
        for local, tensor in _linear_entry(head.weight, head.bias).items():
            state[f"head.linear.{local}"] = tensor.to(state[f"head.linear.{local}"].dtype)
    return state, mismatched

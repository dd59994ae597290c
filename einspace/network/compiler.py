"""Compile a derivation tree into a torch module: the backbone, and a network with its head."""

from __future__ import annotations

import torch
from torch import nn

from einspace.checker import CheckedTree, check_tree
from einspace.errors import BuildError, EinspaceError
from einspace.grammar.model import Grammar
from einspace.network.lowering import lower as lower_modules
from einspace.network.memory import allocation_failed, require_memory
from einspace.ops.registry import OperationFailed, get_op
from einspace.state import FeatureState, Signal
from einspace.tree import Node, Nonterminal, Parallel, Path_, Repeat, Terminal, TreeVisitor, describe_path


class Branches(nn.ModuleList):
    """Applies module i to branch i of a list of tensors (a Parallel or Repeat node)."""

    def forward(self, xs: list[torch.Tensor]) -> list[torch.Tensor]:
        return [module(x) for module, x in zip(self, xs, strict=True)]


#: How a classification head pools the spatial or sequence axes (name -> the reduction over
#: them): the paper's mean, or the max (global max pooling, "max over time" for sequences: a
#: feature that fires anywhere counts, where the mean of position-wise features cannot tell two
#: orders of the same parts apart).
HEAD_POOLINGS = {"mean": torch.mean, "max": torch.amax}


class ClassificationHead(nn.Module):
    """The paper's head (App. B.1): pool away the spatial or sequence axes, then a linear layer.

    im features (C, H, W) are pooled over H and W; col features (S, D) over the sequence S
    (the usual token pooling; the paper's code averages over D instead, which pools each
    token's features rather than the tokens). `pooling` is one of HEAD_POOLINGS; the paper's
    is the mean.
    """

    def __init__(self, features: FeatureState, classes: int, pooling: str = "mean"):
        super().__init__()
        if classes < 1:
            raise EinspaceError(f"a classifier needs at least one class, got {classes}")
        check_head_pooling(pooling)
        image = len(features.shape) == 3
        #: The pooled axes, reduced where they lie: moving S last first (as an einops
        #: reduction does) hands the last layer a transposed gradient to copy.
        self.pooled = (2, 3) if image else (1,)
        self.pooling = pooling
        self.linear = nn.Linear(features.shape[0] if image else features.shape[-1], classes)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """The pooled features the linear layer reads."""
        return HEAD_POOLINGS[self.pooling](x, self.pooled)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(self.features(x))


def check_head_pooling(pooling: object) -> None:
    """Refuse a head pooling that is not one of HEAD_POOLINGS, naming those."""
    if pooling not in HEAD_POOLINGS:
        raise EinspaceError(f"head pooling must be one of {', '.join(HEAD_POOLINGS)}, got {pooling!r}")


class Network(nn.Module):
    """Backbone (the compiled tree) followed by a head."""

    def __init__(self, backbone: nn.Module, head: nn.Module):
        super().__init__()
        self.backbone = backbone
        self.head = head

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.backbone(x))


#: The attribute holding the node path of a terminal's module (see `terminal_modules`).
_NODE_PATH = "einspace_node_path"


def terminal_modules(network: nn.Module) -> dict[Path_, list[nn.Module]]:
    """The module of every terminal with one, by node path, in build order (a Repeat builds its
    subtree once per copy, so a path inside one has a module per copy). Call it before lowering:
    a fused kernel takes the place of the modules it adopts (`einspace.network.lowering`)."""
    found: dict[Path_, list[nn.Module]] = {}
    for module in network.modules():
        path = getattr(module, _NODE_PATH, None)
        if path is not None:
            found.setdefault(path, []).append(module)
    return found


def lower_network(network: Network) -> Network:
    """`network` with its backbone lowered, as `compile_network(..., lower=True)` builds it."""
    network.backbone = lower_modules(network.backbone)
    return network


class _Compiler(TreeVisitor[list[nn.Module]]):
    """Builds modules node by node, one handler per node kind returning the node's modules in
    order; nested sequences are flattened into one nn.Sequential."""

    def __init__(self, checked: CheckedTree):
        self.facts = checked.facts
        self.root = checked.tree

    def sequence(self, node: Node, path: Path_) -> nn.Module:
        modules = self.visit(node, path)
        if not modules:
            return nn.Identity()
        return modules[0] if len(modules) == 1 else nn.Sequential(*modules)

    def terminal(self, node: Terminal, path: Path_) -> list[nn.Module]:
        op = get_op(node.op)
        try:
            module = op.build(self.facts[path].input, dict(node.args))
        except Exception as exc:  # noqa: BLE001 - any failure is told at its node
            where = describe_path(self.root, path)
            if allocation_failed(exc):  # kept as it is, for callers that treat memory apart
                exc.add_note(f"while building operation {node.op!r} at node {where}")
                raise
            if isinstance(exc, EinspaceError):
                raise BuildError(f"operation {node.op!r} failed in build: {exc}", where) from exc
            raise BuildError(str(OperationFailed(op, "build", exc)), where) from exc
        if isinstance(module, nn.Identity):
            return []
        setattr(module, _NODE_PATH, path)
        return [module]

    def nonterminal(self, node: Nonterminal, path: Path_) -> list[nn.Module]:
        out: list[nn.Module] = []
        for i, child in enumerate(node.children):
            out.extend(self.visit(child, (*path, i)))
        return out

    def parallel(self, node: Parallel, path: Path_) -> list[nn.Module]:
        return [Branches(self.sequence(c, (*path, i)) for i, c in enumerate(node.children))]

    def repeat(self, node: Repeat, path: Path_) -> list[nn.Module]:
        # Each copy is built anew, so the b branches share structure but not weights.
        return [Branches(self.sequence(node.child, (*path, 0)) for _ in range(node.times))]


def compile_backbone(
    tree: Node | CheckedTree,
    input: FeatureState | Signal | None = None,
    grammar: Grammar | None = None,
    *,
    lower: bool = True,
) -> nn.Module:
    """The module a tree describes (checked first; a TreeError names a node that doesn't fit).

    `lower` swaps recognised runs of operations for fast kernels with the same parameters and
    results (einspace.network.lowering); `lower=False` runs every operation literally.
    """
    checked = tree if isinstance(tree, CheckedTree) else check_tree(tree, grammar, _need(input))
    return _build(checked, lower)


def compile_network(
    tree: Node | CheckedTree,
    input: FeatureState | Signal | None = None,
    classes: int = 10,
    grammar: Grammar | None = None,
    *,
    lower: bool = True,
    pooling: str = "mean",
) -> Network:
    """Backbone plus the classification head of App. B.1 (`lower` as in compile_backbone), pooling
    as `pooling` says (HEAD_POOLINGS)."""
    checked = tree if isinstance(tree, CheckedTree) else check_tree(tree, grammar, _need(input))
    check_head_pooling(pooling)
    return Network(_build(checked, lower), ClassificationHead(checked.output[0], classes, pooling))


def _build(checked: CheckedTree, lower: bool) -> nn.Module:
    # Refused before allocating: a sampled tree may describe more parameters than the machine holds.
    require_memory(
        {"float32 parameters": 4 * checked.params}, f"building a network of {checked.params:,} parameters"
    )
    module = _Compiler(checked).sequence(checked.tree, ())
    return lower_modules(module) if lower else module


def _need(input: FeatureState | Signal | None) -> FeatureState | Signal:
    if input is None:
        raise EinspaceError("compiling a tree needs the input state (shape and mode)")
    return input

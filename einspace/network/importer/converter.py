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

import itertools
from dataclasses import replace
from typing import Any

import torch
import torch.fx as fx
import torch.nn.functional as F
from torch import nn

from einspace.grammar.model import Grammar, OpItem, walk_items
from einspace.network.importer.graph import TracedModel
from einspace.network.importer.head import HeadRules
from einspace.network.importer.joins import JoinRules, stack_of_sum
from einspace.network.importer.layers import LayerRules, is_addcmul
from einspace.network.importer.pieces import Entry, Piece, Route, cancel, common_owner, partner, sequence
from einspace.network.importer.tokens import TokenRules
from einspace.seeds import architectures as arch
from einspace.state import FeatureState
from einspace.tree import Node, Terminal, format_terminal

__all__ = ["Converter", "fold_sizes", "grammar_grid"]


class Converter(HeadRules, LayerRules, JoinRules, TokenRules, TracedModel):
    """A traced model and the tree of the grammar built from it: the whole model, chains from an
    output back to its source, layouts and routing modules here; layers in `LayerRules`, joins in
    `JoinRules`, the class token in `TokenRules`."""

    def __init__(self, model: nn.Module, input: FeatureState, grammar: Grammar):
        super().__init__(model, input)
        self.grammar = grammar
        self.grid = grammar_grid(grammar)
        self.fold_sizes = fold_sizes(self.values, self.grid)
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

    def convert(self) -> tuple[Node, tuple[Entry, ...], nn.Linear | None, str]:
        """The tree, the weights of its layers in order, and the head's linear layer and pooling."""
        (output,) = (n for n in self.graph.nodes if n.op == "output")
        end = output.args[0]
        if not isinstance(end, fx.Node) or not isinstance(self.values.get(end), torch.Tensor):
            raise self.fail(output, "the model must return one tensor")
        head, end, pooled, pooling = self.head(end)
        body = sequence(self.assemble([*self.chain(end, self.placeholder), *pooled]))
        module = body.module
        if len(module.children) == 1:  # S derives no lone computation: pass on an identity after it
            module = arch.seq(module, arch.identity())
            body = Piece(module, body.entries)
        return arch.network(module), body.entries, head, pooling

    # ------------------------------------------------------------- from an output back to its source

    def chain(self, end: fx.Node, start: fx.Node) -> list[Piece | Route]:
        """The pieces and routes that compute `end` from `start`, in forward order."""
        items: list[Piece | Route] = []
        node = end
        while node is not start:
            if node not in self.idom or node.op == "placeholder":
                raise self.fail(node, "this value does not come from the branch's input")
            made, previous = self.step(node, start)
            owner = self.owner(node)
            items[:0] = [
                replace(m, owner=owner) if isinstance(m, Piece) and m.owner is None else m for m in made
            ]
            node = previous
        return items

    def step(self, node: fx.Node, start: fx.Node) -> tuple[list[Piece | Route], fx.Node]:
        """What one node (or a run of layout nodes, or an attention) contributes, and where the
        chain goes on (never past `start`)."""
        if self.first_token(node) and "first_token" in self.grid:
            return self.first_token_piece(node), self.inputs(node)[0]
        if self.is_layout(node):
            run = [node]
            while self.inputs(run[0])[0] is not start and self.in_layout_run(self.inputs(run[0])[0]):
                run.insert(0, self.inputs(run[0])[0])
            source = self.inputs(run[0])[0]
            if not isinstance(self.values[source], torch.Tensor):
                raise self.fail(source, f"{self.short(source)} has no counterpart in the grammar")
            if source.target is F.scaled_dot_product_attention:
                return self.attention(source, run)
            if source.target is F.unfold:  # the patches as the grammar's tokens, then the run
                value = self.values[source]
                tokens = torch.arange(value.numel()).reshape(value.shape).transpose(1, 2)
                opened = Route(self.unfold_grid(source), source)
                return [opened, *self.layout(source, run, tokens)], self.inputs(source)[0]
            return self.layout(source, run), source
        if node.target is F.scaled_dot_product_attention:
            return self.attention(node, [])
        gated = self.squeeze_excite(node) or self.class_token(node)
        if gated is not None:
            return gated
        if is_addcmul(node):  # before the joins: addcmul(shift, x, x) is refused, not branched
            return self.affine(node)
        inputs = self.inputs(node)
        if len(inputs) >= 2 or self.scaled_matmul(node) is not None or stack_of_sum(self, node) is not None:
            piece, fork = self.branching(node)
            return [piece], fork
        if len(inputs) != 1:
            raise self.fail(node, "expected one input tensor")
        return self.unary(node, inputs[0]), inputs[0]

    def layout(
        self, source: fx.Node, run: list[fx.Node], base: torch.Tensor | None = None
    ) -> list[Piece | Route]:
        """A run of reshapes and permutes as the grammar's routings, up to three in a row (the
        fewest that do it): permutes of the feature axes, image to tokens (im2col 1×1), tokens to
        image (col2im). `base` is where the grammar's view of `source` has each element (default:
        as it is)."""
        index = self.index_map(source, run)
        if base is None:
            base = torch.arange(self.values[source].numel()).reshape(self.values[source].shape)
        chosen = None  # on axes of size 1 several runs move the same elements: one whose folds exist
        for routes in _route_runs(base, index):
            routed, folds = _routed(base, routes, index.shape)
            if routed is not None and routed.shape == index.shape and torch.equal(routed, index):
                if folds <= self.fold_sizes:
                    chosen = routes
                    break
                chosen = routes if chosen is None else chosen
        if chosen is not None:
            return [Route(self.terminal(run[-1], name, **args), run[-1]) for name, args in chosen]
        raise self.fail(
            run[-1],
            f"this reshape ({tuple(base.shape)} to {tuple(index.shape)}) is not a routing of the grammar: "
            "a permute of the feature axes, image to tokens (flatten(2).transpose(1, 2)) or back",
        )

    # ------------------------------------------------------------- routing modules

    def assemble(self, items: list[Piece | Route], in_branch: bool = False) -> list[Piece]:
        """Pair routes into routing modules `R1 M R2`: im2col with the col2im that closes it (an
        image-to-tokens routing right after a col2im cancels it), a permute with the next one;
        an unpaired route wraps its neighbour, with identity on the other side."""
        items = cancel(items)
        for item in items:
            if isinstance(item, Piece) and item.channels_last is not None:
                raise self.fail(
                    item.channels_last,
                    "a layer norm over the last axis of an image is the grammar's channel_norm only "
                    "between x.permute(0, 2, 3, 1) and the permute back",
                )
        out: list[Piece] = []
        i = 0
        while i < len(items):
            item = items[i]
            if isinstance(item, Piece):
                out.append(item)
                i += 1
                continue
            if item.op.op == "col2im" and not out:
                if not in_branch:
                    raise self.fail(
                        item.node, "tokens folded back to an image without an im2col that opened the fold"
                    )
                out.append(
                    Piece(arch.routing("identity", arch.identity(), item.op), (), self.owner(item.node))
                )
                i += 1  # a branch folds tokens that an im2col before the branches made
                continue
            j = partner(items, i) if item.op.op != "col2im" else None
            if j is not None:
                inner = sequence(self.assemble(items[i + 1 : j]))
                owner = common_owner([self.owner(item.node), inner.owner, self.owner(items[j].node)])
                out.append(Piece(arch.routing(item.op, inner.module, items[j].op), inner.entries, owner))
                i = j + 1
            elif item.op.op in ("permute", "col2im") and out:  # closes what came before (branches)
                before = out.pop()
                owner = common_owner([before.owner, self.owner(item.node)])
                out.append(Piece(arch.routing("identity", before.module, item.op), before.entries, owner))
                i += 1
            else:
                after = items[i + 1 : i + 2]
                inner = sequence(self.assemble(after) if after and isinstance(after[0], Piece) else [])
                owner = common_owner([self.owner(item.node), inner.owner])
                out.append(Piece(arch.routing(item.op, inner.module, "identity"), inner.entries, owner))
                i += 1 + len(after if after and isinstance(after[0], Piece) else [])
        return out


#: A routing operation as the importer writes it: its name and arguments.
_RouteOp = tuple[str, dict[str, Any]]


def _route_runs(base: torch.Tensor, index: torch.Tensor) -> list[list[_RouteOp]]:
    """The runs of routing operations (up to three, shortest first: permutes of the feature axes,
    image to tokens, tokens to an image of the result's height and width) that may turn `base`'s
    layout into `index`'s: a run of reshapes may be several routings written as one."""
    runs: list[list[_RouteOp]] = [[]]
    frontier: list[tuple[list[_RouteOp], int]] = [([], base.dim())]
    for _ in range(3):
        grown = []
        for routes, rank in frontier:
            last = routes[-1][0] if routes else ""
            steps: list[tuple[_RouteOp, int]] = []  # a change of layout first, as export writes them
            if rank == 4 and last != "col2im":
                steps.append((("im2col", {"k": 1, "s": 1, "p": 0}), 3))
            if rank == 3 and index.dim() == 4 and last != "im2col":
                steps.append((("col2im", {}), 4))
            if last != "permute":
                orders = itertools.permutations(range(1, rank))
                steps += [(("permute", {"order": o}), rank) for o in orders if o != tuple(range(1, rank))]
            grown += [([*routes, step], after) for step, after in steps]
        runs += [routes for routes, _ in grown]
        frontier = grown
    return [r for r in runs if _rank_after(r, base.dim()) == index.dim()]


def _rank_after(routes: list[_RouteOp], rank: int) -> int:
    for name, _ in routes:
        rank = {"im2col": 3, "col2im": 4}.get(name, rank)
    return rank


def _routed(
    base: torch.Tensor, routes: list[_RouteOp], shape: torch.Size
) -> tuple[torch.Tensor | None, set[tuple[int, int]]]:
    """`base` moved by the routes, to compare with a result of `shape`, and the sizes its col2ims
    fold to; a col2im folds to the height and width that the permute after it (if any) makes
    `shape`'s. None: it cannot."""
    x, folds = base, set()
    for i, (name, args) in enumerate(routes):
        if name == "permute":
            x = x.permute(0, *args["order"])
        elif name == "im2col":
            x = x.flatten(2).transpose(1, 2)
        else:
            order = routes[i + 1][1]["order"] if i + 1 < len(routes) else (1, 2, 3)
            folded = {axis: shape[k + 1] for k, axis in enumerate(order)}
            if folded[2] * folded[3] != x.shape[1]:
                return None, folds
            folds.add((folded[2], folded[3]))
            x = x.transpose(1, 2).unflatten(2, (folded[2], folded[3]))
    return x, folds


def fold_sizes(
    values: dict[fx.Node, Any], grid: dict[str, set[tuple[tuple[str, Any], ...]]]
) -> set[tuple[int, int]]:
    """The (height, width) an im2col of the grid can fold to anywhere in the model: every image's,
    and what each im2col of the grid makes of it. A col2im folds back to its im2col's: a run of
    reshapes whose col2im folds to another size is not the tree's."""
    images = {tuple(v.shape[2:]) for v in values.values() if isinstance(v, torch.Tensor) and v.dim() == 4}
    sizes = set(images)
    for args in grid.get("im2col", ()):
        k, s, p = (dict(args)[a] for a in ("k", "s", "p"))
        sizes |= {
            ((h + 2 * p - k) // s + 1, (w + 2 * p - k) // s + 1) for h, w in images if min(h, w) + 2 * p >= k
        }
    return sizes


def grammar_grid(grammar: Grammar) -> dict[str, set[tuple[tuple[str, Any], ...]]]:
    """Every operation the grammar names, with every argument combination it allows anywhere."""
    grid: dict[str, set[tuple[tuple[str, Any], ...]]] = {}
    for rule in grammar.rules:
        for alternative in rule.alternatives:
            for item in walk_items(alternative.items):
                if isinstance(item, OpItem):
                    grid.setdefault(item.name, set()).update(item.choices)
    return grid

"""How the importer turns joins of several values into branching modules: sums, products,
concatenations, and `F.scaled_dot_product_attention` with its projections as attention heads;
and the one join that is a terminal, squeeze-and-excitation (x times a gate computed from x).

`JoinRules` is a part of `Converter` (converter.py), which provides the traced model, `terminal`,
`use`, `_width`, and `chain` and `assemble` for the branches.
"""

from __future__ import annotations

import math
import operator

import torch
import torch.fx as fx
import torch.nn.functional as F
from torch import nn

from einspace.network.importer.graph import TracedModel
from einspace.network.importer.layers import activation_name, unscaled
from einspace.network.importer.pieces import Piece, Route, common_owner, sequence
from einspace.network.importer.weights import linear_entry, rows_of
from einspace.ops.zoo import SQUEEZE_ACTIVATIONS, squeezed
from einspace.seeds import architectures as arch
from einspace.tree import Terminal

__all__ = ["JoinRules", "stack_of_sum"]


class JoinRules:
    """Joins: a fork, one branch per joined value, and the aggregation; attention heads."""

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

    def branching(self, node: fx.Node) -> tuple[Piece, fx.Node]:
        """A join of several values: clone where they part (the fork, returned), one branch each,
        then the aggregation."""
        matmul, stack = self.scaled_matmul(node), stack_of_sum(self, node)
        joined = matmul or stack or node
        inputs = self.inputs(joined)
        target = joined.target
        if matmul is not None:
            merge = self.terminal(node, "matmul", scaled=True)
        elif stack is not None:
            merge = self.terminal(node, "add")
        elif _is_add(joined):
            if len(inputs) != 2 or not unscaled(joined):
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
        if stack is None and merge.op == "add" and len(summed := self.summands(node)) > 2:
            used, made = dict(self.used), {key: list(nodes) for key, nodes in self.substitutions.items()}
            piece, start, repeated = self._join(node, fork, summed, merge)
            if repeated:  # the grammar's b > 2 branches repeat one derivation
                return piece, start
            self.used, self.substitutions = used, made  # as sums of two, then
        piece, start, _ = self._join(node, fork, inputs, merge)
        return piece, start

    def _join(
        self, node: fx.Node, fork: fx.Node, inputs: list[fx.Node], merge: Terminal
    ) -> tuple[Piece, fx.Node, bool]:
        """The branching module of `inputs` joined by `merge`, where the chain goes on, and whether
        its branches are one derivation."""
        parts = self.split_parts(node, fork, inputs)
        if parts is None:
            split, starts = self.terminal(node, "clone", b=len(inputs)), [(v, fork) for v in inputs]
        else:  # one part of a chunk per branch: the chain goes on before the chunk
            split, starts = parts
            fork = self.inputs(fork)[0]
        branches = [
            sequence(self.assemble(self.chain(value, start), in_branch=True)) for value, start in starts
        ]
        if merge.op == "add" and split.op == "clone":  # shortcuts last, as residual() writes them
            branches.sort(key=lambda branch: branch.module == arch.identity())
        modules = [branch.module for branch in branches]
        repeated = all(m == modules[0] for m in modules)
        shared = modules[0] if len(modules) != 2 and repeated else modules
        entries = tuple(e for branch in branches for e in branch.entries)
        owner = common_owner([self.owner(node), *(branch.owner for branch in branches)])
        return Piece(arch.branching(split, shared, merge), entries, owner), fork, repeated

    def summands(self, node: fx.Node) -> list[fx.Node]:
        """The values a sum adds, the sums written in the same code (`x1 + x2 + x3 + x4`: each
        used once, the values parting where all do) opened when the grammar splits into that many
        branches (clone(4)); its two terms otherwise."""
        found, pending = [], self.inputs(node)
        while pending:
            value = pending.pop(0)
            inner = _is_add(value) and unscaled(value) and len(self.inputs(value)) == 2
            here = inner and self.owner(value) == self.owner(node) and self.idom[value] is self.idom[node]
            if here and len(value.users) == 1:
                pending[:0] = self.inputs(value)
            else:
                found.append(value)
        counts = {dict(a)["b"] for a in self.grid.get("clone", ())}
        return found if len(found) in counts else self.inputs(node)

    def split_parts(
        self, node: fx.Node, fork: fx.Node, inputs: list[fx.Node]
    ) -> tuple[Terminal, list[tuple[fx.Node, fx.Node]]] | None:
        """When the joined values part at a chunk (`x.chunk(b, dim)`, or a split into equal
        sizes), one part per value: the grammar's group_dim and, in the parts' order, each joined
        value with its part (a sum may add them in any order); None when they part at one value
        (a clone)."""
        if not (fork.target in ("chunk", "split", torch.chunk, torch.split) and len(self.inputs(fork)) == 1):
            return None
        whole, parts = self.values[self.inputs(fork)[0]], self.values[fork]
        dims = [d for d in range(1, whole.dim()) if parts[0].shape[d] != whole.shape[d]]
        readers = [u for u in fork.users if u.target is operator.getitem and isinstance(u.args[1], int)]
        starts = []
        for value in inputs:  # the part each joined value comes from
            found = [u for u in readers if _dominates(self.idom, u, value)]
            starts.append(found[0] if len(found) == 1 else None)
        order = [None if s is None else s.args[1] for s in starts]
        b = len(parts)
        equal = len(dims) == 1 and all(p.shape == parts[0].shape for p in parts)
        if not equal or sorted(o for o in order if o is not None) != list(range(b)) or len(inputs) != b:
            raise self.fail(
                fork,
                "the grammar's group_dim splits one feature axis into equal parts, one per branch, "
                "each read once and joined in their order",
            )
        if order != list(range(b)) and node.target not in (operator.add, torch.add, "add"):
            raise self.fail(node, "the parts of a split must be joined in their order")
        ordered = sorted(zip(order, inputs, starts, strict=True), key=lambda t: t[0])
        return self.terminal(fork, "group_dim", dim=dims[0], b=b), [(v, s) for _, v, s in ordered]

    def squeeze_excite(self, node: fx.Node) -> tuple[list[Piece | Route], fx.Node] | None:
        """`x * gate(x)` where the gate is two layers (1×1 convolutions or linears) with one
        activation between, read off the mean of x over space: the grammar's squeeze_excite when
        it computes the same values (checked, as the head's mean is); None when `node` is not of
        this form, a located error when it is but the grammar cannot say it."""
        inputs = self.inputs(node)
        method = node.op == "call_method" and node.target == "mul"
        product = method or node.target in (operator.mul, torch.mul)
        if "squeeze_excite" not in self.grid or not product or len(inputs) != 2:
            return None
        if self.idom[node] not in inputs:
            return None
        fork = self.idom[node]
        run, at = [], inputs[1] if inputs[0] is fork else inputs[0]
        while at is not fork:
            before = self.inputs(at)
            if at.op == "call_method" and at.target in ("expand", "expand_as"):  # broadcast as `*` does
                before = before[:1]
            if len(before) != 1:
                return None
            run.insert(0, at)
            at = before[0]
        kinds = (nn.Conv2d, nn.Linear)
        layers = [n for n in run if n.op == "call_module" and isinstance(self.modules[n.target], kinds)]
        acts = [a for a in map(activation_name, run, [self.modules] * len(run)) if a is not None]
        x = self.values[fork]
        if len(layers) != 2 or len(acts) != 1 or x.dim() != 4:
            return None
        c = x.shape[1]
        (w1, b1), (w2, b2) = ((self.modules[n.target].weight, self.modules[n.target].bias) for n in layers)
        d = w1.shape[0]
        form = "x · sigmoid(fc2(act(fc1(mean of x over space)))), act relu or silu, 1×1 layers C → C/r → C"
        if w1.numel() != d * c or w2.numel() != c * d or acts[0] not in SQUEEZE_ACTIVATIONS:
            raise self.fail(node, f"a gate of x is in the grammar only as squeeze-and-excitation, {form}")
        w1, w2 = w1.reshape(d, c, 1, 1), w2.reshape(c, d, 1, 1)
        act = F.relu if acts[0] == "relu" else F.silu
        gate = torch.sigmoid(F.conv2d(act(F.conv2d(x.mean((2, 3), keepdim=True), w1, b1)), w2, b2))
        if not torch.allclose(x * gate, self.values[node], rtol=1e-4, atol=1e-6):
            raise self.fail(node, f"a gate of x is in the grammar only as squeeze-and-excitation, {form}")
        ratios = sorted({dict(a)["r"] for a in self.grid["squeeze_excite"] if dict(a)["act"] == acts[0]})
        r = next((r for r in ratios if c % r == 0 and squeezed(c, r) == d), None)
        if r is None:
            raise self.fail(
                node,
                f"a squeeze of {c} channels to {d} is not C / r for the grammar's r in {ratios} "
                f"(with {acts[0]})",
            )
        for layer in layers:
            self.use(layer)
        self.terminal(node, "squeeze_excite", r=r, act=acts[0])
        entries = (linear_entry(w1, b1), linear_entry(w2, b2))
        return [Piece(arch.computation("squeeze_excite", r=r, act=acts[0]), entries)], fork

    def attention(self, node: fx.Node, run: list[fx.Node]) -> tuple[list[Piece | Route], fx.Node]:
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
                entries.append(linear_entry(module.weight[head_rows[h]], rows_of(module.bias, head_rows[h])))
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
        return [Piece(piece, tuple(entries))], source

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


def _is_add(node: fx.Node) -> bool:
    return node.target in (operator.add, torch.add) or (node.op == "call_method" and node.target == "add")


def stack_of_sum(traced: TracedModel, node: fx.Node) -> fx.Node | None:
    """The stack of `torch.stack([...]).sum(0)` (a sum of several values written as one, as
    export writes the sum of linear branches)."""
    dim = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim")
    if not (node.op == "call_method" and node.target == "sum" and dim == 0 and len(traced.inputs(node)) == 1):
        return None
    (stack,) = traced.inputs(node)
    at = stack.args[1] if len(stack.args) > 1 else stack.kwargs.get("dim", 0)
    return stack if stack.target is torch.stack and at == 0 and len(stack.users) == 1 else None


def _dominates(idom: dict[fx.Node, fx.Node], start: fx.Node, value: fx.Node) -> bool:
    """Whether `start` is on every path from the input to `value`."""
    node = value
    while node is not start and node in idom and idom[node] is not node:
        node = idom[node]
    return node is start

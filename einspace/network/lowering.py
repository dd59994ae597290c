"""Lowering: replace runs of literal modules (im2col·linear·col2im, attention, …) with fast kernels.

The paper builds every network from fundamental operations: a convolution is im2col → linear →
col2im, attention is clone → linear branches → matmul → softmax → matmul. Run literally they are
slow and memory-hungry (an unfold materialises k² copies of its input; the scores are scaled
and normalised in separate passes). `lower` rewrites a compiled module in place so that these
runs call `F.conv2d` and `F.scaled_dot_product_attention`, with identical results.

Why on modules rather than on the tree: the compiler has already normalised away everything
the grammar lets one computation be written as (M → M M splits, single-child chains, identity
routing and computation), so a pattern is simply a contiguous run of modules in one
`nn.Sequential`, with branches as `Branches`; matching the tree would have to re-implement that
normalisation. The modules also carry what a kernel needs (kernel sizes, folds, scales) and
nothing of the tree changes: its text, statistics and analytic costs are computed before and
without lowering.

The contract that makes lowering an implementation detail: a kernel takes over the slot of the
module that held the parameters of its run (the linear, or the `Branches`) and adopts that
module's parameters, buffers and submodules under the same names; the other slots of the run
become parameter-less `Folded` markers. So the lowered network has the same parameters, in the
same order, under the same `state_dict` keys as the literal one, and
`lowered.load_state_dict(literal.state_dict())` works both ways. Anything not recognised runs
literally.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from einspace.ops import _modules

__all__ = [
    "Attention",
    "AttentionHead",
    "BranchLinear",
    "Conv",
    "Folded",
    "Kernel",
    "lower",
    "lowered_kernels",
]


class Folded(nn.Module):
    """A slot whose operation a neighbouring kernel performs: passes its input on, holds nothing."""

    def __init__(self, op: str):
        super().__init__()
        self.op = op

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x

    def extra_repr(self) -> str:
        return f"{self.op}, folded into a kernel"


class Kernel(nn.Module):
    """A fused kernel. It adopts the parameters, buffers and submodules of the slot it takes over,
    under their names there, so that `state_dict` keys and parameter order stay those of the
    literal network."""

    kind = "kernel"

    def adopt(self, original: nn.Module) -> None:
        for name, param in original.named_parameters(recurse=False):
            self.register_parameter(name, param)
        for name, buffer in original.named_buffers(recurse=False):
            persistent = name not in original._non_persistent_buffers_set
            self.register_buffer(name, buffer, persistent=persistent)
        for name, child in original.named_children():
            self.add_module(name, child)


def _onednn_strided_pointwise_bug(x: torch.Tensor) -> bool:
    """Where torch 2.13's oneDNN mishandles a strided 1x1 convolution: CPU, channels-last, 2-5
    channels seen crashing (16 and 32 not; below 16 is avoided)."""
    return x.device.type == "cpu" and x.shape[1] < 16 and x.is_contiguous(memory_format=torch.channels_last)


class _ChannelsLastCast(torch.autograd.Function):
    """A row-major weight as a channels-last one of another dtype, in one copy each way: autograd's
    own cast would return the gradient in the new layout, for the reshape to the linear's
    [d, C·k·k] parameter to copy again."""

    @staticmethod
    def forward(ctx: Any, weight: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        ctx.dtype = weight.dtype
        return weight.to(dtype=dtype, memory_format=torch.channels_last)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad.to(dtype=ctx.dtype, memory_format=torch.contiguous_format), None


def _in_layout_of(weight: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """The [d, C, k, k] view of a linear's weight, channels-last (and in autocast's dtype, one
    copy) when x is: a convolution otherwise copies a row-major weight to x's layout in its
    forward and its backward -- copies a hand-written channels-last network never makes."""
    if x.is_contiguous() or not x.is_contiguous(memory_format=torch.channels_last):
        return weight
    kind = x.device.type
    cast = torch.is_autocast_enabled(kind) and weight.dtype != torch.float64  # autocast's rule
    return _ChannelsLastCast.apply(weight, torch.get_autocast_dtype(kind) if cast else weight.dtype)


class Conv(Kernel):
    """im2col(k, s, p) → linear(d) [→ col2im] without the unfold.

    With the col2im (image out) it is one `F.conv2d`: the linear's weight [d, C·k·k] viewed as
    [d, C, k, k] is the convolution's, since unfold orders its features (c, ki, kj).
    Without it (a patch embedding that stays in col mode, tokens [B, h·w, d] in unfold's
    row-major order of positions) the fastest form was measured on CPU (benchmarks/): for
    non-overlapping patches (k = s, p = 0) the patches are a reshape and permute of the input
    followed by the linear, which beats a convolution whose output must then be transposed
    (2-3x for a 3-channel image); otherwise a convolution on a channels-last copy of the
    input, whose output then is already the tokens, contiguous.
    """

    def __init__(self, im2col: _modules.Im2Col, linear: nn.Linear, fold: bool):
        super().__init__()
        self.k, self.s, self.p, self.fold = im2col.k, im2col.s, im2col.p, fold
        self.adopt(linear)
        self.kind = "conv" if fold else "patch_embed"
        self.patches = not fold and self.k == self.s and self.p == 0 and self.k > 1

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, c, height, width = x.shape
        k, s, p = self.k, self.s, self.p
        if self.patches:
            h, w = height // k, width // k  # unfold drops the rows and columns that don't fit
            x = x[:, :, : h * k, : w * k].reshape(b, c, h, k, w, k).permute(0, 2, 4, 1, 3, 5)
            return F.linear(x.reshape(b, h * w, c * k * k), self.weight, self.bias)
        given = x  # the weight follows the layout the caller gave (a patch embedding's own is no cue)
        if not self.fold:  # a channels-last input makes the output the tokens, contiguous
            x = x.contiguous(memory_format=torch.channels_last)
        if k == 1 and s > 1 and _onednn_strided_pointwise_bug(x):
            # A 1x1 kernel reads every s-th pixel of the padded input only: take those, then
            # convolve with stride 1 -- the same numbers. The strided 1x1 convolution itself is
            # avoided because oneDNN (torch 2.13, CPU) corrupts the heap in its backward pass on a
            # channels-last input with few channels (tests/test_lowering.py has the cases).
            x, s, p = (F.pad(x, (p, p, p, p)) if p else x)[..., ::s, ::s], 1, 0
            if not self.fold:
                x = x.contiguous(memory_format=torch.channels_last)
        weight = _in_layout_of(self.weight.reshape(self.weight.shape[0], c, k, k), x if self.fold else given)
        out = F.conv2d(x, weight, self.bias, s, p)
        return out if self.fold else out.flatten(2).transpose(1, 2)

    def extra_repr(self) -> str:
        how = "image" if self.fold else "tokens, " + ("patches" if self.patches else "channels-last conv")
        return f"{self.weight.shape[1]}→{self.weight.shape[0]}, k={self.k}, s={self.s}, p={self.p}, to {how}"


class BranchLinear(Kernel):
    """clone(b) → b linears (one per branch) → concat or add, as one matrix product.

    Concatenating along the feature axis is one linear with the weights stacked; adding is one
    linear with the weights summed (the gradient of a sum reaches every summand unchanged).
    col mode may also concatenate along the sequence axis (equal widths): the same product,
    then its b blocks moved along the sequence.
    """

    kind = "branch_linear"

    def __init__(self, branches: nn.ModuleList, linears: list[nn.Linear], combine: str):
        super().__init__()
        self.adopt(branches)
        self._linears = tuple(linears)
        self.combine = combine
        self.image = isinstance(linears[0], _modules.ChannelLinear)

    @property
    def linears(self) -> tuple[nn.Linear, ...]:
        """The branches' linears, in branch order (einspace.network.export writes them out)."""
        return self._linears

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weights = [m.weight for m in self._linears]
        biases = [m.bias for m in self._linears]
        if self.combine == "add":
            weight, bias = torch.stack(weights).sum(0), torch.stack(biases).sum(0)
        else:
            weight, bias = torch.cat(weights), torch.cat(biases)
        if self.image:
            return F.conv2d(x, weight[:, :, None, None], bias)
        out = F.linear(x, weight, bias)
        if self.combine != "sequence":
            return out
        b, n = len(self._linears), out.shape[1]
        return out.unflatten(-1, (b, -1)).transpose(1, 2).reshape(out.shape[0], b * n, -1)

    def extra_repr(self) -> str:
        return f"b={len(self._linears)}, combine={self.combine}"


class AttentionHead:
    """The parts of one attention computation, found in the literal modules.

    q = query(pre(x)), kᵀ = key(pre(x)), v = value(x); out = softmax(q kᵀ · scale) v · outer.
    `linears` holds the plain query, key and value linears when the branches are exactly
    those (the key followed by its transpose): then all projections are one matrix product.
    """

    def __init__(
        self,
        pre: list[nn.Module],
        query: nn.Module,
        key: nn.Module,
        value: nn.Module,
        scale: float,
        outer: float | None,
    ):
        self.pre, self.query, self.key, self.value = pre, query, key, value
        self.scale, self.outer = scale, outer
        self.linears = _plain_projections(pre, query, key, value)


class Attention(Kernel):
    """clone(2) → [clone(2) → [q, k → transpose] → matmul(scaled) → softmax, v] → matmul, as
    `F.scaled_dot_product_attention`; with a leading clone(h) and a concat or add over h such
    heads, one batched computation with a head axis.

    The scale is what the literal matmul applies: 1/sqrt(the query's width) when scaled, else 1;
    an outer scaled matmul multiplies the result by 1/sqrt(the number of keys).
    """

    def __init__(self, slot: nn.Module, heads: list[AttentionHead], combine: str | None):
        super().__init__()
        self.adopt(slot)
        self._heads = tuple(heads)
        self.combine = combine
        self.kind = "attention" if combine is None else "multi_head_attention"

    @property
    def heads(self) -> tuple[AttentionHead, ...]:
        """The heads' parts, in branch order (einspace.network.export writes them out)."""
        return self._heads

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self._heads[0].linears is not None and x.dim() == 3:
            return self._fused(x)
        return self._one(self._heads[0], x)  # one head (several are matched only when fusable)

    def _one(self, head: AttentionHead, x: torch.Tensor) -> torch.Tensor:
        s = x
        for module in head.pre:
            s = module(s)
        q, k, v = head.query(s), head.key(s).transpose(-2, -1), head.value(x)
        out = F.scaled_dot_product_attention(q, k, v, scale=head.scale)
        return out if head.outer is None else out * head.outer

    def _fused(self, x: torch.Tensor) -> torch.Tensor:
        """All heads' projections in one linear, then attention with a head axis."""
        h = len(self._heads)
        parts = [[head.linears[i] for head in self._heads] for i in range(3)]  # type: ignore[index]
        weight = torch.cat([m.weight for group in parts for m in group])
        bias = torch.cat([m.bias for group in parts for m in group])
        widths = [h * group[0].out_features for group in parts]
        q, k, v = (
            t.unflatten(-1, (h, -1)).transpose(1, 2)  # [B, L, h·e] -> [B, h, L, e]
            for t in F.linear(x, weight, bias).split(widths, dim=-1)
        )
        first = self._heads[0]
        out = F.scaled_dot_product_attention(q, k, v, scale=first.scale)
        if first.outer is not None:
            out = out * first.outer
        if self.combine is None:
            return out[:, 0]
        if self.combine == "add":
            return out.sum(1)
        if self.combine == "sequence":
            return out.flatten(1, 2)
        return out.transpose(1, 2).flatten(2)

    def extra_repr(self) -> str:
        fused = "one projection" if self._heads[0].linears is not None else "separate projections"
        return f"heads={len(self._heads)}, combine={self.combine}, {fused}"


# ---------------------------------------------------------------- matching


def _plain_linear(module: nn.Module) -> bool:
    return type(module) is nn.Linear and module.bias is not None


def _swap(module: nn.Module) -> bool:
    """A permute that swaps the last two axes (col order (2, 1), im order (1, 3, 2)): a key's transpose."""
    return isinstance(module, _modules.Permute) and module.swaps_last_two


def _parts(module: nn.Module) -> list[nn.Module]:
    """A branch as its list of modules, markers left out (an identity branch is empty)."""
    if isinstance(module, nn.Sequential):
        return [m for m in module if not isinstance(m, Folded)]
    return [] if isinstance(module, nn.Identity) else [module]


def _plain_projections(
    pre: list[nn.Module], query: nn.Module, key: nn.Module, value: nn.Module
) -> tuple[nn.Linear, nn.Linear, nn.Linear] | None:
    keys = _parts(key)
    if pre or len(keys) != 2 or not _swap(keys[1]):
        return None
    q, k, v = query, keys[0], value
    if not all(map(_plain_linear, (q, k, v))):
        return None
    if len({q.in_features, k.in_features, v.in_features}) != 1:
        return None
    return q, k, v  # type: ignore[return-value]


def _branching(modules: list[nn.Module], i: int, b: int | None = None) -> nn.ModuleList | None:
    """The Branches at slot i+1 when slot i is a clone (into b branches, if given)."""
    if i + 2 >= len(modules) or not isinstance(modules[i], _modules.Clone):
        return None
    if b is not None and modules[i].b != b:
        return None
    branches = modules[i + 1]
    if not isinstance(branches, nn.ModuleList) or len(branches) != modules[i].b:
        return None
    return branches


def _match_conv(modules: list[nn.Module], i: int) -> tuple[int, Kernel] | None:
    if i + 1 >= len(modules) or not isinstance(modules[i], _modules.Im2Col):
        return None
    linear = modules[i + 1]
    if not _plain_linear(linear):
        return None
    after = modules[i + 2] if i + 2 < len(modules) else None
    fold = isinstance(after, _modules.Col2Im)
    return (3 if fold else 2), Conv(modules[i], linear, fold)


def _match_branch_linear(modules: list[nn.Module], i: int) -> tuple[int, Kernel] | None:
    branches = _branching(modules, i)
    if branches is None:
        return None
    linears = list(branches)
    kinds = {type(m) for m in linears}
    if len(kinds) != 1 or kinds.pop() not in (nn.Linear, _modules.ChannelLinear):
        return None
    if len({m.in_features for m in linears}) != 1 or any(m.bias is None for m in linears):
        return None
    image = isinstance(linears[0], _modules.ChannelLinear)
    aggregate = modules[i + 2]
    if isinstance(aggregate, _modules.Add):
        combine = "add"
    elif isinstance(aggregate, _modules.Concat) and aggregate.dim == 1:
        combine = "features" if image else "sequence"  # im: channels; col: the sequence
    elif isinstance(aggregate, _modules.Concat) and aggregate.dim == 2 and not image:
        combine = "features"
    else:
        return None
    return 3, BranchLinear(branches, linears, combine)


def _scores(module: nn.Module) -> tuple[list[nn.Module], nn.Module, nn.Module, float] | None:
    """[pre…, clone(2), Branches(q, k), matmul, softmax(-1)]: (pre, q, k, scale)."""
    parts = _parts(module)
    if len(parts) < 4:
        return None
    pre, (clone, branches, matmul, softmax) = parts[:-4], parts[-4:]
    if not (isinstance(clone, _modules.Clone) and clone.b == 2 and isinstance(branches, nn.ModuleList)):
        return None
    if len(branches) != 2 or not isinstance(matmul, _modules.MatMul):
        return None
    if not (isinstance(softmax, nn.Softmax) and softmax.dim in (-1, None)):
        return None
    scale = 1.0 if matmul.scale is None else matmul.scale
    return pre, branches[0], branches[1], scale


def _match_attention(modules: list[nn.Module], i: int) -> tuple[int, Kernel] | None:
    branches = _branching(modules, i, 2)
    if branches is None or not isinstance(modules[i + 2], _modules.MatMul):
        return None
    scores = _scores(branches[0])
    if scores is None:
        return None
    pre, query, key, scale = scores
    value = branches[1]
    head = AttentionHead(pre, query, key, value, scale, modules[i + 2].scale)
    return 3, Attention(branches, [head], None)


def _match_heads(modules: list[nn.Module], i: int) -> tuple[int, Kernel] | None:
    """clone(h) → h attention kernels with plain projections of one shape → concat or add."""
    branches = _branching(modules, i)
    if branches is None:
        return None
    kernels = [_parts(m) for m in branches]
    if not all(len(p) == 1 and isinstance(p[0], Attention) and p[0].combine is None for p in kernels):
        return None
    heads = [p[0]._heads[0] for p in kernels]
    if any(h.linears is None for h in heads):
        return None
    shapes = {tuple(tuple(m.weight.shape) for m in h.linears) for h in heads}  # type: ignore[union-attr]
    if len(shapes) != 1 or len({(h.scale, h.outer) for h in heads}) != 1:
        return None
    aggregate = modules[i + 2]
    if isinstance(aggregate, _modules.Add):
        combine = "add"
    elif isinstance(aggregate, _modules.Concat) and aggregate.dim in (1, 2):
        combine = "sequence" if aggregate.dim == 1 else "features"
    else:
        return None
    return 3, Attention(branches, heads, combine)


_MATCHERS = (_match_conv, _match_heads, _match_attention, _match_branch_linear)


def _lower_sequence(sequence: nn.Sequential) -> None:
    modules = list(sequence)
    i = 0
    while i < len(modules):
        for matcher in _MATCHERS:
            found = matcher(modules, i)
            if found is not None:
                break
        else:
            i += 1
            continue
        span, kernel = found
        for j in range(span):  # every kernel takes over slot i + 1 (the linear or the Branches)
            module = kernel if j == 1 else Folded(_describe(modules[i + j]))
            sequence[i + j] = module
            modules[i + j] = module
        i += span


def lower(module: nn.Module) -> nn.Module:
    """Lower `module` in place (children first, so heads are found inside multi-head runs)."""
    for child in module.children():
        lower(child)
    if isinstance(module, nn.Sequential):
        _lower_sequence(module)
    return module


def lowered_kernels(module: nn.Module) -> Counter[str]:
    """How many kernels of each kind a lowered module runs (heads inside a multi-head kernel
    are not counted again)."""
    counts: Counter[str] = Counter()
    stack = [module]
    while stack:
        m = stack.pop()
        if isinstance(m, Kernel):
            counts[m.kind] += 1
            if isinstance(m, Attention) and m.combine is not None:
                continue
        stack.extend(m.children())
    return counts


def _describe(module: nn.Module) -> str:
    extra = module.extra_repr()
    return type(module).__name__.lower() + (f"({extra})" if extra else "")

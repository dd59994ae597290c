"""Build derivation trees of the einspace grammar from readable parts, and the paper's seed networks.

A seed is written as Python that reads like the network (`conv`, `residual`, `attention`, ...)
and yields an ordinary derivation tree, so nobody writes or reviews thousands of brackets by
hand. Every helper returns a module (an `M` node) of `grammars/einspace.pcfg`; `network` turns
the outermost module into the root `S`. Only what that grammar derives is produced: linear
widths are powers of two from 16 to 2048, im2col takes the (k, s, p) of its grid, branching
factors are 2, 4 or 8. `check_tree(tree, grammar, input)` confirms a built tree.

    python -m einspace.seeds.architectures grammars/seeds     # (re)write the bundled seed files
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from einspace.errors import EinspaceError
from einspace.ops.registry import canonical_args, get_op
from einspace.tree import Nonterminal, Parallel, Repeat, Terminal, pretty

#: A module of the grammar: an `M` node.
Module = Nonterminal

__all__ = [
    "SEEDS",
    "Module",
    "Seed",
    "act",
    "attention_head",
    "branching",
    "computation",
    "conv",
    "densenet",
    "identity",
    "linear",
    "mlp",
    "mlp_mixer",
    "multi_head_attention",
    "network",
    "norm",
    "op",
    "patch_embed",
    "pos_enc",
    "residual",
    "resnet",
    "resnet18",
    "resnet_small",
    "routing",
    "seed_text",
    "seq",
    "softmax",
    "swap_axes",
    "transformer_layer",
    "vit",
    "wide_resnet",
    "wide_resnet16_4",
    "write_seeds",
]


# ----------------------------------------------------------------------------- grammar modules


def op(name: str, **args: Any) -> Terminal:
    """A terminal operation, its arguments checked and put in the order the operation declares
    (the order the grammar's argument grids use, so the tree matches them)."""
    return Terminal(name, canonical_args(get_op(name), args))


def computation(name: str, **args: Any) -> Module:
    """A computation module `(M (C op))`: one computation function."""
    return Nonterminal("M", (Nonterminal("C", (op(name, **args),)),))


def linear(d: int) -> Module:
    """A fully connected layer to d features (on channels in im mode, on D in col mode)."""
    return computation("linear", d=d)


def norm() -> Module:
    """BatchNorm in im mode, LayerNorm in col mode."""
    return computation("norm")


def act() -> Module:
    """The grammar's activation, leaky ReLU (slope 0.01)."""
    return computation("leaky_relu")


def softmax() -> Module:
    """Softmax over the last axis."""
    return computation("softmax")


def pos_enc() -> Module:
    """A learnable positional encoding of the feature shape, added."""
    return computation("pos_enc")


def identity() -> Module:
    """Pass the input on (the usual shortcut of a residual connection)."""
    return computation("identity")


def _routing_op(fn: Terminal | str) -> Terminal:
    return op(fn) if isinstance(fn, str) else fn


def routing(first: Terminal | str, inner: Module, last: Terminal | str) -> Module:
    """A routing module `(M (R1 first) inner (R2 last))`; strings name argument-free operations."""
    return Nonterminal(
        "M",
        (Nonterminal("R1", (_routing_op(first),)), inner, Nonterminal("R2", (_routing_op(last),))),
    )


def branching(split: Terminal, branches: Module | Sequence[Module], merge: Terminal) -> Module:
    """A branching module `(M (B split) (Branches ...) (A merge))`.

    `branches` is one module per branch, or a single module for every branch. The grammar's
    branching prior decides the form: with b = 2 each branch has its own derivation
    (`(M, M)`, a Parallel node); with b = 4 or 8 one derivation is repeated (`(M) * b`, a
    Repeat node; each copy still has its own weights when compiled).
    """
    b = dict(split.args)["b"]
    if isinstance(branches, Nonterminal):
        inner = Parallel((branches,) * b) if b == 2 else Repeat(branches, b)
    else:
        if len(branches) != b:
            raise EinspaceError(f"{split.op}(b={b}) needs {b} branches, got {len(branches)}")
        inner = Parallel(tuple(branches))
    parts = (Nonterminal("B", (split,)), Nonterminal("Branches", (inner,)), Nonterminal("A", (merge,)))
    return Nonterminal("M", parts)


def seq(*modules: Module) -> Module:
    """Modules applied one after another, nested to the right: `(M a (M b c))`."""
    if not modules:
        raise EinspaceError("seq needs at least one module")
    out = modules[-1]
    for module in reversed(modules[:-1]):
        out = Nonterminal("M", (module, out))
    return out


def network(module: Module) -> Nonterminal:
    """The whole backbone: the outermost module relabelled as the start symbol S.

    S derives a sequence, branching or routing module, but not a lone computation.
    """
    if len(module.children) == 1:
        raise EinspaceError("a network must be a sequence, branching or routing module, not one function")
    return Nonterminal("S", module.children)


# ----------------------------------------------------------------------------- common components


def conv(d: int, k: int = 3, s: int = 1, p: int | None = None) -> Module:
    """A k×k convolution to d channels, stride s: im2col · linear · col2im (paper App. A.3).

    Padding defaults to (k - 1) // 2 for odd kernels ("same" at stride 1) and 0 for even
    ones, which are the (k, s, p) combinations of the grammar's im2col grid.
    """
    p = (k - 1) // 2 if p is None and k % 2 else (p or 0)
    return routing(op("im2col", k=k, s=s, p=p), linear(d), "col2im")


def patch_embed(d: int, patch: int) -> Module:
    """Non-overlapping patch×patch patches as tokens, projected to d features: image to col mode."""
    return routing(op("im2col", k=patch, s=patch, p=0), linear(d), "identity")


def residual(main: Module, shortcut: Module | None = None) -> Module:
    """main(x) + shortcut(x), the shortcut being the identity unless given."""
    return branching(op("clone", b=2), [main, identity() if shortcut is None else shortcut], op("add"))


def swap_axes(inner: Module) -> Module:
    """Apply `inner` with the two col-mode axes swapped, so it acts on the tokens, then swap back."""
    return routing(op("permute", order=(2, 1)), inner, op("permute", order=(2, 1)))


def mlp(hidden: int, out: int) -> Module:
    """Two linear layers with the activation between: out features, via hidden."""
    return seq(linear(hidden), act(), linear(out))


def attention_head(d: int) -> Module:
    """One head of self-attention over the tokens, softmax(q kᵀ / √d) v, with q, k, v
    projected to d features: clone the input for the scores and the values, clone again for
    q and kᵀ (the key projection followed by a swap of axes)."""
    keys_t = routing("identity", linear(d), op("permute", order=(2, 1)))
    scores = seq(branching(op("clone", b=2), [linear(d), keys_t], op("matmul", scaled=True)), softmax())
    return branching(op("clone", b=2), [scores, linear(d)], op("matmul", scaled=False))


def multi_head_attention(heads: int, head_dim: int, width: int) -> Module:
    """`heads` attention heads (separate weights), their outputs joined along the features
    and projected back to `width`."""
    heads_ = branching(op("clone", b=heads), attention_head(head_dim), op("concat", dim=2, b=heads))
    return seq(heads_, linear(width))


def transformer_layer(width: int, heads: int, head_dim: int, hidden: int, post_norm: bool = True) -> Module:
    """Self-attention and an MLP, each in a residual connection, with layer norm after each
    sum (post-norm, as the paper's transformer) or at the start of each branch (pre-norm)."""
    attention = multi_head_attention(heads, head_dim, width)
    feed_forward = mlp(hidden, width)
    if post_norm:
        return seq(residual(attention), norm(), residual(feed_forward), norm())
    return seq(residual(seq(norm(), attention)), residual(seq(norm(), feed_forward)))


# ----------------------------------------------------------------------------- seed networks


def basic_block(d: int, stride: int = 1, projection: bool = False) -> Module:
    """ResNet's basic block, shared by `resnet` and `resnet_small`: conv-norm-act-conv-norm (the
    first conv at `stride`) plus the shortcut, then act; with `projection` the shortcut is a 1×1
    conv at `stride` with norm, otherwise the identity."""
    main = seq(conv(d, 3, stride), norm(), act(), conv(d, 3, 1), norm())
    shortcut = seq(conv(d, 1, stride), norm()) if projection else identity()
    return seq(residual(main, shortcut), act())


def resnet(
    blocks: Sequence[int] = (2, 2, 2, 2),
    widths: Sequence[int] = (64, 128, 256, 512),
    after_block: Callable[[], Module] | None = None,
) -> Nonterminal:
    """A ResNet of basic blocks as the paper uses it (App. B.1): a 3×3 stem convolution with
    norm and activation, the stem's max-pool replaced by a 3×3 stride-2 convolution, then
    stages of basic blocks; each later stage starts with a stride-2 block whose shortcut is a
    1×1 stride-2 convolution with norm. Leaky ReLU is the grammar's only activation.

    `after_block` makes a module to follow every residual block, e.g. a NOS calibration:
    `resnet(after_block=lambda: computation("channel_attention"))` (a tree of
    `grammars/einspace_plus.pcfg`)."""

    def block(d: int, stride: int, projection: bool) -> Module:
        done = basic_block(d, stride, projection)
        return done if after_block is None else seq(done, after_block())

    stem = seq(conv(widths[0]), norm(), act(), conv(widths[0], 3, 2))
    stages, previous = [], widths[0]
    for i, (n, d) in enumerate(zip(blocks, widths, strict=True)):
        stride = 1 if i == 0 else 2
        first = block(d, stride, stride != 1 or d != previous)
        stages.append(seq(first, *(block(d, 1, False) for _ in range(n - 1))))
        previous = d
    return network(seq(stem, *stages))


def resnet18() -> Nonterminal:
    """ResNet-18: four stages of two basic blocks, 64-128-256-512 channels."""
    return resnet((2, 2, 2, 2), (64, 128, 256, 512))


def resnet_small(widths: Sequence[int] = (16, 32)) -> Nonterminal:
    """A small ResNet for tiny images (8x8 digits, 3x8x8 composites) and CPU-sized searches:
    a 3x3 stem convolution with norm and activation (no downsampling), then one basic block
    per width, the first at stride 1 and each later one at stride 2 with a 1x1 stride-2
    convolution and norm as its shortcut. The default (16, 32) has 19,520 backbone parameters
    at 1x8x8."""
    blocks, previous = [], widths[0]
    for i, d in enumerate(widths):
        stride = 1 if i == 0 else 2
        blocks.append(basic_block(d, stride, stride != 1 or d != previous))
        previous = d
    return network(seq(conv(widths[0]), norm(), act(), *blocks))


def wide_resnet(depth: int = 16, k: int = 4) -> Nonterminal:
    """A wide ResNet (Zagoruyko and Komodakis 2016): 3×3 stem to 16 channels, three groups of
    (depth - 4) / 6 pre-activation blocks (norm, activation, conv, twice) with 16k, 32k, 64k
    channels, then norm and activation. Where a block changes width or resolution, the
    shortcut is a 1×1 convolution of the pre-activated input, as in the original code."""
    if (depth - 4) % 6:
        raise EinspaceError(f"a wide ResNet has depth 6n + 4, got {depth}")
    n = (depth - 4) // 6

    def block(d: int, stride: int, projection: bool) -> Module:
        if projection:
            main = seq(conv(d, 3, stride), norm(), act(), conv(d))
            return seq(norm(), act(), residual(main, conv(d, 1, stride)))
        return residual(seq(norm(), act(), conv(d), norm(), act(), conv(d)))

    groups, previous = [], 16
    for i, d in enumerate((16 * k, 32 * k, 64 * k)):
        stride = 1 if i == 0 else 2
        first = block(d, stride, stride != 1 or d != previous)
        groups.append(seq(first, *(block(d, 1, False) for _ in range(n - 1))))
        previous = d
    return network(seq(conv(16), *groups, norm(), act()))


def wide_resnet16_4() -> Nonterminal:
    """WRN-16-4: two blocks per group, 64-128-256 channels."""
    return wide_resnet(16, 4)


def vit(
    layers: int = 4, width: int = 512, heads: int = 4, head_dim: int = 64, hidden: int = 512, patch: int = 4
) -> Nonterminal:
    """The paper's small vision transformer: patch×patch patches embedded to `width`, a
    learnable positional encoding, then post-norm transformer layers of `heads` attention
    heads of `head_dim` features and an MLP of `hidden` features (its code's sizes: 4 heads
    of 64, MLP 512, which give its 4.4M parameters at 3×64×64)."""
    body = (transformer_layer(width, heads, head_dim, hidden) for _ in range(layers))
    return network(seq(patch_embed(width, patch), pos_enc(), *body))


def mlp_mixer(
    layers: int = 8,
    width: int = 512,
    patch: int = 4,
    tokens: int = 256,
    token_hidden: int | None = None,
    channel_hidden: int | None = None,
) -> Nonterminal:
    """MLP-Mixer (Tolstikhin et al. 2021) with the paper's sizes: patch embedding and a
    learnable positional encoding, then layers of token mixing (an MLP across the `tokens`
    patches, hidden 4 × tokens) and channel mixing (an MLP across the features, hidden
    width / 2), each pre-norm in a residual connection; a final norm.

    The token MLP's output must equal the number of patches, so the tree fits only inputs
    with `tokens` patches (256 = 3×64×64 at patch 4); build another for other sizes.
    """
    token_hidden = token_hidden or 4 * tokens
    channel_hidden = channel_hidden or width // 2
    token_mixing = residual(seq(norm(), swap_axes(mlp(token_hidden, tokens))))
    channel_mixing = residual(seq(norm(), mlp(channel_hidden, width)))
    body = (seq(token_mixing, channel_mixing) for _ in range(layers))
    return network(seq(patch_embed(width, patch), pos_enc(), *body, norm()))


def densenet(
    blocks: Sequence[int] = (6, 12), growth: int = 32, stem: int = 64, bottleneck: int = 4
) -> Nonterminal:
    """DenseNet-BC (Huang et al. 2017): each layer (norm, activation, 1×1 conv to
    bottleneck × growth, norm, activation, 3×3 conv to `growth`) is concatenated to its input
    along the channels; a transition (norm, activation, 1×1 convolution halving the channels)
    joins dense blocks. The stem is the paper's ResNet stem (3×3 conv, norm, activation, 3×3
    stride-2 conv). The grammar has no pooling, so transitions downsample by stride 2
    instead of average pooling, and the channels after each block must be twice a power of
    two of the linear grid. The default is the first two dense blocks of DenseNet-121.
    """

    def layer() -> Module:
        main = seq(norm(), act(), conv(bottleneck * growth, 1), norm(), act(), conv(growth))
        return branching(op("clone", b=2), [main, identity()], op("concat", dim=1, b=2))

    parts, channels = [seq(conv(stem), norm(), act(), conv(stem, 3, 2))], stem
    for i, n in enumerate(blocks):
        parts.append(seq(*(layer() for _ in range(n))))
        channels += n * growth
        if i < len(blocks) - 1:
            if channels % 2 or (channels // 2) & (channels // 2 - 1):
                raise EinspaceError(
                    f"dense block {i + 1} ends with {channels} channels; a transition halves them, "
                    "and linear widths are powers of two"
                )
            channels //= 2
            parts.append(seq(norm(), act(), conv(channels, 1, 2)))
    return network(seq(*parts, norm(), act()))


@dataclass(frozen=True)
class Seed:
    """A bundled seed: how to build it and one line on what it is."""

    build: Callable[[], Nonterminal]
    description: str


SEEDS: dict[str, Seed] = {
    "resnet18": Seed(
        resnet18, "ResNet-18 as in the einspace paper (App. B.1): 3x3 stem, a stride-2 conv for the max-pool"
    ),
    "resnet_small": Seed(
        resnet_small, "a small ResNet for 8x8 inputs: 3x3 stem to 16, basic blocks of 16 and 32 (stride 2)"
    ),
    "wide_resnet16_4": Seed(wide_resnet16_4, "WRN-16-4, pre-activation blocks, 3x3 stem (paper App. B.1)"),
    "vit": Seed(vit, "ViT as in the paper: patch 4, width 512, 4 post-norm layers of 4 heads x 64, MLP 512"),
    "mlp_mixer": Seed(
        mlp_mixer, "MLP-Mixer as in the paper: patch 4, width 512, 8 layers; for 256 patches (3x64x64)"
    ),
    "densenet": Seed(
        densenet, "DenseNet-BC, growth 32, dense blocks of 6 and 12 layers (DenseNet-121's first two)"
    ),
}


def seed_text(name: str) -> str:
    """The text of a seed's tree file: a `#` header (what it is, how it was made, its size at
    3×64×64) and the tree in the pretty bracket form."""
    from einspace.checker import check_tree
    from einspace.state import input_state

    seed = SEEDS[name]
    tree = seed.build()
    checked = check_tree(tree, None, input_state((3, 64, 64)))
    stats = checked.stats
    head = checked.output[0].shape[0 if len(checked.output[0].shape) == 3 else -1] * 10 + 10
    header = [
        f"{name}: {seed.description}.",
        f"Generated by `python -m einspace.seeds.architectures grammars/seeds` from {name}() in",
        "einspace/architectures.py; edit that, not this file (a test compares them).",
        f"At 3x64x64: {checked.params:,} backbone parameters (+{head:,} for a 10-class head), "
        f"output {stats.output},",
        f"{stats.terminals} terminals, {stats.nonterminals} non-terminals, depth {stats.depth}.",
    ]
    return "".join(f"# {line}\n" for line in header) + pretty(tree) + "\n"


def write_seeds(folder: str | Path) -> list[Path]:
    """Write every seed to `folder/<name>.tree`; returns the paths written."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for name in SEEDS:
        path = folder / f"{name}.tree"
        path.write_text(seed_text(name))
        paths.append(path)
    return paths


if __name__ == "__main__":
    for written in write_seeds(sys.argv[1] if len(sys.argv) > 1 else "grammars/seeds"):
        print(written)

"""Plain-torch models of the bundled seeds, the yardstick compiled seeds are tested and timed against.

Each is what one would write by hand with the usual modules (`nn.Conv2d`, one qkv projection and
`F.scaled_dot_product_attention`, `torch.cat`, ...) for exactly the architecture its builder in
`einspace.seeds.architectures` writes as a tree: same layers, widths, strides, biases (a grammar
`linear` has one, so every convolution does), activation (leaky ReLU, slope 0.01, the grammar's
only one), normalisations and head (mean over space or tokens, then a linear layer). So a
reference has the compiled seed's parameter count, and after `load_from(reference, network)` it
computes the same function: the seed tests check that in float64, the benchmark
`benchmarks/compiled_vs_handwritten.py` before it times anything.

    model = reference("densenet", (3, 32, 32), classes=10)
    load_from(model, compile_network(load_seed("densenet", grammar, x), x, classes=10))

`einspace_order()` yields views of a reference's parameters in the order of the compiled
network's `parameters()`, shaped as the reference holds them (a convolution's weight, one head's
rows of the qkv projection, ...); `load_from` copies by that order, reshaping.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

import torch
import torch.nn.functional as F
from torch import nn

__all__ = [
    "REFERENCES",
    "Attention",
    "DenseNet",
    "MLPMixer",
    "Reference",
    "ResNet",
    "ViT",
    "WideResNet",
    "load_from",
    "reference",
]

Shape = tuple[int, int, int]  # an image input: C, H, W


def _act(x: torch.Tensor) -> torch.Tensor:
    return F.leaky_relu(x, 0.01)


def _conv(c: int, d: int, k: int = 3, s: int = 1) -> nn.Conv2d:
    """The seeds' convolution: padding (k - 1) // 2 (none for 1×1), with a bias."""
    return nn.Conv2d(c, d, k, s, (k - 1) // 2)


class Reference(nn.Module):
    """A hand-written model whose parameters, by default, are registered in the compiled order."""

    def einspace_order(self) -> Iterator[torch.Tensor]:
        yield from self.parameters()


# ----------------------------------------------------------------------------- residual networks


class _BasicBlock(nn.Module):
    """act(bn(conv(act(bn(conv(x))))) + shortcut(x)); the shortcut a 1×1 conv + bn when the
    block changes width or resolution."""

    def __init__(self, c: int, d: int, stride: int):
        super().__init__()
        self.conv1, self.bn1 = _conv(c, d, 3, stride), nn.BatchNorm2d(d)
        self.conv2, self.bn2 = _conv(d, d), nn.BatchNorm2d(d)
        projection = stride != 1 or c != d
        self.shortcut = nn.Sequential(_conv(c, d, 1, stride), nn.BatchNorm2d(d)) if projection else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.bn2(self.conv2(_act(self.bn1(self.conv1(x)))))
        return _act(out + (x if self.shortcut is None else self.shortcut(x)))


class ResNet(Reference):
    """The einspace ResNet (`resnet`, `resnet_small`): a 3×3 stem with bn and act, then (with
    `pool`) a 3×3 stride-2 conv in place of the max-pool; stages of basic blocks, every stage
    after the first starting at stride 2."""

    def __init__(
        self, channels: int, widths: Sequence[int], blocks: Sequence[int], pool: bool, classes: int = 10
    ):
        super().__init__()
        stem: list[nn.Module] = [_conv(channels, widths[0]), nn.BatchNorm2d(widths[0]), nn.LeakyReLU(0.01)]
        if pool:
            stem.append(_conv(widths[0], widths[0], 3, 2))
        self.stem = nn.Sequential(*stem)
        layers, c = [], widths[0]
        for i, (n, d) in enumerate(zip(blocks, widths, strict=True)):
            layers += [_BasicBlock(c, d, 1 if i == 0 else 2), *(_BasicBlock(d, d, 1) for _ in range(n - 1))]
            c = d
        self.blocks = nn.Sequential(*layers)
        self.head = nn.Linear(c, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.blocks(self.stem(x)).mean((2, 3)))


class _WideBlock(nn.Module):
    """Pre-activation block; with a projection the shortcut convolves the pre-activated input."""

    def __init__(self, c: int, d: int, stride: int):
        super().__init__()
        self.bn1, self.conv1 = nn.BatchNorm2d(c), _conv(c, d, 3, stride)
        self.bn2, self.conv2 = nn.BatchNorm2d(d), _conv(d, d)
        self.shortcut = _conv(c, d, 1, stride) if stride != 1 or c != d else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.shortcut is None:
            return x + self.conv2(_act(self.bn2(self.conv1(_act(self.bn1(x))))))
        x = _act(self.bn1(x))
        return self.conv2(_act(self.bn2(self.conv1(x)))) + self.shortcut(x)


class WideResNet(Reference):
    """WRN-depth-k: a 3×3 stem to 16 channels, three groups of (depth - 4) / 6 pre-activation
    blocks (16k, 32k, 64k channels; stride 1, 2, 2), then bn and act."""

    def __init__(self, channels: int, depth: int = 16, k: int = 4, classes: int = 10):
        super().__init__()
        self.stem = _conv(channels, 16)
        blocks, c = [], 16
        for i, d in enumerate((16 * k, 32 * k, 64 * k)):
            blocks += [_WideBlock(c, d, 1 if i == 0 else 2)]
            blocks += [_WideBlock(d, d, 1) for _ in range((depth - 4) // 6 - 1)]
            c = d
        self.blocks = nn.Sequential(*blocks)
        self.bn = nn.BatchNorm2d(c)
        self.head = nn.Linear(c, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(_act(self.bn(self.blocks(self.stem(x)))).mean((2, 3)))


class _DenseLayer(nn.Module):
    """bn, act, 1×1 conv to bottleneck × growth, bn, act, 3×3 conv to growth; the new features
    are concatenated *before* the input (the seed's branches are (layer, identity))."""

    def __init__(self, c: int, growth: int, bottleneck: int):
        super().__init__()
        self.bn1, self.conv1 = nn.BatchNorm2d(c), _conv(c, bottleneck * growth, 1)
        self.bn2, self.conv2 = nn.BatchNorm2d(bottleneck * growth), _conv(bottleneck * growth, growth)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        new = self.conv2(_act(self.bn2(self.conv1(_act(self.bn1(x))))))
        return torch.cat((new, x), 1)


class DenseNet(Reference):
    """DenseNet-BC as the seed builds it: the ResNet stem (3×3 conv, bn, act, 3×3 stride-2 conv),
    dense blocks joined by transitions (bn, act, 1×1 stride-2 conv halving the channels, for
    the grammar has no pooling), then bn and act."""

    def __init__(
        self,
        channels: int,
        blocks: Sequence[int] = (6, 12),
        growth: int = 32,
        stem: int = 64,
        bottleneck: int = 4,
        classes: int = 10,
    ):
        super().__init__()
        layers: list[nn.Module] = [_conv(channels, stem), nn.BatchNorm2d(stem), nn.LeakyReLU(0.01)]
        layers.append(_conv(stem, stem, 3, 2))
        c = stem
        for i, n in enumerate(blocks):
            for _ in range(n):
                layers.append(_DenseLayer(c, growth, bottleneck))
                c += growth
            if i < len(blocks) - 1:
                layers += [nn.BatchNorm2d(c), nn.LeakyReLU(0.01), _conv(c, c // 2, 1, 2)]
                c //= 2
        layers += [nn.BatchNorm2d(c), nn.LeakyReLU(0.01)]
        self.features = nn.Sequential(*layers)
        self.head = nn.Linear(c, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x).mean((2, 3)))


# ----------------------------------------------------------------------------- token networks


class _Position(nn.Module):
    """A learnable positional encoding, added (a module of its own, so that its parameter comes
    after the patch projection's, as in the seed)."""

    def __init__(self, tokens: int, width: int):
        super().__init__()
        self.pos = nn.Parameter(torch.randn(1, tokens, width) * 0.02)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.pos


class _PatchEmbed(nn.Module):
    """Non-overlapping patches to tokens (conv, flatten, transpose), plus a learnable position."""

    def __init__(self, channels: int, width: int, patch: int, tokens: int):
        super().__init__()
        self.proj = nn.Conv2d(channels, width, patch, patch)
        self.position = _Position(tokens, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.position(self.proj(x).flatten(2).transpose(1, 2))


class _Mlp(nn.Sequential):
    def __init__(self, d: int, hidden: int, out: int):
        super().__init__(nn.Linear(d, hidden), nn.LeakyReLU(0.01), nn.Linear(hidden, out))


class Attention(nn.Module):
    """Multi-head self-attention as timm writes it: one qkv projection reshaped into heads of `e`
    (by default width // heads) and unbound, scaled dot-product, an output projection. Also the
    attention of the import tests' and benchmark's timm-style models."""

    def __init__(self, width: int, heads: int, e: int | None = None):
        super().__init__()
        self.heads, self.e = heads, width // heads if e is None else e
        self.qkv = nn.Linear(width, 3 * heads * self.e)
        self.proj = nn.Linear(heads * self.e, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, _ = x.shape
        q, k, v = self.qkv(x).reshape(b, n, 3, self.heads, self.e).permute(2, 0, 3, 1, 4).unbind(0)
        out = F.scaled_dot_product_attention(q, k, v)
        return self.proj(out.transpose(1, 2).reshape(b, n, self.heads * self.e))

    def einspace_order(self) -> Iterator[torch.Tensor]:
        """Head by head, q, k, v (the seed has a projection per head), then the output projection."""
        weight = self.qkv.weight.view(3, self.heads, self.e, -1)
        bias = self.qkv.bias.view(3, self.heads, self.e)
        for h in range(self.heads):
            for j in range(3):
                yield weight[j, h]
                yield bias[j, h]
        yield from self.proj.parameters()


class _PostNormLayer(nn.Module):
    def __init__(self, width: int, heads: int, e: int, hidden: int):
        super().__init__()
        self.attention = Attention(width, heads, e)
        self.norm1 = nn.LayerNorm(width)
        self.mlp = _Mlp(width, hidden, width)
        self.norm2 = nn.LayerNorm(width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.norm1(x + self.attention(x))
        return self.norm2(x + self.mlp(x))

    def einspace_order(self) -> Iterator[torch.Tensor]:
        yield from self.attention.einspace_order()
        for module in (self.norm1, self.mlp, self.norm2):
            yield from module.parameters()


class ViT(Reference):
    """The paper's ViT: 4×4 patches to 512, learnable positions, 4 post-norm layers of 4 heads of
    64 and an MLP of 512; the head averages the tokens."""

    def __init__(
        self,
        channels: int,
        tokens: int,
        layers: int = 4,
        width: int = 512,
        heads: int = 4,
        e: int = 64,
        classes: int = 10,
    ):
        super().__init__()
        self.embed = _PatchEmbed(channels, width, 4, tokens)
        self.layers = nn.ModuleList(_PostNormLayer(width, heads, e, width) for _ in range(layers))
        self.head = nn.Linear(width, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.embed(x)
        for layer in self.layers:
            x = layer(x)
        return self.head(x.mean(1))

    def einspace_order(self) -> Iterator[torch.Tensor]:
        yield from self.embed.parameters()
        for layer in self.layers:
            yield from layer.einspace_order()
        yield from self.head.parameters()


class _MixerLayer(nn.Module):
    """Token mixing then channel mixing. `pre_norm_each`: each in its own pre-norm residual (the
    MLP-Mixer paper, and the seed); otherwise one norm and one residual around both (the
    einspace paper's code)."""

    def __init__(self, width: int, tokens: int, pre_norm_each: bool):
        super().__init__()
        self.norm1 = nn.LayerNorm(width)
        self.token_mlp = _Mlp(tokens, 4 * tokens, tokens)
        self.norm2 = nn.LayerNorm(width) if pre_norm_each else None
        self.channel_mlp = _Mlp(width, width // 2, width)

    def _mix_tokens(self, x: torch.Tensor) -> torch.Tensor:
        return self.token_mlp(x.transpose(1, 2)).transpose(1, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.norm2 is None:
            return x + self.channel_mlp(self._mix_tokens(self.norm1(x)))
        x = x + self._mix_tokens(self.norm1(x))
        return x + self.channel_mlp(self.norm2(x))


class MLPMixer(Reference):
    """MLP-Mixer: 4×4 patches to 512, learnable positions, 8 layers of token mixing (an MLP
    across the tokens, hidden 4 × tokens) and channel mixing (512 → 256 → 512).

    As the seed (and Tolstikhin et al.): each mixing pre-norm in its own residual, and a final
    layer norm. With `paper_code=True`, as the einspace paper's code builds its Mixer seed: one
    norm and one residual around both mixings, no final norm, so 9 layer norms of `width` fewer
    (8 × 1,024 + 1,024 = 9,216 parameters at width 512)."""

    def __init__(
        self,
        channels: int,
        tokens: int,
        layers: int = 8,
        width: int = 512,
        classes: int = 10,
        paper_code: bool = False,
    ):
        super().__init__()
        self.embed = _PatchEmbed(channels, width, 4, tokens)
        self.layers = nn.Sequential(*(_MixerLayer(width, tokens, not paper_code) for _ in range(layers)))
        self.norm = nn.Identity() if paper_code else nn.LayerNorm(width)
        self.head = nn.Linear(width, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.norm(self.layers(self.embed(x))).mean(1))


# ----------------------------------------------------------------------------- by seed name


def _tokens(shape: Shape, patch: int = 4) -> int:
    return (shape[1] // patch) * (shape[2] // patch)


#: Seed name -> the reference for an input shape (C, H, W) and a number of classes.
REFERENCES: dict[str, Callable[[Shape, int], Reference]] = {
    "resnet18": lambda s, n: ResNet(s[0], (64, 128, 256, 512), (2, 2, 2, 2), pool=True, classes=n),
    "resnet_small": lambda s, n: ResNet(s[0], (16, 32), (1, 1), pool=False, classes=n),
    "wide_resnet16_4": lambda s, n: WideResNet(s[0], 16, 4, classes=n),
    "densenet": lambda s, n: DenseNet(s[0], classes=n),
    "vit": lambda s, n: ViT(s[0], _tokens(s), classes=n),
    "mlp_mixer": lambda s, n: MLPMixer(s[0], _tokens(s), classes=n),
}


def reference(name: str, shape: Shape, classes: int = 10) -> Reference:
    """The hand-written model of the bundled seed `name` for images of `shape` (C, H, W)."""
    if name not in REFERENCES:
        raise KeyError(f"no reference model for {name!r}; there are: {', '.join(sorted(REFERENCES))}")
    return REFERENCES[name](shape, classes)


@torch.no_grad()
def load_from(model: Reference, network: nn.Module) -> None:
    """Copy a compiled network's parameters (in `einspace_order`) and batch-norm statistics
    (in module order) into the reference `model`."""
    targets, sources = list(model.einspace_order()), list(network.parameters())
    if len(targets) != len(sources):
        raise ValueError(f"{len(sources)} compiled parameter tensors, {len(targets)} in the reference")
    for target, source in zip(targets, sources, strict=True):
        if target.numel() != source.numel():
            raise ValueError(f"reference {tuple(target.shape)} against compiled {tuple(source.shape)}")
        target.copy_(source.reshape(target.shape))
    mine, theirs = ([m for m in n.modules() if isinstance(m, nn.BatchNorm2d)] for n in (model, network))
    if len(mine) != len(theirs):
        raise ValueError(f"{len(theirs)} compiled batch norms, {len(mine)} in the reference")
    for target_norm, source_norm in zip(mine, theirs, strict=True):
        target_norm.load_state_dict(source_norm.state_dict())

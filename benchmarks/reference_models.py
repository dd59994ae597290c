"""Hand-written plain-torch versions of the bundled seeds, the yardstick for compiled networks.

Each is what one would write by hand with the usual fast modules (nn.Conv2d, a single qkv
projection and `F.scaled_dot_product_attention`, ...) for exactly the architecture of the seed
in einspace/architectures.py: same layers, widths, strides, biases, activation (leaky ReLU,
slope 0.01, the grammar's only one), normalisations and head (mean over space or tokens, then
a linear layer). So they have the same parameter count as the compiled seed, and
`load_from(reference, network)` copies a compiled network's weights into one, after which
both compute the same function (the benchmark checks this before timing anything).

`einspace_order()` yields views of a reference's parameters in the order of the compiled
network's `parameters()`, shaped as there (a conv weight as the linear's [d, C·k·k], one
head's slice of the qkv projection, ...).
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["MLPMixer", "ResNet18", "ViT", "WideResNet16_4", "load_from", "reference"]


def _act(x: torch.Tensor) -> torch.Tensor:
    return F.leaky_relu(x, 0.01)


class _Reference(nn.Module):
    """Parameters in the compiled order by default: modules registered in the seed's order."""

    def einspace_order(self) -> Iterator[torch.Tensor]:
        yield from self.parameters()


def _conv_bn(c: int, d: int, k: int, s: int) -> tuple[nn.Conv2d, nn.BatchNorm2d]:
    return nn.Conv2d(c, d, k, s, (k - 1) // 2), nn.BatchNorm2d(d)


class _BasicBlock(nn.Module):
    """act(bn(conv(act(bn(conv(x))))) + shortcut(x)); the shortcut a 1×1 conv + bn when needed."""

    def __init__(self, c: int, d: int, stride: int):
        super().__init__()
        self.conv1, self.bn1 = _conv_bn(c, d, 3, stride)
        self.conv2, self.bn2 = _conv_bn(d, d, 3, 1)
        self.shortcut = nn.Sequential(*_conv_bn(c, d, 1, stride)) if stride != 1 or c != d else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.bn2(self.conv2(_act(self.bn1(self.conv1(x)))))
        return _act(out + self.shortcut(x))


class ResNet18(_Reference):
    """The einspace ResNet-18: 3×3 stem, bn, act, a 3×3 stride-2 conv for the max-pool, four
    stages of two basic blocks (64-128-256-512), every conv with a bias (a linear has one)."""

    def __init__(self, classes: int = 10, widths: tuple[int, ...] = (64, 128, 256, 512)):
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(3, widths[0], 3, 1, 1),
            nn.BatchNorm2d(widths[0]),
            nn.LeakyReLU(0.01),
            nn.Conv2d(widths[0], widths[0], 3, 2, 1),
        )
        blocks, c = [], widths[0]
        for i, d in enumerate(widths):
            blocks += [_BasicBlock(c, d, 1 if i == 0 else 2), _BasicBlock(d, d, 1)]
            c = d
        self.blocks = nn.Sequential(*blocks)
        self.head = nn.Linear(c, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.blocks(self.stem(x)).mean((2, 3)))


class _WideBlock(nn.Module):
    """Pre-activation block; with a projection the shortcut convolves the pre-activated input."""

    def __init__(self, c: int, d: int, stride: int):
        super().__init__()
        self.projection = stride != 1 or c != d
        self.bn1 = nn.BatchNorm2d(c)
        self.conv1 = nn.Conv2d(c, d, 3, stride, 1)
        self.bn2 = nn.BatchNorm2d(d)
        self.conv2 = nn.Conv2d(d, d, 3, 1, 1)
        self.shortcut = nn.Conv2d(c, d, 1, stride) if self.projection else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.shortcut is not None:
            x = _act(self.bn1(x))
            return self.conv2(_act(self.bn2(self.conv1(x)))) + self.shortcut(x)
        return self.conv2(_act(self.bn2(self.conv1(_act(self.bn1(x)))))) + x


class WideResNet16_4(_Reference):
    """WRN-16-4: 3×3 stem to 16 channels, three groups of two pre-activation blocks
    (64, 128, 256 channels; stride 1, 2, 2), then bn and act."""

    def __init__(self, classes: int = 10, depth: int = 16, k: int = 4):
        super().__init__()
        n = (depth - 4) // 6
        self.stem = nn.Conv2d(3, 16, 3, 1, 1)
        blocks, c = [], 16
        for i, d in enumerate((16 * k, 32 * k, 64 * k)):
            blocks.append(_WideBlock(c, d, 1 if i == 0 else 2))
            blocks += [_WideBlock(d, d, 1) for _ in range(n - 1)]
            c = d
        self.blocks = nn.Sequential(*blocks)
        self.bn = nn.BatchNorm2d(c)
        self.head = nn.Linear(c, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(_act(self.bn(self.blocks(self.stem(x)))).mean((2, 3)))


class _PatchEmbed(nn.Module):
    """Non-overlapping patches to tokens (conv, flatten, transpose), plus a learnable position."""

    def __init__(self, width: int, patch: int, tokens: int):
        super().__init__()
        self.proj = nn.Conv2d(3, width, patch, patch)
        self.pos = nn.Parameter(torch.randn(1, tokens, width) * 0.02)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x).flatten(2).transpose(1, 2) + self.pos

    def einspace_order(self) -> Iterator[torch.Tensor]:
        yield from self.proj.parameters()  # the linear, then the positional encoding
        yield self.pos


class _Mlp(nn.Sequential):
    def __init__(self, d: int, hidden: int, out: int):
        super().__init__(nn.Linear(d, hidden), nn.LeakyReLU(0.01), nn.Linear(hidden, out))


class _Attention(nn.Module):
    """Multi-head self-attention with one qkv projection (as timm writes it), heads of `e`."""

    def __init__(self, width: int, heads: int, e: int):
        super().__init__()
        self.heads, self.e = heads, e
        self.qkv = nn.Linear(width, 3 * heads * e)
        self.proj = nn.Linear(heads * e, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, _ = x.shape
        q, k, v = self.qkv(x).reshape(b, n, 3, self.heads, self.e).permute(2, 0, 3, 1, 4)
        out = F.scaled_dot_product_attention(q, k, v)
        return self.proj(out.transpose(1, 2).reshape(b, n, self.heads * self.e))

    def einspace_order(self) -> Iterator[torch.Tensor]:
        weight = self.qkv.weight.view(3, self.heads, self.e, -1)
        bias = self.qkv.bias.view(3, self.heads, self.e)
        for h in range(self.heads):
            for j in range(3):  # q, k, v of head h
                yield weight[j, h]
                yield bias[j, h]
        yield from self.proj.parameters()


class _PostNormLayer(nn.Module):
    def __init__(self, width: int, heads: int, e: int, hidden: int):
        super().__init__()
        self.attention = _Attention(width, heads, e)
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


class ViT(_Reference):
    """The paper's ViT: 4×4 patches to 512, learnable positions, 4 post-norm layers of 4 heads of
    64 and an MLP of 512; the head averages the tokens."""

    def __init__(self, classes: int = 10, layers: int = 4, width: int = 512, heads: int = 4, e: int = 64):
        super().__init__()
        self.embed = _PatchEmbed(width, 4, 256)
        self.layers = nn.ModuleList(_PostNormLayer(width, heads, e, width) for _ in range(layers))
        self.head = nn.Linear(width, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.embed(x)
        for layer in self.layers:
            x = layer(x)
        return self.head(x.mean(1))

    def einspace_order(self) -> Iterator[torch.Tensor]:
        yield from self.embed.einspace_order()
        for layer in self.layers:
            yield from layer.einspace_order()
        yield from self.head.parameters()


class _MixerLayer(nn.Module):
    def __init__(self, width: int, tokens: int):
        super().__init__()
        self.norm1 = nn.LayerNorm(width)
        self.token_mlp = _Mlp(tokens, 4 * tokens, tokens)
        self.norm2 = nn.LayerNorm(width)
        self.channel_mlp = _Mlp(width, width // 2, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.token_mlp(self.norm1(x).transpose(1, 2)).transpose(1, 2)
        return x + self.channel_mlp(self.norm2(x))


class MLPMixer(_Reference):
    """MLP-Mixer: 4×4 patches to 512, learnable positions, 8 pre-norm layers of token mixing
    (256 → 1024 → 256) and channel mixing (512 → 256 → 512), a final layer norm."""

    def __init__(self, classes: int = 10, layers: int = 8, width: int = 512):
        super().__init__()
        self.embed = _PatchEmbed(width, 4, 256)
        self.layers = nn.Sequential(*(_MixerLayer(width, 256) for _ in range(layers)))
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.norm(self.layers(self.embed(x))).mean(1))

    def einspace_order(self) -> Iterator[torch.Tensor]:
        yield from self.embed.einspace_order()
        for module in (self.layers, self.norm, self.head):
            yield from module.parameters()


REFERENCES: dict[str, type[_Reference]] = {
    "resnet18": ResNet18,
    "wide_resnet16_4": WideResNet16_4,
    "vit": ViT,
    "mlp_mixer": MLPMixer,
}


def reference(name: str, classes: int = 10) -> _Reference:
    """The hand-written model of the bundled seed `name`."""
    return REFERENCES[name](classes)


@torch.no_grad()
def load_from(model: _Reference, network: nn.Module) -> None:
    """Copy a compiled network's parameters and norm statistics into the reference `model`."""
    targets, sources = list(model.einspace_order()), list(network.parameters())
    if len(targets) != len(sources):
        raise ValueError(f"{len(sources)} compiled parameter tensors, {len(targets)} in the reference")
    for target, source in zip(targets, sources, strict=True):
        if target.numel() != source.numel():
            raise ValueError(f"reference {tuple(target.shape)} against compiled {tuple(source.shape)}")
        target.copy_(source.reshape(target.shape))
    mine, theirs = ([m for m in n.modules() if isinstance(m, nn.BatchNorm2d)] for n in (model, network))
    for target_norm, source_norm in zip(mine, theirs, strict=True):
        target_norm.load_state_dict(source_norm.state_dict())

"""Import the models people use (issue 25): plain-torch replicas of torchvision's and timm's
architectures, each imported into `einspace_zoo`, checked against its own outputs, and timed.

    python benchmarks/import_zoo.py [--quick] [--models resnet18 vit_tiny ...] [--repeats 5]

The replicas are written here after the published model code (torchvision 0.2x, timm 1.0) and the
papers, layer for layer, with random weights: torchvision's wheel does not match the CPU torch
this project pins, and nothing is downloaded. Each row says what the import gave (`exact`: no
substitution; `refused`: the import's first line), the parameters of the original and of the
imported network, the largest difference of their logits in float64 on a batch of 2 (relative to
the largest logit), the import's time, and the forward time of a batch of 2 in float32 on one
thread, original and imported (the fastest of `--repeats`). `--quick` runs smaller inputs (CNNs at
32×32, the token models at 112×112: 49 tokens instead of 196).

A model fails when its outcome is not the one expected for it (EXPECTED below: a refusal the
grammar cannot express yet is expected, and a model that starts to import is news worth a look)
or an exact import's logits differ by more than 1e-6 of the largest; the script then exits 1.
Where the replicas differ from the published code, by necessity, it is said at the replica.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from einspace.grammar.parser import load_grammar
from einspace.network.importer import ModelImportError, import_model
from einspace.state import input_state
from einspace.testing.reference_models import Attention  # timm's

GRAMMAR = "einspace_zoo"
TOLERANCE = 1e-6  # of the largest logit, in float64


# ----------------------------------------------------------------------------- ResNet (He et al. 2016)


def _conv_bn(c_in: int, c_out: int, k: int, s: int) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(c_in, c_out, k, s, k // 2, bias=False), nn.BatchNorm2d(c_out))


class BasicBlock(nn.Module):
    """torchvision's BasicBlock: two 3×3 convolutions, a 1×1 stride-2 projection when the shape changes."""

    def __init__(self, c_in: int, c_out: int, stride: int):
        super().__init__()
        self.conv1, self.conv2 = _conv_bn(c_in, c_out, 3, stride), _conv_bn(c_out, c_out, 3, 1)
        self.relu = nn.ReLU(inplace=True)
        changed = stride != 1 or c_in != c_out
        self.downsample = _conv_bn(c_in, c_out, 1, stride) if changed else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        return self.relu(self.conv2(self.relu(self.conv1(x))) + identity)


class Bottleneck(nn.Module):
    """torchvision's Bottleneck (ResNet v1.5: the stride on the 3×3), expansion 4."""

    def __init__(self, c_in: int, width: int, stride: int):
        super().__init__()
        c_out = 4 * width
        self.conv1, self.conv2 = _conv_bn(c_in, width, 1, 1), _conv_bn(width, width, 3, stride)
        self.conv3 = _conv_bn(width, c_out, 1, 1)
        self.relu = nn.ReLU(inplace=True)
        changed = stride != 1 or c_in != c_out
        self.downsample = _conv_bn(c_in, c_out, 1, stride) if changed else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.conv2(self.relu(self.conv1(x))))
        return self.relu(self.conv3(out) + identity)


class ResNet(nn.Module):
    """torchvision's ResNet: 7×7 stride-2 stem, 3×3 stride-2 max-pool, four stages, mean, fc."""

    def __init__(self, bottleneck: bool, depths: tuple[int, ...], classes: int = 1000):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 64, 7, 2, 3, bias=False)
        self.bn1, self.relu = nn.BatchNorm2d(64), nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, 2, 1)
        blocks, c = [], 64
        for i, depth in enumerate(depths):
            width = 64 * 2**i
            for j in range(depth):
                stride = 2 if i and not j else 1
                block = Bottleneck(c, width, stride) if bottleneck else BasicBlock(c, width, stride)
                blocks.append(block)
                c = 4 * width if bottleneck else width
        self.layers = nn.Sequential(*blocks)
        self.avgpool, self.fc = nn.AdaptiveAvgPool2d(1), nn.Linear(c, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.layers(self.maxpool(self.relu(self.bn1(self.conv1(x)))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


# ----------------------------------------------------------------------------- MobileNetV2, EfficientNet-B0


def _conv_bn_act(
    c_in: int, c_out: int, k: int, s: int, act: type[nn.Module], groups: int = 1
) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(c_in, c_out, k, s, k // 2, groups=groups, bias=False), nn.BatchNorm2d(c_out), act()
    )


class SqueezeExcitation(nn.Module):
    """torchvision's SqueezeExcitation: mean, 1×1 conv, SiLU, 1×1 conv, sigmoid, times x."""

    def __init__(self, c: int, squeezed: int):
        super().__init__()
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc1, self.fc2, self.activation = nn.Conv2d(c, squeezed, 1), nn.Conv2d(squeezed, c, 1), nn.SiLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.sigmoid(self.fc2(self.activation(self.fc1(self.avgpool(x)))))


class StochasticDepth(nn.Module):
    """Row-wise stochastic depth: the identity at inference."""

    def __init__(self, p: float):
        super().__init__()
        self.p = p

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or self.p == 0.0:
            return x
        keep = x.new_empty(x.shape[0], 1, 1, 1).bernoulli_(1 - self.p)
        return x * keep / (1 - self.p)


class InvertedResidual(nn.Module):
    """MobileNetV2's block (ReLU6, no squeeze) and EfficientNet's MBConv (SiLU, squeeze to c_in / 4,
    stochastic depth)."""

    def __init__(self, c_in: int, c_out: int, k: int, stride: int, expand: int, efficient: bool):
        super().__init__()
        act, hidden = (nn.SiLU if efficient else nn.ReLU6), c_in * expand
        layers: list[nn.Module] = [] if expand == 1 else [_conv_bn_act(c_in, hidden, 1, 1, act)]
        layers.append(_conv_bn_act(hidden, hidden, k, stride, act, groups=hidden))
        if efficient:
            layers.append(SqueezeExcitation(hidden, max(1, c_in // 4)))
        layers += [nn.Conv2d(hidden, c_out, 1, bias=False), nn.BatchNorm2d(c_out)]
        self.block = nn.Sequential(*layers)
        self.use_res = stride == 1 and c_in == c_out
        self.stochastic_depth = StochasticDepth(0.2 if efficient else 0.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.stochastic_depth(self.block(x)) if self.use_res else self.block(x)


#: (expansion, kernel, stride, channels, blocks) per stage.
MOBILENET_V2 = [(1, 3, 1, 16, 1), (6, 3, 2, 24, 2), (6, 3, 2, 32, 3), (6, 3, 2, 64, 4), (6, 3, 1, 96, 3),
                (6, 3, 2, 160, 3), (6, 3, 1, 320, 1)]  # fmt: skip
EFFICIENTNET_B0 = [(1, 3, 1, 16, 1), (6, 3, 2, 24, 2), (6, 5, 2, 40, 2), (6, 3, 2, 80, 3), (6, 5, 1, 112, 3),
                   (6, 5, 2, 192, 4), (6, 3, 1, 320, 1)]  # fmt: skip


class MobileNet(nn.Module):
    """torchvision's MobileNetV2 (ReLU6) or EfficientNet-B0 (SiLU, squeeze-and-excitation): a 3×3
    stride-2 stem to 32 channels, the stages, a 1×1 conv to 1280, mean, dropout, linear."""

    def __init__(self, efficient: bool, classes: int = 1000):
        super().__init__()
        act = nn.SiLU if efficient else nn.ReLU6
        layers: list[nn.Module] = [_conv_bn_act(3, 32, 3, 2, act)]
        c = 32
        for expand, k, stride, c_out, blocks in EFFICIENTNET_B0 if efficient else MOBILENET_V2:
            for i in range(blocks):
                layers.append(InvertedResidual(c, c_out, k, stride if i == 0 else 1, expand, efficient))
                c = c_out
        layers.append(_conv_bn_act(c, 1280, 1, 1, act))
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Sequential(nn.Dropout(0.2), nn.Linear(1280, classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.adaptive_avg_pool2d(self.features(x), (1, 1))
        return self.classifier(torch.flatten(x, 1))


# ------------------------------------------------------------------ VGG (Simonyan & Zisserman 2015)


class VGG11(nn.Module):
    """torchvision's vgg11: its classifier reads the flattened 7×7 map, not a mean (refused)."""

    def __init__(self, classes: int = 1000):
        super().__init__()
        layers: list[nn.Module] = []
        c = 3
        for v in (64, "M", 128, "M", 256, 256, "M", 512, 512, "M", 512, 512, "M"):
            if v == "M":
                layers.append(nn.MaxPool2d(2, 2))
            else:
                layers += [nn.Conv2d(c, int(v), 3, padding=1), nn.ReLU(inplace=True)]
                c = int(v)
        self.features, self.avgpool = nn.Sequential(*layers), nn.AdaptiveAvgPool2d(7)
        self.classifier = nn.Sequential(
            nn.Linear(512 * 49, 4096), nn.ReLU(True), nn.Dropout(), nn.Linear(4096, 4096), nn.ReLU(True),
            nn.Dropout(), nn.Linear(4096, classes),
        )  # fmt: skip

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(torch.flatten(self.avgpool(self.features(x)), 1))


# ----------------------------------------------------------- ViT (Dosovitskiy et al. 2021), Mixer


class Mlp(nn.Module):
    def __init__(self, width: int, hidden: int):
        super().__init__()
        self.fc1, self.act, self.fc2 = nn.Linear(width, hidden), nn.GELU(), nn.Linear(hidden, width)
        self.drop = nn.Dropout(0.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(self.fc2(self.drop(self.act(self.fc1(x)))))


class ViTBlock(nn.Module):
    """timm's pre-norm Block. timm's LayerNorms have eps 1e-6; the grammar's `norm` has torch's
    1e-5 (another eps is a substitution), so the replicas use torch's default."""

    def __init__(self, width: int, heads: int):
        super().__init__()
        self.norm1, self.attn = nn.LayerNorm(width), Attention(width, heads)
        self.norm2, self.mlp = nn.LayerNorm(width), Mlp(width, 4 * width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class VisionTransformer(nn.Module):
    """timm's VisionTransformer: a 16×16 patchify convolution, a learnt position embedding, the
    blocks, a final norm, and either the mean over tokens (`global_pool='avg'`, no class token) or
    DeiT's class token (concatenated in front, its output read by the head)."""

    def __init__(self, size: int, width: int, depth: int, heads: int, class_token: bool, classes: int = 1000):
        super().__init__()
        tokens = (size // 16) ** 2 + class_token
        self.patch_embed = nn.Conv2d(3, width, 16, 16)
        self.cls_token = nn.Parameter(torch.randn(1, 1, width) * 0.02) if class_token else None
        self.pos_embed = nn.Parameter(torch.randn(1, tokens, width) * 0.02)
        self.blocks = nn.Sequential(*(ViTBlock(width, heads) for _ in range(depth)))
        self.norm, self.head = nn.LayerNorm(width), nn.Linear(width, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.patch_embed(x).flatten(2).transpose(1, 2)
        if self.cls_token is not None:
            x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1)
        x = self.norm(self.blocks(x + self.pos_embed))
        return self.head(x[:, 0] if self.cls_token is not None else x.mean(1))


class MixerBlock(nn.Module):
    """timm's MixerBlock: an MLP across tokens (on the transposed tokens), then one across channels."""

    def __init__(self, tokens: int, width: int):
        super().__init__()
        self.norm1, self.mlp_tokens = nn.LayerNorm(width), Mlp(tokens, width // 2)
        self.norm2, self.mlp_channels = nn.LayerNorm(width), Mlp(width, 4 * width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.mlp_tokens(self.norm1(x).transpose(1, 2)).transpose(1, 2)
        return x + self.mlp_channels(self.norm2(x))


class MlpMixer(nn.Module):
    """timm's MlpMixer (S/16: width 512, 8 blocks, token MLP 256, channel MLP 2048), mean head."""

    def __init__(self, size: int, width: int = 512, depth: int = 8, patch: int = 16, classes: int = 1000):
        super().__init__()
        self.stem = nn.Conv2d(3, width, patch, patch)
        self.blocks = nn.Sequential(*(MixerBlock((size // patch) ** 2, width) for _ in range(depth)))
        self.norm, self.head = nn.LayerNorm(width), nn.Linear(width, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.norm(self.blocks(self.stem(x).flatten(2).transpose(1, 2)))
        return self.head(x.mean(dim=1))


# --------------------------------------------- SqueezeNet (Iandola et al. 2016), DenseNet (Huang et al. 2017)


class Fire(nn.Module):
    """torchvision's Fire: a 1×1 squeeze, then 1×1 and 3×3 expands side by side, concatenated."""

    def __init__(self, c_in: int, squeeze: int, expand: int):
        super().__init__()
        self.squeeze, self.relu = nn.Conv2d(c_in, squeeze, 1), nn.ReLU(inplace=True)
        self.expand1x1 = nn.Conv2d(squeeze, expand, 1)
        self.expand3x3 = nn.Conv2d(squeeze, expand, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.relu(self.squeeze(x))
        return torch.cat([self.relu(self.expand1x1(x)), self.relu(self.expand3x3(x))], 1)


class SqueezeNet(nn.Module):
    """torchvision's squeezenet1_0: an unpadded 7×7 stride-2 stem, max-pools with ceil_mode, Fire
    modules, and a convolutional classifier (1×1 convolution, ReLU, then the mean)."""

    def __init__(self, classes: int = 1000):
        super().__init__()
        pool = lambda: nn.MaxPool2d(3, 2, ceil_mode=True)  # noqa: E731
        self.features = nn.Sequential(
            nn.Conv2d(3, 96, 7, 2), nn.ReLU(inplace=True), pool(), Fire(96, 16, 64), Fire(128, 16, 64),
            Fire(128, 32, 128), pool(), Fire(256, 32, 128), Fire(256, 48, 192), Fire(384, 48, 192),
            Fire(384, 64, 256), pool(), Fire(512, 64, 256),
        )  # fmt: skip
        self.classifier = nn.Sequential(
            nn.Dropout(0.5), nn.Conv2d(512, classes, 1), nn.ReLU(inplace=True), nn.AdaptiveAvgPool2d(1)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.flatten(self.classifier(self.features(x)), 1)


class DenseLayer(nn.Module):
    """torchvision's _DenseLayer: BN, ReLU, 1×1 to 4·growth, BN, ReLU, 3×3 to growth, on the
    concatenation of every earlier feature map of its block."""

    def __init__(self, c_in: int, growth: int):
        super().__init__()
        self.norm1, self.conv1 = nn.BatchNorm2d(c_in), nn.Conv2d(c_in, 4 * growth, 1, bias=False)
        self.norm2 = nn.BatchNorm2d(4 * growth)
        self.conv2 = nn.Conv2d(4 * growth, growth, 3, padding=1, bias=False)
        self.relu = nn.ReLU(inplace=True)

    def forward(self, features: list[torch.Tensor]) -> torch.Tensor:
        x = self.conv1(self.relu(self.norm1(torch.cat(features, 1))))
        return self.conv2(self.relu(self.norm2(x)))


class DenseBlock(nn.ModuleDict):
    def __init__(self, layers: int, c_in: int, growth: int):
        super().__init__({f"denselayer{i + 1}": DenseLayer(c_in + i * growth, growth) for i in range(layers)})

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        features = [x]
        for layer in self.values():
            features.append(layer(features))
        return torch.cat(features, 1)


class DenseNet(nn.Module):
    """torchvision's densenet121: growth 32, blocks of 6, 12, 24 and 16 layers, transitions (BN,
    ReLU, 1×1 halving the channels, 2×2 average pool), a final BN and ReLU, mean, fc."""

    def __init__(self, blocks: tuple[int, ...] = (6, 12, 24, 16), growth: int = 32, classes: int = 1000):
        super().__init__()
        stem = nn.Conv2d(3, 64, 7, 2, 3, bias=False)
        layers: list[nn.Module] = [stem, nn.BatchNorm2d(64), nn.ReLU(inplace=True), nn.MaxPool2d(3, 2, 1)]
        c = 64
        for i, n in enumerate(blocks):
            layers.append(DenseBlock(n, c, growth))
            c += n * growth
            if i < len(blocks) - 1:
                layers += [nn.BatchNorm2d(c), nn.ReLU(inplace=True), nn.Conv2d(c, c // 2, 1, bias=False)]
                layers.append(nn.AvgPool2d(2, 2))
                c //= 2
        self.features = nn.Sequential(*layers, nn.BatchNorm2d(c), nn.ReLU(inplace=True))
        self.classifier = nn.Linear(c, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(torch.flatten(F.adaptive_avg_pool2d(self.features(x), 1), 1))


# ------------------------------------------- ConvMixer (Trockman & Kolter 2023), ConvNeXt (Liu et al. 2022)


class Residual(nn.Module):
    def __init__(self, inner: nn.Module):
        super().__init__()
        self.fn = inner

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fn(x) + x


class ConvMixer(nn.Module):
    """timm's ConvMixer: a patchify convolution, activation, BN; per block a residual depthwise
    convolution (padding "same", activation, BN), then a pointwise one (activation, BN); mean, fc."""

    def __init__(self, width: int, depth: int, kernel: int, patch: int, act: type, classes: int = 1000):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, width, patch, patch), act(), nn.BatchNorm2d(width))
        mix = lambda: nn.Conv2d(width, width, kernel, groups=width, padding="same")  # noqa: E731
        self.blocks = nn.Sequential(*(
            nn.Sequential(
                Residual(nn.Sequential(mix(), act(), nn.BatchNorm2d(width))),
                nn.Conv2d(width, width, 1), act(), nn.BatchNorm2d(width),
            )
            for _ in range(depth)
        ))  # fmt: skip
        self.pooling, self.head = nn.AdaptiveAvgPool2d((1, 1)), nn.Linear(width, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.pooling(self.blocks(self.stem(x))).flatten(1))


class LayerNorm2d(nn.LayerNorm):
    """timm's LayerNorm2d: a LayerNorm over the channels of an image (permuted there and back)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.layer_norm(x.permute(0, 2, 3, 1), self.normalized_shape, self.weight, self.bias, self.eps)
        return x.permute(0, 3, 1, 2)


class ConvNeXtBlock(nn.Module):
    """timm's ConvNeXtBlock: a 7×7 depthwise convolution, then channels last: LayerNorm, an MLP
    (4×, GELU), layer scale; the shortcut added back in image layout."""

    def __init__(self, width: int):
        super().__init__()
        self.conv_dw = nn.Conv2d(width, width, 7, padding=3, groups=width)
        self.norm, self.mlp = nn.LayerNorm(width), Mlp(width, 4 * width)
        self.gamma = nn.Parameter(torch.full((width,), 0.5))  # timm starts at 1e-6; any value imports alike

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.mlp(self.norm(self.conv_dw(x).permute(0, 2, 3, 1))) * self.gamma
        return x + y.permute(0, 3, 1, 2)


class ConvNeXt(nn.Module):
    """timm's convnext_tiny: a 4×4 patchify stem with LayerNorm2d, stages of 3, 3, 9 and 3 blocks
    (96 to 768 channels) with LayerNorm2d and a 2×2 stride-2 convolution between them, and a head
    of mean, LayerNorm, fc (refused: the grammar's head is the fc of the mean)."""

    def __init__(self, depths: tuple[int, ...] = (3, 3, 9, 3), classes: int = 1000):
        super().__init__()
        widths = (96, 192, 384, 768)
        layers: list[nn.Module] = [nn.Conv2d(3, widths[0], 4, 4), LayerNorm2d(widths[0])]
        for i, (depth, width) in enumerate(zip(depths, widths, strict=True)):
            if i:
                layers += [LayerNorm2d(widths[i - 1]), nn.Conv2d(widths[i - 1], width, 2, 2)]
            layers += [ConvNeXtBlock(width) for _ in range(depth)]
        self.stages = nn.Sequential(*layers)
        self.norm, self.fc = nn.LayerNorm(widths[-1]), nn.Linear(widths[-1], classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.norm(self.stages(x).mean((2, 3))))


# ------------------------------------------------------------------------ ResMLP (Touvron et al. 2022)


class Affine(nn.Module):
    """timm's Affine, ResMLP's norm: alpha · x + beta per channel."""

    def __init__(self, width: int):
        super().__init__()
        self.alpha, self.beta = nn.Parameter(torch.ones(1, 1, width)), nn.Parameter(torch.zeros(1, 1, width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.addcmul(self.beta, self.alpha, x)


class ResBlock(nn.Module):
    """timm's ResBlock: a linear layer across tokens and an MLP across channels, each after an
    Affine and scaled by a layer scale."""

    def __init__(self, tokens: int, width: int):
        super().__init__()
        self.norm1, self.linear_tokens, self.norm2 = Affine(width), nn.Linear(tokens, tokens), Affine(width)
        self.mlp_channels = Mlp(width, 4 * width)
        self.ls1, self.ls2 = nn.Parameter(torch.full((width,), 0.1)), nn.Parameter(torch.full((width,), 0.1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.ls1 * self.linear_tokens(self.norm1(x).transpose(1, 2)).transpose(1, 2)
        return x + self.ls2 * self.mlp_channels(self.norm2(x))


class ResMLP(nn.Module):
    """timm's resmlp_12_224: 16×16 patches, width 384, 12 blocks, a final Affine, mean, fc."""

    def __init__(self, size: int, width: int = 384, depth: int = 12, classes: int = 1000):
        super().__init__()
        self.stem = nn.Conv2d(3, width, 16, 16)
        self.blocks = nn.Sequential(*(ResBlock((size // 16) ** 2, width) for _ in range(depth)))
        self.norm, self.head = Affine(width), nn.Linear(width, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.norm(self.blocks(self.stem(x).flatten(2).transpose(1, 2))).mean(1))


# ----------------------------------------------------------------------------- the table


@dataclass(frozen=True)
class Model:
    name: str
    make: Callable[[int], nn.Module]  # of the input's size
    size: int
    quick_size: int
    expected: str  # "exact", or "refused" with what the grammar lacks (in the message)
    why: str = ""


MODELS = [
    Model("resnet18", lambda s: ResNet(False, (2, 2, 2, 2)), 64, 32, "exact"),
    Model("resnet50", lambda s: ResNet(True, (3, 4, 6, 3)), 64, 32, "exact"),
    Model("mobilenet_v2", lambda s: MobileNet(False), 64, 32, "exact"),
    Model("efficientnet_b0", lambda s: MobileNet(True), 64, 32, "exact"),
    Model("vit_tiny_avg", lambda s: VisionTransformer(s, 192, 12, 3, False), 224, 112, "exact"),
    Model("vit_small_avg", lambda s: VisionTransformer(s, 384, 12, 6, False), 224, 112, "exact"),
    Model("mixer_s16", lambda s: MlpMixer(s), 224, 112, "exact"),
    Model("deit_tiny", lambda s: VisionTransformer(s, 192, 12, 3, True), 224, 112, "exact"),
    Model("vgg11", lambda s: VGG11(), 64, 32, "refused", "not that mean"),
    Model("vit_b_16", lambda s: VisionTransformer(s, 768, 12, 12, True), 224, 112, "exact"),
    Model("mixer_small", lambda s: MlpMixer(s, 128, 4, 4), 32, 32, "exact"),
    Model("squeezenet1_0", lambda s: SqueezeNet(), 64, 64, "refused", "is not a routing of the grammar"),
    Model("densenet121", lambda s: DenseNet(), 64, 32, "refused", "is not in the grammar's grid"),
    Model("convmixer_768_32", lambda s: ConvMixer(768, 32, 7, 7, nn.ReLU), 224, 112, "exact"),
    Model("convmixer_small", lambda s: ConvMixer(256, 8, 5, 2, nn.GELU), 32, 32, "exact"),
    Model("convnext_tiny", lambda s: ConvNeXt(), 64, 32, "refused", "not that mean"),
    Model("resmlp_12", lambda s: ResMLP(s), 224, 112, "exact"),
]


def _fastest(call: Callable[[], object], repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        call()
        best = min(best, time.perf_counter() - start)
    return best


def run(model: Model, quick: bool, repeats: int) -> dict[str, object]:
    """One row: what the import gave, the parameters, the logits' difference and the times."""
    size = model.quick_size if quick else model.size
    torch.manual_seed(0)
    original = model.make(size).eval()
    _randomise_norms(original)
    x = input_state((3, size, size))
    row: dict[str, object] = {"model": model.name, "input": f"3x{size}x{size}"}
    row["params"] = sum(p.numel() for p in original.parameters())
    start = time.perf_counter()
    try:
        imported = import_model(original, x, GRAMMAR)
    except ModelImportError as exc:
        row["import s"] = time.perf_counter() - start
        message = str(exc)
        row["outcome"] = "refused"
        row["why"] = message.splitlines()[-1].strip()  # what is missing (the lines before: where)
        row["ok"] = model.expected == "refused" and model.why in message
        return row
    row["import s"] = time.perf_counter() - start
    network = imported.network(load_grammar(GRAMMAR)).eval()
    row["outcome"] = "exact"
    row["params after"] = sum(p.numel() for p in network.parameters())
    inputs = torch.randn(2, 3, size, size, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    with torch.no_grad():
        want, got = original.double()(inputs), network.double()(inputs)
        row["max diff"] = float((want - got).abs().max() / want.abs().max())
        original.float(), network.float()
        inputs = inputs.float()
        row["forward ms"] = 1000 * _fastest(lambda: original(inputs), repeats)
        row["imported ms"] = 1000 * _fastest(lambda: network(inputs), repeats)
    row["ok"] = model.expected == "exact" and row["max diff"] <= TOLERANCE
    return row


def _randomise_norms(model: nn.Module) -> None:
    """Batch norms with random statistics and affine parameters, and ResMLP's Affines at random
    (fresh ones are the identity, which would hide a transfer that mixed them up)."""
    generator = torch.Generator().manual_seed(2)
    for module in model.modules():
        if isinstance(module, Affine):
            with torch.no_grad():
                module.alpha.copy_(1 + 0.1 * torch.randn(module.alpha.shape, generator=generator))
                module.beta.copy_(0.1 * torch.randn(module.beta.shape, generator=generator))
        if isinstance(module, (nn.BatchNorm2d, nn.LayerNorm)):
            with torch.no_grad():
                module.weight.copy_(1 + 0.1 * torch.randn(module.weight.shape, generator=generator))
                module.bias.copy_(0.1 * torch.randn(module.bias.shape, generator=generator))
        if isinstance(module, nn.BatchNorm2d):
            module.running_mean.copy_(0.1 * torch.randn(module.running_mean.shape, generator=generator))
            module.running_var.copy_(1 + 0.1 * torch.rand(module.running_var.shape, generator=generator))


def table(rows: list[dict[str, object]]) -> str:
    def cell(value: object) -> str:
        if isinstance(value, bool):
            return "yes" if value else "**no**"
        if isinstance(value, float):
            return f"{value:.2e}" if value < 0.01 else f"{value:.2f}"
        return f"{value:,}" if isinstance(value, int) else str(value)

    columns = ["model", "input", "outcome", "params", "params after", "max diff", "import s", "forward ms"]
    columns += ["imported ms", "ok"]
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(cell(r.get(c, "")) for c in columns) + " |" for r in rows]
    refused = [f"- {r['model']}: {r['why']}" for r in rows if r["outcome"] == "refused"]
    return "\n".join(lines + (["", "Refused:", *refused] if refused else []))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller inputs")
    parser.add_argument("--models", nargs="+", choices=[m.name for m in MODELS], help="default: all")
    parser.add_argument("--repeats", type=int, default=5, help="forward passes timed (the fastest counts)")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    rows = []
    for model in MODELS:
        if args.models is None or model.name in args.models:
            rows.append(run(model, args.quick, args.repeats))
            print(f"{model.name}: {rows[-1]['outcome']}", file=sys.stderr, flush=True)
    print(table(rows))
    failed = [r["model"] for r in rows if not r["ok"]]
    if failed:
        print(f"\nfailed: {', '.join(map(str, failed))}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

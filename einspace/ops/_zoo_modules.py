"""The torch modules behind the `einspace.ops.zoo` operations: torch's own, and depthwise and
grouped convolutions of their own types (export and import recognise modules by type)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn import GELU, AvgPool2d, Dropout, Hardswish, MaxPool2d, ReLU, ReLU6, SiLU

__all__ = [
    "Affine",
    "ChannelNorm",
    "ClassToken",
    "FirstToken",
    "GELU",
    "AvgPool2d",
    "DepthwiseConv",
    "Dropout",
    "GroupedConv",
    "Hardswish",
    "LayerScale",
    "MaxPool2d",
    "ReLU",
    "ReLU6",
    "SiLU",
    "SqueezeExcite",
]


class DepthwiseConv(nn.Conv2d):
    """One k×k filter per channel (groups = channels), with a bias."""

    def __init__(self, channels: int, k: int, s: int, p: int):
        super().__init__(channels, channels, k, s, p, groups=channels)


class GroupedConv(nn.Conv2d):
    """A k×k convolution C → C in g groups, with a bias."""

    def __init__(self, channels: int, g: int, k: int, s: int, p: int):
        super().__init__(channels, channels, k, s, p, groups=g)


class SqueezeExcite(nn.Module):
    """x times σ(expand(act(reduce(mean over space of x)))), the layers 1×1 convolutions with
    biases (torchvision's SqueezeExcitation: the same parameter names and shapes)."""

    def __init__(self, channels: int, squeezed: int, act: str):
        super().__init__()
        self.act = act
        self.fc1 = nn.Conv2d(channels, squeezed, 1)
        self.fc2 = nn.Conv2d(squeezed, channels, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        act = F.relu if self.act == "relu" else F.silu
        return x * torch.sigmoid(self.fc2(act(self.fc1(x.mean((2, 3), keepdim=True)))))

    def extra_repr(self) -> str:
        return f"act={self.act}"


class LayerScale(nn.Module):
    """x times a learnt scale per feature: `weight` [C, 1, 1] over an image's channels, [D] over
    the last axis of tokens; initialised at 0.1."""

    def __init__(self, features: int, image: bool):
        super().__init__()
        self.weight = nn.Parameter(torch.full((features, 1, 1) if image else (features,), 0.1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.weight

    def extra_repr(self) -> str:
        return f"shape={tuple(self.weight.shape)}"


class Affine(nn.Module):
    """weight · x + bias per feature (timm's Affine, ResMLP's norm): `weight` and `bias` [C, 1, 1]
    over an image's channels, [D] over the last axis of tokens; initialised at 1 and 0. Computed
    with `torch.addcmul`, as timm does, so that an imported Affine gives the same bits."""

    def __init__(self, features: int, image: bool):
        super().__init__()
        shape = (features, 1, 1) if image else (features,)
        self.weight = nn.Parameter(torch.ones(shape))
        self.bias = nn.Parameter(torch.zeros(shape))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.addcmul(self.bias, self.weight, x)

    def extra_repr(self) -> str:
        return f"shape={tuple(self.weight.shape)}"


class ChannelNorm(nn.LayerNorm):
    """LayerNorm over the channels of [B, C, H, W] at each position (eps 1e-6): nn.LayerNorm's
    parameters, applied channels-last."""

    def __init__(self, channels: int):
        super().__init__(channels, eps=1e-6)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)


class ClassToken(nn.Module):
    """A learnt token [1, 1, D] put in front of the tokens of each sample (normal, std 0.02)."""

    def __init__(self, width: int):
        super().__init__()
        self.token = nn.Parameter(0.02 * torch.randn(1, 1, width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([self.token.expand(x.shape[0], -1, -1), x], dim=1)


class FirstToken(nn.Module):
    """The first token, kept as a sequence of one: [B, N, D] -> [B, 1, D]."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x[:, :1]

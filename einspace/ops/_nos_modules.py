"""The torch side of NOS's calibrations (`einspace.ops.nos`, which says what they compute): the
generators and the calibration module."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from einspace.ops.nos import CHANNEL_ATTENTION, DYNAMIC_KERNEL, SPATIAL_ATTENTION

__all__ = ["Calibration", "ChannelAttention", "DynamicKernel", "SpatialAttention"]


def _conv1x1(c_in: int, c_out: int) -> nn.Conv2d:
    return nn.Conv2d(c_in, c_out, 1, bias=False)


class _Generator(nn.Module):
    """A generator: computes the calibration (A(G) or D(G)) from G, its width reduced by the
    reduction of its kind (`einspace.ops.nos`, which also counts its parameters and FLOPs)."""

    reduction: int


class ChannelAttention(_Generator):
    """A(G) of shape (N, C_f, 1, 1), in (0, 1)."""

    reduction = CHANNEL_ATTENTION.reduction

    def __init__(self, c_features: int, c_generator: int, args: Mapping[str, Any]):
        super().__init__()
        hidden = c_generator // self.reduction
        self.reduce = _conv1x1(c_generator, hidden)
        self.expand = _conv1x1(hidden, c_features)

    def forward(self, g: torch.Tensor) -> torch.Tensor:
        pooled = g.mean(dim=(2, 3), keepdim=True)
        return torch.sigmoid(self.expand(F.relu(self.reduce(pooled))))


class SpatialAttention(_Generator):
    """A(G) of shape (N, 1, H, W), in (0, 1)."""

    reduction = SPATIAL_ATTENTION.reduction

    def __init__(self, c_features: int, c_generator: int, args: Mapping[str, Any]):
        super().__init__()
        hidden = c_generator // self.reduction
        self.reduce = _conv1x1(c_generator, hidden)
        self.norm = nn.BatchNorm2d(hidden)
        self.spatial = nn.Conv2d(hidden, 1, 3, padding=1, bias=False)

    def forward(self, g: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(self.spatial(F.relu(self.norm(self.reduce(g)))))


class DynamicKernel(_Generator):
    """D(G) of shape (N, C_f, k, k): per sample and channel, positive taps that sum to 1."""

    reduction = DYNAMIC_KERNEL.reduction

    def __init__(self, c_features: int, c_generator: int, args: Mapping[str, Any]):
        super().__init__()
        hidden = c_generator // self.reduction
        self.k = args["k"]
        self.values = _conv1x1(c_generator, hidden)
        self.norm = nn.BatchNorm2d(hidden)
        self.taps = _conv1x1(c_generator, self.k**2)
        self.expand = _conv1x1(hidden, c_features)

    def forward(self, g: torch.Tensor) -> torch.Tensor:
        u = F.relu(self.norm(self.values(g))).flatten(2)  # (N, C', HW)
        m = torch.softmax(self.taps(g).flatten(2), dim=-1)  # (N, k², HW)
        pooled = torch.bmm(u, m.transpose(1, 2))  # (N, C', k²)
        kernel = self.expand(pooled.unflatten(2, (self.k, self.k)))  # (N, C_f, k, k)
        return torch.softmax(kernel.flatten(2), dim=-1).unflatten(2, (self.k, self.k))


def _depthwise(x: torch.Tensor, kernel: torch.Tensor) -> torch.Tensor:
    """Filter each channel of each sample with its own kernel (N, C, k, k), same size out."""
    n, c, h, w = x.shape
    k = kernel.shape[-1]
    out = F.conv2d(x.reshape(1, n * c, h, w), kernel.reshape(n * c, 1, k, k), padding=k // 2, groups=n * c)
    return out.reshape(n, c, h, w)


class Calibration(nn.Module):
    """F + F · A(G) for attention generators, F + F ⊛ D(G) for dynamic kernels.

    Called with one tensor (the unary form, G = F) or with the list [F, G] (the aggregation).
    """

    def __init__(self, generator: _Generator):
        super().__init__()
        self.generator = generator

    def forward(self, inputs: torch.Tensor | list[torch.Tensor]) -> torch.Tensor:
        f, g = (inputs, inputs) if isinstance(inputs, torch.Tensor) else inputs
        made = self.generator(g)
        if isinstance(self.generator, DynamicKernel):
            return f + _depthwise(f, made)
        return f + f * made

"""The torch modules behind the `einspace.ops.zoo` operations: torch's own, and a depthwise
convolution of its own type (export and import recognise modules by type)."""

from __future__ import annotations

from torch import nn
from torch.nn import GELU, AvgPool2d, Dropout, Hardswish, MaxPool2d, ReLU, ReLU6, SiLU

__all__ = ["GELU", "AvgPool2d", "DepthwiseConv", "Dropout", "Hardswish", "MaxPool2d", "ReLU", "ReLU6", "SiLU"]


class DepthwiseConv(nn.Conv2d):
    """One k×k filter per channel (groups = channels), with a bias."""

    def __init__(self, channels: int, k: int, s: int, p: int):
        super().__init__(channels, channels, k, s, p, groups=channels)

"""The torch modules behind the core operations (tensors carry a batch axis): those torch itself
lacks, and the torch and einops ones the core operations build, so that `einspace.ops.core` reaches
the torch side through this one module, imported at its first build."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import nn
from torch.nn import BatchNorm2d, Identity, LayerNorm, LeakyReLU, Linear, Softmax

__all__ = [
    "Add",
    "BatchNorm2d",
    "ChannelLinear",
    "Clone",
    "Col2Im",
    "Concat",
    "GroupDim",
    "Identity",
    "Im2Col",
    "LayerNorm",
    "LeakyReLU",
    "Linear",
    "MatMul",
    "Permute",
    "PositionalEncoding",
    "Softmax",
]


class Clone(nn.Module):
    """One tensor to `b` references to it; each branch builds on the same values."""

    def __init__(self, b: int):
        super().__init__()
        self.b = b

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        return [x] * self.b

    def extra_repr(self) -> str:
        return f"b={self.b}"


class GroupDim(nn.Module):
    """Split tensor axis `dim` (batch is axis 0) into `b` equal parts."""

    def __init__(self, dim: int, b: int):
        super().__init__()
        self.dim = dim
        self.b = b

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        return list(torch.chunk(x, self.b, dim=self.dim))

    def extra_repr(self) -> str:
        return f"dim={self.dim}, b={self.b}"


class MatMul(nn.Module):
    """Batched product of two branches over their last two axes, optionally times `scale`."""

    def __init__(self, scale: float | None):
        super().__init__()
        self.scale = scale

    def forward(self, xs: list[torch.Tensor]) -> torch.Tensor:
        a, b = xs
        out = torch.matmul(a, b)
        return out if self.scale is None else out * self.scale

    def extra_repr(self) -> str:
        return "" if self.scale is None else f"scale={self.scale:.4g}"


def _dense(x: torch.Tensor) -> bool:
    """Whether x is laid out as a fresh tensor is: row-major, or channels-last for images."""
    return x.is_contiguous() or (x.dim() == 4 and x.is_contiguous(memory_format=torch.channels_last))


class Add(nn.Module):
    """Sum of all branches, accumulated in branch order.

    A sum takes the memory layout of its first operand. When a branch ends in a transposed
    view (the Mixer's token MLP: permute · linear · permute) and the shortcut does not, the
    shortcut goes first, so that the sum, and everything after it, stays dense: otherwise
    the next layer norm and its backward read a transposed tensor (a copy, and slower
    kernels). a + b and b + a are the same floats, so only the layout changes.
    """

    def forward(self, xs: list[torch.Tensor]) -> torch.Tensor:
        out = xs[0]
        for x in xs[1:]:
            out = x + out if not _dense(out) and _dense(x) else out + x  # out is nearly always dense
        return out


class Concat(nn.Module):
    """Concatenation of all branches along tensor axis `dim` (batch is axis 0)."""

    def __init__(self, dim: int):
        super().__init__()
        self.dim = dim

    def forward(self, xs: list[torch.Tensor]) -> torch.Tensor:
        return torch.cat(xs, dim=self.dim)

    def extra_repr(self) -> str:
        return f"dim={self.dim}"


class Im2Col(nn.Module):
    """Sliding k×k patches of [B, C, H, W] as tokens [B, h_out·w_out, C·k·k], features (c, ki, kj)."""

    def __init__(self, k: int, s: int, p: int):
        super().__init__()
        self.k, self.s, self.p = k, s, p

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        patches = F.unfold(x, kernel_size=self.k, padding=self.p, stride=self.s)
        return rearrange(patches, "b d l -> b l d")

    def extra_repr(self) -> str:
        return f"k={self.k}, s={self.s}, p={self.p}"


class Col2Im(nn.Module):
    """Tokens [B, h·w, D] back to an image [B, D, h, w] (the inverse of a 1×1 im2col's order of
    positions): a view, no copy."""

    def __init__(self, h: int, w: int):
        super().__init__()
        self.h, self.w = h, w

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.reshape(x.shape[0], self.h, self.w, x.shape[-1]).permute(0, 3, 1, 2)

    def extra_repr(self) -> str:
        return f"h={self.h}, w={self.w}"


class Permute(nn.Module):
    """Reorder the feature axes: output axis i is input axis `order[i - 1]`, axes counted from 1
    after the batch axis (so `order` is also the tensor's own order after axis 0); a view."""

    def __init__(self, order: tuple[int, ...]):
        super().__init__()
        self.order = tuple(order)

    @property
    def swaps_last_two(self) -> bool:
        """Whether it transposes the last two axes and keeps the others (a key's transpose)."""
        n = len(self.order)
        return n >= 2 and self.order == (*range(1, n - 1), n, n - 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.permute(0, *self.order)

    def extra_repr(self) -> str:
        return f"order={self.order}"


class ChannelLinear(nn.Linear):
    """A linear layer over the channel axis of [B, C, H, W], i.e. a 1×1 convolution.

    It keeps nn.Linear's parameters (weight [d, C], bias [d]) and initialisation, so weights
    copy one-to-one between col-mode and im-mode linears; conv2d is faster than moving the
    channels last and back.
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.conv2d(x, self.weight[:, :, None, None], self.bias)


class PositionalEncoding(nn.Module):
    """A learnable tensor of the feature shape, added to every sample (init N(0, 0.02²))."""

    def __init__(self, shape: tuple[int, ...]):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(1, *shape) * 0.02)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.weight

    def extra_repr(self) -> str:
        return f"shape={tuple(self.weight.shape[1:])}"

"""What an export writes, before it is grouped into classes: an instance per use of a generated class
(its layers, each an attribute with the sizes in its constructor, and its forward lines), and the
fixed helpers some layers need (the NOS calibrations)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch
from torch import nn

from einspace.errors import EinspaceError
from einspace.ops._nos_modules import ChannelAttention, DynamicKernel, SpatialAttention

if TYPE_CHECKING:
    from einspace.network.export.classes import Class

__all__ = ["DEPTHWISE", "DYNAMIC", "HELPERS", "Helper", "Instance", "Layer", "generator_layer"]


@dataclass
class Layer:
    """One attribute set in `__init__`: `template` with a `{}` per slot, slots as (role, value)."""

    attr: str
    template: str
    slots: tuple[tuple[str, int], ...]
    state: dict[str, torch.Tensor]
    child: Instance | None = None


@dataclass(eq=False)
class Instance:
    """One use of a generated class: its layers and forward code with the sizes written out."""

    kind: str
    doc: str
    layers: list[Layer] = field(default_factory=list)
    lines: list[str] = field(default_factory=list)
    counts: Counter[str] = field(default_factory=Counter)
    cls: Class | None = None
    arguments: tuple[int, ...] = ()

    def add(
        self,
        stem: str,
        template: str = "",
        slots: tuple[tuple[str, int], ...] = (),
        state: Mapping[str, torch.Tensor] | None = None,
        child: Instance | None = None,
        numbered: bool = True,
    ) -> str:
        """A new attribute `stem1`, `stem2`, ... (or `stem`); returns `self.<name>`."""
        self.counts[stem] += 1
        attr = f"{stem}{self.counts[stem]}" if numbered else stem
        self.layers.append(Layer(attr, template, slots, dict(state or {}), child))
        return f"self.{attr}"

    def line(self, text: str) -> None:
        self.lines.append(text)


@dataclass(frozen=True, eq=False)
class Helper:
    """A fixed class or function the file needs for some layers (the NOS calibrations)."""

    name: str
    source: str


DEPTHWISE = Helper(
    "depthwise",
    '''def depthwise(x: torch.Tensor, kernel: torch.Tensor) -> torch.Tensor:
    """Filter each channel of each sample with its own k x k kernel [N, C, k, k], same size out."""
    n, c, h, w = x.shape
    k = kernel.shape[-1]
    out = F.conv2d(x.reshape(1, n * c, h, w), kernel.reshape(n * c, 1, k, k), padding=k // 2, groups=n * c)
    return out.reshape(n, c, h, w)''',
)

_CHANNEL = Helper(
    "ChannelAttention",
    '''class ChannelAttention(nn.Module):
    """NOS channel attention: sigmoid(1x1 conv(ReLU(1x1 conv to C_g // 16 (mean of g over H, W))))."""

    def __init__(self, channels: int, generator_channels: int) -> None:
        super().__init__()
        self.reduce = nn.Conv2d(generator_channels, generator_channels // 16, 1, bias=False)
        self.expand = nn.Conv2d(generator_channels // 16, channels, 1, bias=False)

    def forward(self, g: torch.Tensor) -> torch.Tensor:
        pooled = g.mean(dim=(2, 3), keepdim=True)
        return torch.sigmoid(self.expand(F.relu(self.reduce(pooled))))''',
)

_SPATIAL = Helper(
    "SpatialAttention",
    '''class SpatialAttention(nn.Module):
    """NOS spatial attention: sigmoid(3x3 conv to 1 (ReLU(BN(1x1 conv to C_g // 16 (g)))))."""

    def __init__(self, generator_channels: int) -> None:
        super().__init__()
        self.reduce = nn.Conv2d(generator_channels, generator_channels // 16, 1, bias=False)
        self.norm = nn.BatchNorm2d(generator_channels // 16)
        self.spatial = nn.Conv2d(generator_channels // 16, 1, 3, padding=1, bias=False)

    def forward(self, g: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(self.spatial(F.relu(self.norm(self.reduce(g)))))''',
)

DYNAMIC = Helper(
    "DynamicKernel",
    '''class DynamicKernel(nn.Module):
    """NOS dynamic convolution: per sample and channel k x k taps (a softmax) generated from g."""

    def __init__(self, channels: int, generator_channels: int, k: int) -> None:
        super().__init__()
        hidden = generator_channels // 8
        self.k = k
        self.values = nn.Conv2d(generator_channels, hidden, 1, bias=False)
        self.norm = nn.BatchNorm2d(hidden)
        self.taps = nn.Conv2d(generator_channels, k * k, 1, bias=False)
        self.expand = nn.Conv2d(hidden, channels, 1, bias=False)

    def forward(self, g: torch.Tensor) -> torch.Tensor:
        u = F.relu(self.norm(self.values(g))).flatten(2)
        m = torch.softmax(self.taps(g).flatten(2), dim=-1)
        kernel = self.expand(torch.bmm(u, m.transpose(1, 2)).unflatten(2, (self.k, self.k)))
        return torch.softmax(kernel.flatten(2), dim=-1).unflatten(2, (self.k, self.k))''',
)

HELPERS = (DEPTHWISE, _CHANNEL, _SPATIAL, DYNAMIC)


def generator_layer(generator: nn.Module) -> tuple[Helper, tuple[tuple[str, int], ...]]:
    """The helper class that writes a NOS generator, and its constructor's (role, value) slots."""
    if isinstance(generator, ChannelAttention):
        channels = (
            ("channels", generator.expand.out_channels),
            ("generator_channels", generator.reduce.in_channels),
        )
        return _CHANNEL, channels
    if isinstance(generator, SpatialAttention):
        return _SPATIAL, (("generator_channels", generator.reduce.in_channels),)
    if isinstance(generator, DynamicKernel):
        slots = (
            ("channels", generator.expand.out_channels),
            ("generator_channels", generator.values.in_channels),
            ("kernel_size", generator.k),
        )
        return DYNAMIC, slots
    raise EinspaceError(f"export cannot write a calibration by {type(generator).__name__}")

"""What an export writes, before it is grouped into classes: an instance per use of a generated class
(its layers, each an attribute with the sizes in its constructor, and its forward lines), and the
fixed helpers some layers need (the NOS calibrations, the XD-operation)."""

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

__all__ = ["DEPTHWISE", "DYNAMIC", "HELPERS", "XD", "Helper", "Instance", "Layer", "generator_layer"]


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


XD = Helper(
    "XD",
    '''def xd_twiddles(n: int, inverse: bool, scale: float) -> torch.Tensor:
    """Twiddles (log2 n * n/2, 2, 2, 2; complex as re/im): `butterfly_matrix` is then the DFT * scale."""
    stages = n.bit_length() - 1
    sign, per_stage = (1.0 if inverse else -1.0), scale ** (1 / max(stages, 1))
    out = torch.zeros(stages, n // 2, 2, 2, dtype=torch.complex128)
    for s in range(stages):
        j = torch.arange(n // 2, dtype=torch.float64) % (1 << s)
        w = torch.polar(torch.ones_like(j), sign * torch.pi * j / (1 << s))
        out[s, :, 0, 0], out[s, :, 0, 1], out[s, :, 1, 0], out[s, :, 1, 1] = 1, w, 1, -w
    return torch.view_as_real(out * per_stage).reshape(-1, 2, 2, 2).float()


def butterfly_matrix(twiddles: torch.Tensor, n: int) -> torch.Tensor:
    """The n x n complex matrix of a butterfly: bit reversal, then log2(n) factors of n/2 complex 2x2
    blocks (twiddles [log2 n, n/2, 2, 2]), stage s pairing entries j and j + 2^s of blocks of 2^(s+1)."""
    blocks = torch.ones(n, 1, 1, dtype=twiddles.dtype, device=twiddles.device)
    for s in range(n.bit_length() - 1):
        h, groups = 1 << s, n >> (s + 1)
        t = twiddles[s].reshape(groups, h, 2, 2).movedim(-3, -1)
        pairs = blocks.reshape(groups, 1, 2, h, h)
        blocks = (t.unsqueeze(-1) * pairs).transpose(-3, -2).reshape(groups, 2 * h, 2 * h)
    bits = n.bit_length() - 1
    reverse = [int(format(i, f"0{bits}b")[::-1], 2) if bits else 0 for i in range(n)]
    return blocks.reshape(n, n)[:, reverse]


class XD(nn.Module):
    """XD-operation: Real(K diag(C (L w + b)) M x) + bias, a convolution (kernel k, stride s by
    subsampling, zero padding p) whose DFTs are butterflies K, L, M (per spatial axis, on the axis
    padded to a power of two n), with a complex bias b inside the diagonal and channel gates C.
    Complex parameters keep re/im last; a fresh one is the convolution (K = F^-1, L = M = F)."""

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        k: int,
        s: int,
        p: int,
        *size: int,
        channels_last: bool = False,
    ) -> None:
        super().__init__()
        self.k, self.s, self.p, self.size, self.channels_last = k, s, p, size, channels_last
        self.n = [1 << (max(length + p, k) - 1).bit_length() for length in size]
        self.out = [(length + 2 * p - k) // s + 1 for length in size]
        self.K = nn.Parameter(torch.cat([xd_twiddles(n, True, n**-0.5) for n in self.n]))
        self.L = nn.Parameter(torch.cat([xd_twiddles(n, True, 1.0) for n in self.n]))
        self.M = nn.Parameter(torch.cat([xd_twiddles(n, False, n**-0.5) for n in self.n]))
        self.b = nn.Parameter(torch.zeros(*self.n, 2))
        self.C = nn.Parameter(F.pad(torch.ones(out_channels, in_channels, 1), (0, 1)))
        conv = (nn.Conv1d if len(size) == 1 else nn.Conv2d)(in_channels, out_channels, k)
        self.weight, self.bias = conv.weight, conv.bias

    def along_axes(self, packed: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        """The butterflies of `packed` applied along the last len(size) axes of complex z."""
        sizes = [n // 2 * (n.bit_length() - 1) for n in self.n]
        twiddles = torch.view_as_complex(packed).split(sizes)
        first = z.dim() - len(self.n)
        for a, (n, t) in enumerate(zip(self.n, twiddles, strict=True)):
            matrix = butterfly_matrix(t.reshape(-1, n // 2, 2, 2), n).to(z.dtype)
            z = (z.movedim(first + a, -1) @ matrix.T).movedim(-1, first + a)
        return z

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.movedim(-1, 1) if self.channels_last else x
        spatial = [None] * len(self.n)
        complex_type = torch.promote_types(x.dtype, torch.complex64)
        axes = zip(self.size[::-1], self.n[::-1], strict=True)
        pad = [e for length, n in axes for e in (self.p, n - length - self.p)]
        z = self.along_axes(self.M, F.pad(x, pad).to(complex_type))
        taps = F.pad(self.weight, [e for n in self.n[::-1] for e in (0, n - self.k)]).to(complex_type)
        gates = torch.view_as_complex(self.C)[(..., *spatial)]
        diagonal = gates * (self.along_axes(self.L, taps) + torch.view_as_complex(self.b))
        z = self.along_axes(self.K, torch.einsum("bi...,oi...->bo...", z, diagonal))
        rows = [slice(0, (out - 1) * self.s + 1, self.s) for out in self.out]
        y = z[(..., *rows)].real + self.bias[(..., *spatial)]
        return y.movedim(1, -1) if self.channels_last else y''',
)

HELPERS = (DEPTHWISE, _CHANNEL, _SPATIAL, DYNAMIC, XD)


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

"""The torch side of the XD-operation (`einspace.ops.xd`): the module `XDConv` (its butterflies are
in `einspace.ops._xd_butterflies`).

Layout of the parameters of an `XDConv` (all real tensors; complex ones have a trailing
re/im axis of 2):

- `weight` (c_out, c_in, k, ...) and `bias` (c_out,): the model weights, as in a convolution;
- architecture parameters (`einspace.ops.trainable`): `K`, `L`, `M` hold the twiddles of the
  per-axis butterflies, concatenated over the axes, (sum_a log2(n_a) n_a / 2, 2, 2, 2); `b`
  (n_1, ..., n_N, 2) the complex bias inside the diagonal; `C` (c_out, c_in, 2) the complex
  channel gates.

So the count is c_out c_in k^N + c_out + 2 c_out c_in + 2 prod(n_a) + 3 sum_a 4 n_a log2(n_a).

Small axes apply their butterfly as a dense matrix multiplied out once per forward pass (it does
not depend on the batch, and a matrix product is much faster on CPU than log2(n) elementwise
passes); axes from `BLOCKED_MIN` points as two
passes of small dense blocks (`butterfly_blocks`: the same factors regrouped, n (m + r)
multiply-adds per line, m r = n); axes beyond `DENSE_MAX` apply the factors one at a time, in
O(n log n).

The dense and two-pass products run in real arithmetic on separate real and imaginary planes
(`_ComplexProduct`; a real input or output takes half the products): a GEMM reads a transposed
view of its operands for free, so each axis' transform consumes one end of the tensor's axes and
puts its result at the other, and (B, c_in, *input) reaches the frequency-major (*n, B, c_in) of
the channel mix, and from there (B, c_out, *out), with no transposing copy on dense axes, in
forward or backward (a two-pass axis copies its lines into the grid of the first pass on the M
side and reorders the K side's result; on a square grid the frequencies in between stay in the
order the passes leave them, `_Axis.residue_major`). That is the CPU's path. On CUDA, where a
step this small is bound by kernel launches, `XDConv._xd_complex` computes the same operation in
native complex arithmetic (one kernel per complex product, where real planes take two to four).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, NamedTuple

import torch
from torch import Tensor, nn
from torch.autograd.function import once_differentiable

from einspace.ops._xd_butterflies import (
    LAUNCH_BOUND,
    butterfly,
    butterfly_blocks,
    butterfly_matrix,
    dft_twiddles,
)
from einspace.ops.trainable import mark_architecture
from einspace.ops.xd import fourier_sizes

__all__ = [
    "BLOCKED_MIN",
    "DENSE_MAX",
    "NARROW",
    "XDConv",
    "butterfly",
    "butterfly_blocks",
    "butterfly_matrix",
    "dft_twiddles",
]

#: Axes of at most this many points apply their butterfly as matrices multiplied out once per
#: forward pass (one dense matrix below `BLOCKED_MIN`, the two passes of `butterfly_blocks` from
#: there); larger axes apply the factors one at a time.
DENSE_MAX = 2048
#: Axes of at least this many points apply their butterfly in two passes of dense blocks (n (m + r)
#: multiply-adds per line, m r = n) rather than as one n x n matrix (n^2), and hold n (m + r)
#: entries instead of n^2. Measured on CPU (one thread, batch 32, 32 channels, a training step of
#: a 1-d XD): 2.4x faster than the dense matrix at 1024 points, 5.5x at 2048.
BLOCKED_MIN = 512
#: MKL's GEMM (measured on an AMD EPYC, one thread) is several times slower at a long result of
#: fewer columns than this (the K side of a strided XD: 7 columns) than at its transpose.
NARROW = 16


class _Axis(NamedTuple):
    """One axis' butterfly: its size, twiddles and, for a dense axis, its matrix, for a blocked
    axis the two passes of `butterfly_blocks`."""

    n: int
    twiddles: Tensor
    matrix: Tensor | None
    blocks: tuple[Tensor, Tensor] | None = None

    def _residue_major(self) -> bool:
        """Whether the frequencies between the M and K sides are stored in the order the two passes
        leave them, residue-major (frequency q' m + j at j r + q'), not in their own order: on a
        square grid (m = r) that is the (c, a) grid the K side's first pass reads, so neither side
        reorders them (the diagonal's b is stored so too)."""
        return self.blocks is not None and self.blocks[0].shape[-3] == self.blocks[1].shape[-3]

    residue_major = property(_residue_major)  # not decorated: mutmut skips decorated functions

    def stored(self, frequencies: Tensor, dim: int) -> Tensor:
        """Values by frequency along `dim`, in the order this axis stores its frequencies."""
        if not self.residue_major:
            return frequencies
        m = self.blocks[1].shape[-3]
        order = torch.arange(self.n, device=frequencies.device).reshape(m, m).T.reshape(-1)
        return frequencies.index_select(dim, order)


#: A complex tensor as its real and imaginary parts, the second None for a real tensor.
Planes = tuple[Tensor, Tensor | None]


def _column_major(t: Tensor) -> bool:
    """Whether t's matrices are stored transposed (a GEMM reads them so at no cost)."""
    return t.stride(-2) == 1 and t.stride(-1) != 1


def _unit_stride(t: Tensor) -> bool:
    """Whether t's matrices are stored by rows or by columns (a GEMM reads either at no cost)."""
    return t.stride(-1) == 1 or t.stride(-2) == 1


def _products(
    terms: Sequence[tuple[Tensor | None, Tensor | None, int]], like: Tensor | None = None
) -> Tensor | None:
    """The sum of sign * a @ b over the terms (a, b, sign) with both factors present, in a fresh
    tensor laid out as `like` (column-major matrices if it is: the gradient of a transposed view
    then needs no copy upstream). Each term accumulates in place, with no temporary; a long
    matrix of fewer than `NARROW` columns is computed transposed and copied back."""
    present = [(a, b, sign) for a, b, sign in terms if a is not None and b is not None]
    if not present:
        return None
    if like is not None and _column_major(like):
        return _products([(b.mT, a.mT, sign) for a, b, sign in present]).mT
    first, second, _ = present[0]
    if first.dim() == 2 and second.shape[-1] < NARROW <= first.shape[-2]:
        return _products([(b.mT, a.mT, sign) for a, b, sign in present]).mT.contiguous()
    out = first.new_empty(*first.shape[:-1], second.shape[-1])
    for i, (a, b, sign) in enumerate(present):
        accumulate = out.addmm_ if out.dim() == 2 else out.baddbmm_
        accumulate(a, b, beta=1 if i else 0, alpha=sign)
    return out


class _ComplexProduct(torch.autograd.Function):
    """(ar + i ai) @ (br + i bi) on real planes, as torch.matmul (2-d, or batched 3-d), ai or bi
    None for a real factor; only the real part when `real`.

    Complex tensors interleave re/im: the layouts the transforms need would take transposing
    copies, and their backward conjugates with more. Planes are plain GEMM operands in any
    transposed view, and the hand-written backward accumulates each gradient in place, in the
    layout of its input, so that autograd adds no copies or sums of its own."""

    @staticmethod
    def forward(
        ctx: Any, ar: Tensor, ai: Tensor | None, br: Tensor, bi: Tensor | None, real: bool
    ) -> tuple[Tensor, Tensor | None]:
        ctx.set_materialize_grads(False)
        ctx.save_for_backward(ar, ai, br, bi)
        re = _products([(ar, br, 1), (ai, bi, -1)])
        return re, None if real else _products([(ar, bi, 1), (ai, br, 1)])

    def _backward(ctx: Any, gr: Tensor | None, gi: Tensor | None) -> Any:
        # d/dA = G B^H and d/dB = A^H G, with G = gr + i gi.
        ar, ai, br, bi = ctx.saved_tensors
        # gradients from complex arithmetic downstream (the blocked axes) arrive as strided views of
        # a complex tensor; batched GEMMs would fall back to one product per matrix on them
        gr, gi = (g if g is None or _unit_stride(g) else g.contiguous() for g in (gr, gi))
        need = ctx.needs_input_grad

        def t(x: Tensor | None) -> Tensor | None:
            return None if x is None else x.mT

        return (
            _products([(gr, t(br), 1), (gi, t(bi), 1)], ar) if need[0] else None,
            _products([(gi, t(br), 1), (gr, t(bi), -1)], ai) if need[1] else None,
            _products([(t(ar), gr, 1), (t(ai), gi, 1)], br) if need[2] else None,
            _products([(t(ar), gi, 1), (t(ai), gr, -1)], bi) if need[3] else None,
            None,
        )

    # wrapped, not decorated: mutmut (scripts/mutation.py) skips functions with decorators other
    # than one @staticmethod or @classmethod
    backward = staticmethod(once_differentiable(_backward))


def _complex_mm(a: Planes, b: Planes, real: bool = False) -> Planes:
    return _ComplexProduct.apply(*a, *b, real)


def _planes(a: Tensor) -> Planes:
    """A small complex matrix as contiguous planes (GEMMs want unit-stride operands)."""
    return a.real.contiguous(), a.imag.contiguous()


def _staged(lines: Tensor, axis: _Axis, place: int, keep: slice = slice(None)) -> Tensor:
    """Rows `keep` of the butterfly applied stage by stage to complex `lines` (..., length), zero-extended
    to n with their entries from index `place`."""
    full = lines.new_zeros(*lines.shape[:-1], axis.n)
    full[..., place : place + lines.shape[-1]] = lines
    return butterfly(full, axis.twiddles)[..., keep]


def _block_grid(p: Tensor, r: int, place: int) -> Tensor:
    """Real plane p (..., length), zero-extended along its last axis with its entries from `place`,
    as the first pass of `butterfly_blocks` reads it: (r, a, L), rows a0.. (a0 = place // r, up
    to the last row holding an entry) of the (m, r) grid of entries a r + c, over the L lines of
    the other axes. One copy (the lines of a strided input do not merge into one axis anyway)."""
    length, rest = p.shape[-1], p.shape[:-1]
    a0, a1 = place // r, -(-(place + length) // r)
    grid = p.new_zeros((a1 - a0) * r, *rest)
    grid[place - a0 * r : place - a0 * r + length] = p.movedim(-1, 0)
    return grid.reshape(a1 - a0, r, -1).transpose(0, 1)


def _two_passes(x: Planes, axis: _Axis, a0: int, keep: slice, real: bool) -> Planes:
    """The butterfly in two passes of blocks (`butterfly_blocks`) on x (r, a, L), rows a0.. of the
    (m, r) grid (the rows that hold entries): (m, q', L), output q' m + j at [j, q'], for the block
    rows q' that hold rows `keep` (from 0); only the real part when `real`.

    In real planes, as the dense path: a real input (the M side) takes two products in the first
    pass instead of four, a real output (the K side) two in the second."""
    first, second = axis.blocks
    m = second.shape[-3]
    stop = axis.n if keep.stop is None else keep.stop
    q1 = -(-stop // m)
    u = _complex_mm(_planes(first[:, :, a0 : a0 + x[0].shape[1]]), x)  # (c, j, L)
    # u's (c, L) matrices are unit-stride: the GEMMs read its transpose (j, c, L) as it is
    return _complex_mm(_planes(second[:, :q1]), tuple(p.transpose(0, 1) for p in u), real)


def _first_columns(axis: _Axis, k: int) -> Tensor:
    """The butterfly's first k columns (n, k): it applied to the first k unit vectors."""
    if axis.matrix is not None:
        return axis.matrix[:, :k]
    eye = torch.eye(k, dtype=axis.twiddles.real.dtype, device=axis.twiddles.device)
    if axis.blocks is not None:
        return _complex(_to_front((eye, None), axis, 0))
    return _staged(_complex((eye, None)), axis, 0).T


def _complex(z: Planes) -> Tensor:
    """Planes as one complex tensor, for the stage-by-stage path."""
    re, im = z
    return re.to(torch.promote_types(re.dtype, torch.complex64)) if im is None else torch.complex(re, im)


def _to_front(z: Planes, axis: _Axis, place: int) -> Planes:
    """The butterfly along z's last axis (zero-extended to n with its entries from `place`), its
    result put first: the M side, a matrix product A @ z^T on the (other axes) x (last axis) view."""
    length, rest = z[0].shape[-1], z[0].shape[:-1]
    if axis.blocks is not None:
        r = axis.blocks[0].shape[-3]
        grid = tuple(None if p is None else _block_grid(p, r, place) for p in z)
        y = _two_passes(grid, axis, place // r, slice(None), real=False)
        if axis.residue_major:
            z = tuple(p.reshape(axis.n, -1) for p in y)  # a view
        else:
            z = tuple(p.transpose(0, 1).reshape(axis.n, -1) for p in y)  # frequency q' m + j first
    elif axis.matrix is None:
        out = _staged(_complex(z).reshape(-1, length), axis, place).T
        z = (out.real, out.imag)
    else:
        lines = tuple(None if p is None else p.reshape(-1, length).T for p in z)
        z = _complex_mm(_planes(axis.matrix[:, place : place + length]), lines)
    return tuple(p.reshape(-1, *rest) for p in z)


def _to_back(z: Planes, axis: _Axis, keep: slice, real: bool) -> Planes:
    """Rows `keep` of the butterfly along z's first axis, its result put last: the K side, z^T @ A^T
    on the (first axis) x (other axes) view; only the real part when `real`."""
    length, rest = z[0].shape[0], z[0].shape[1:]
    if axis.blocks is not None:
        # the (m, r) grid of the first axis, as the first pass reads it: (c, a, L), a view
        r = axis.blocks[0].shape[-3]
        if axis.residue_major:
            x = tuple(p.reshape(r, length // r, -1) for p in z)
        else:
            x = tuple(p.reshape(length // r, r, -1).transpose(0, 1) for p in z)
        y = _two_passes(x, axis, 0, keep, real)
        z = tuple(None if p is None else p.permute(2, 1, 0).reshape(p.shape[2], -1)[:, keep] for p in y)
    elif axis.matrix is None:
        out = _staged(_complex(z).reshape(length, -1).T, axis, 0, keep)
        z = (out.real, None if real else out.imag)
    else:
        lines = tuple(p.reshape(length, -1).T for p in z)
        z = _complex_mm(lines, tuple(p.T for p in _planes(axis.matrix[keep])), real)
    return tuple(None if p is None else p.reshape(*rest, -1) for p in z)


def _front(z: Tensor, axis: _Axis, place: int) -> Tensor:
    """The butterfly along complex z's last axis, zero-extended to n with its entries from `place`,
    its result put first: (..., length) -> (n, ...), the GPU path's `_to_front`. A dense axis is one
    product reading z's lines transposed; a two-pass axis reads only the rows of the (m, r) grid
    that hold entries."""
    length, rest = z.shape[-1], z.shape[:-1]
    if axis.matrix is not None:
        return (axis.matrix[:, place : place + length] @ z.reshape(-1, length).T).reshape(axis.n, *rest)
    if axis.blocks is None:
        padded = nn.functional.pad(z, (place, axis.n - length - place))
        return butterfly(padded, axis.twiddles).movedim(-1, 0)
    first, second = axis.blocks  # first[c, j, a] and second[j, q, c]: `butterfly_blocks`
    r = first.shape[-3]
    a0, a1 = place // r, -(-(place + length) // r)
    lines = nn.functional.pad(z, (place - a0 * r, a1 * r - place - length))  # rows a0..a1 of the grid
    u = torch.bmm(first[:, :, a0:a1], lines.reshape(-1, a1 - a0, r).permute(2, 1, 0))  # (c, j, L)
    y = torch.bmm(second, u.transpose(0, 1))  # (j, q, L): frequency q m + j
    return y.transpose(0, 1).reshape(axis.n, *rest)


def _back(z: Tensor, axis: _Axis, keep: slice) -> Tensor:
    """Rows `keep` (from 0) of the butterfly along complex z's first axis, put last: (n, ...) ->
    (..., rows), the GPU path's `_to_back`; a two-pass axis computes only the block rows it keeps."""
    if axis.matrix is not None:
        return (z.reshape(axis.n, -1).T @ axis.matrix[keep].T).reshape(*z.shape[1:], -1)
    if axis.blocks is None:
        return butterfly(z.movedim(0, -1), axis.twiddles)[..., keep]
    first, second = axis.blocks
    r, m = first.shape[-3], second.shape[-3]
    q1 = -(-(axis.n if keep.stop is None else keep.stop) // m)
    u = torch.bmm(first, z.reshape(m, r, -1).transpose(0, 1))  # entry a r + c at [c, a]: (c, j, L)
    y = torch.bmm(second[:, :q1], u.transpose(0, 1))  # (j, q, L): output q m + j
    return y.permute(2, 1, 0).reshape(*z.shape[1:], q1 * m)[..., keep]


# ----------------------------------------------------------------------------- the module


def _packed(twiddles: Sequence[Tensor], dtype: torch.dtype) -> Tensor:
    """Per-axis complex twiddles as one real tensor (sum of log2(n) n/2, 2, 2, 2)."""
    return torch.view_as_real(torch.cat([t.reshape(-1, 2, 2) for t in twiddles])).to(dtype)


class XDConv(nn.Module):
    """A 1-d or 2-d XD-operation on (B, c_in, *input_size), to (B, c_out, *out_size), like a
    convolution with kernel k, stride s (by subsampling the output) and zero padding p.

    Initialised at the convolution: K = F^-1, L = F (the unscaled conjugate DFT, which also
    turns PyTorch's cross-correlation into a convolution), M = F, b = 0, C = ones; K and M are
    unitary-scaled so that their product is exactly F^-1 (.) F. The weights and the bias start
    as a fresh nn.Conv's. `channels_last` takes and returns (B, *input_size, c_in) instead
    (col mode: tokens first, features last).
    """

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: int,
        input_size: Sequence[int],
        stride: int = 1,
        padding: int = 0,
        bias: bool = True,
        channels_last: bool = False,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ):
        super().__init__()
        if len(input_size) not in (1, 2):
            raise ValueError(f"XDConv works on 1 or 2 spatial axes, got input size {tuple(input_size)}")
        self.in_channels, self.out_channels = in_channels, out_channels
        self.kernel_size, self.stride, self.padding = kernel_size, stride, padding
        self.input_size = tuple(int(s) for s in input_size)
        self.channels_last = channels_last
        self.out_size = tuple((size + 2 * padding - kernel_size) // stride + 1 for size in self.input_size)
        if min(self.out_size) < 1:
            raise ValueError(
                f"kernel {kernel_size} does not fit the input {self.input_size} padded by {padding}"
            )
        self.fourier = fourier_sizes(self.input_size, kernel_size, padding)
        real = dtype or torch.get_default_dtype()
        make = {"device": device, "dtype": real}
        count = sum(n // 2 * (n.bit_length() - 1) for n in self.fourier)
        self.K = nn.Parameter(torch.empty(count, 2, 2, 2, **make))
        self.L = nn.Parameter(torch.empty(count, 2, 2, 2, **make))
        self.M = nn.Parameter(torch.empty(count, 2, 2, 2, **make))
        self.b = nn.Parameter(torch.empty(*self.fourier, 2, **make))
        self.C = nn.Parameter(torch.empty(out_channels, in_channels, 2, **make))
        kernel = (kernel_size,) * len(self.input_size)
        self.weight = nn.Parameter(torch.empty(out_channels, in_channels, *kernel, **make))
        self.bias = nn.Parameter(torch.empty(out_channels, **make)) if bias else None
        if self.K.device.type != "meta":  # meta tensors hold no values: nothing to initialise
            self.reset_parameters()
        mark_architecture(self, "K", "L", "M", "b", "C")

    def reset_parameters(self) -> None:
        """Back to the convolution point, with the weights and bias a fresh nn.Conv would have."""
        dtype = self.K.dtype
        with torch.no_grad():
            for name, inverse, unitary in (("K", True, True), ("L", True, False), ("M", False, True)):
                twiddles = [dft_twiddles(n, inverse, n**-0.5 if unitary else 1.0) for n in self.fourier]
                getattr(self, name).copy_(_packed(twiddles, dtype))
            self.b.zero_()
            self.C.zero_()
            self.C[..., 0] = 1
            bound = 1 / math.sqrt(self.weight[0].numel())  # nn.Conv's kaiming_uniform(a=sqrt 5), bias
            nn.init.uniform_(self.weight, -bound, bound)
            if self.bias is not None:
                nn.init.uniform_(self.bias, -bound, bound)

    @classmethod
    def from_conv(
        cls,
        weight: Tensor,
        bias: Tensor | None,
        stride: int,
        padding: int,
        input_size: Sequence[int],
        channels_last: bool = False,
    ) -> XDConv:
        """The XD-operation equal to the convolution with these weights (c_out, c_in, k[, k])."""
        c_out, c_in, *kernel = weight.shape
        if len(set(kernel)) != 1 or len(kernel) != len(input_size):
            raise ValueError(
                f"need a square kernel over {len(input_size)} axes, got weight {tuple(weight.shape)}"
            )
        xd = cls(
            c_in,
            c_out,
            kernel[0],
            input_size,
            stride=stride,
            padding=padding,
            bias=bias is not None,
            channels_last=channels_last,
            device=weight.device,
            dtype=weight.dtype,
        )
        with torch.no_grad():
            xd.weight.copy_(weight)
            if bias is not None:
                xd.bias.copy_(bias)
        return xd

    def _butterflies(self) -> tuple[list[_Axis], list[_Axis], list[_Axis]]:
        """Per-axis K, L and M; a dense or blocked axis multiplies out its three matrices (or
        pairs of block passes) in one batch."""
        sizes = [n // 2 * (n.bit_length() - 1) for n in self.fourier]
        split = [torch.view_as_complex(p).split(sizes) for p in (self.K, self.L, self.M)]
        per_axis = zip(*split, strict=True)
        k_axes, l_axes, m_axes = [], [], []
        for n, twiddles in zip(self.fourier, per_axis, strict=True):
            stacked = torch.stack(twiddles).reshape(3, n.bit_length() - 1, n // 2, 2, 2)
            matrices = blocks = (None, None, None)
            if max(BLOCKED_MIN, 4) <= n <= DENSE_MAX:
                blocks = tuple(zip(*butterfly_blocks(stacked, n), strict=True))
            elif n <= DENSE_MAX:
                matrices = butterfly_matrix(stacked, n)
            every = zip((k_axes, l_axes, m_axes), stacked, matrices, blocks, strict=True)
            for axes, t, matrix, pair in every:
                axes.append(_Axis(n, t, matrix, pair))
        return k_axes, l_axes, m_axes

    def _diagonal(self, l_axes: Sequence[_Axis]) -> Planes:
        """C (L w + b) for every frequency, as planes (prod(n), c_in, c_out): what multiplies M x.

        L is applied one axis at a time to the taps gated by C (linear in both), the last axis
        with b beside it: per frequency f of the earlier axes, [L_N's first k columns | b[f]] @
        [taps[f]; C], one batched product. 2-d, k = 3 on 64 x 64: n k (k + n (k + 1)) c_in c_out
        complex multiply-adds, 2.4x fewer than the Kronecker product of the axes' columns
        beside b, n^2 (k^2 + 1) c_in c_out."""
        k, c_in, c_out = self.kernel_size, self.in_channels, self.out_channels
        columns = [_first_columns(a, k) for a in l_axes]  # (n_a, k) each
        gates = torch.view_as_complex(self.C).T  # (c_in, c_out)
        taps = self.weight.reshape(c_out, c_in, -1).permute(2, 1, 0) * gates  # (k^N, c_in, c_out)
        taps = taps.reshape(k, -1)  # (k, k^(N-1) c_in c_out): the first axis' taps first
        if len(l_axes) == 2:
            taps = _complex(_complex_mm(_planes(columns[0]), _planes(taps)))  # (n_1, k c_in c_out)
        earlier, n = math.prod(self.fourier[:-1]), self.fourier[-1]
        bias = torch.view_as_complex(self.b)
        for dim, axis in enumerate(l_axes):
            bias = axis.stored(bias, dim)  # the columns of L come in that order already
        left = torch.cat([columns[-1].expand(earlier, n, k), bias.reshape(earlier, n, 1)], -1)
        right = torch.cat([taps.reshape(earlier, k, -1), gates.reshape(1, 1, -1).expand(earlier, 1, -1)], 1)
        diagonal = _complex_mm(_planes(left), _planes(right))  # (earlier, n, c_in c_out)
        return tuple(p.view(-1, c_in, c_out) for p in diagonal)

    def forward(self, x: Tensor) -> Tensor:
        # Complex products have no reduced-precision kernels: under autocast (mixed-precision
        # training on CUDA) the operation runs in its parameters' precision.
        kind = x.device.type
        xd = self._xd_complex if kind in LAUNCH_BOUND else self._xd
        if kind in ("cpu", "cuda") and torch.is_autocast_enabled(kind):
            with torch.autocast(kind, enabled=False):
                return xd(x.to(self.weight.dtype))
        return xd(x.to(self.weight.dtype))

    def _xd_complex(self, x: Tensor) -> Tensor:
        """The operation in native complex arithmetic, for devices whose steps are bound by kernel
        launches at these sizes (GPUs): a complex product is one kernel where `_xd`'s real planes
        take two to four. As there, each transform consumes the last axis and puts its result
        first (`_front`, `_back`), so that the channel mix and the output need no transposing copy."""
        dims = len(self.fourier)
        k_axes, l_axes, m_axes = self._butterflies()
        x = x.movedim(-1, 1) if self.channels_last else x
        z = x.to(torch.promote_types(x.dtype, torch.complex64))  # (B, c_in, *input)
        for axis in reversed(m_axes):
            z = _front(z, axis, self.padding)  # ends as (*n, B, c_in)
        # the diagonal C (L w + b) at every frequency, L one axis at a time on the k taps
        taps = self.weight.to(z.dtype)  # (c_out, c_in, *k)
        for axis in reversed(l_axes):
            taps = _front(taps, axis, 0)  # ends as (*n, c_out, c_in)
        bias = torch.view_as_complex(self.b)[..., None, None]
        diagonal = torch.view_as_complex(self.C) * (taps + bias)
        # the channels mix at each frequency: (prod n, B, c_in) @ (prod n, c_in, c_out)
        frequencies, batch = math.prod(self.fourier), x.shape[0]
        z = z.reshape(frequencies, batch, self.in_channels)
        z = torch.bmm(z, diagonal.reshape(frequencies, self.out_channels, self.in_channels).mT)
        z = z.reshape(*self.fourier, batch, self.out_channels)
        for axis, out in zip(k_axes, self.out_size, strict=True):
            z = _back(z, axis, slice(0, (out - 1) * self.stride + 1, self.stride))  # ends (B, c_out, *out)
        y = z.real
        if self.bias is not None:
            y = y + self.bias.reshape(-1, *[1] * dims)
        return y.movedim(1, -1) if self.channels_last else y

    def _xd(self, x: Tensor) -> Tensor:
        spatial = len(self.fourier)
        k_axes, l_axes, m_axes = self._butterflies()
        batch = x.shape[0]
        # M, last spatial axis first: each transform consumes the last axis and puts its result
        # first, so that (B, c_in, *input) ends as (*n, B, c_in), frequency-major as the
        # channel mix wants it, with no transposing copy (a GEMM reads transposed operands).
        z: Planes = (x.movedim(-1, 1) if self.channels_last else x, None)
        for axis in reversed(m_axes):
            z = _to_front(z, axis, self.padding)
        # The channels mix at each frequency: a batch of (B x c_in) @ (c_in x c_out) products, in
        # planes (one native complex64 bmm, with the copies to and from planes, made the whole step
        # 1.3-1.6x slower on CPU; one real product of the stacked [[re, im], [-im, re]] form too).
        z = tuple(p.reshape(-1, batch, self.in_channels) for p in z)
        z = _complex_mm(z, self._diagonal(l_axes))
        z = tuple(p.reshape(*self.fourier, batch, self.out_channels) for p in z)
        # K, first axis first, each result put last: (*n, B, c_out) -> (B, c_out, *out), cropped to
        # the output rows (with the stride) and, on the last axis, to the real part.
        for a, (axis, out) in enumerate(zip(k_axes, self.out_size, strict=True)):
            rows = slice(0, (out - 1) * self.stride + 1, self.stride)
            z = _to_back(z, axis, rows, real=a == spatial - 1)
        y = z[0]
        if self.bias is not None:
            y = y + self.bias.reshape(-1, *[1] * spatial)
        return y.movedim(1, -1) if self.channels_last else y

    def extra_repr(self) -> str:
        return (
            f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, stride={self.stride}, "
            f"padding={self.padding}, input_size={self.input_size}, fourier={self.fourier}, "
            f"bias={self.bias is not None}, channels_last={self.channels_last}"
        )

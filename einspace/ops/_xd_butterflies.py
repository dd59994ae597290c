"""Butterflies, the learnable DFTs of the XD-operation (`einspace.ops._xd_modules`).

A butterfly here is one K-matrix factor chain: the fixed bit-reversal permutation followed by
log2(n) butterfly factors, each n/2 independent complex 2x2 blocks (the radix-2
decimation-in-time FFT when initialised to its twiddles, `dft_twiddles`). `butterfly` applies it
stage by stage; `butterfly_matrix` multiplies it out as a dense matrix, `butterfly_blocks` as
two passes of small dense blocks (the same factors regrouped). On GPUs the factors are
multiplied out as a product tree (`_factor_blocks`), in a handful of kernel launches.
"""

from __future__ import annotations

import functools
import math

import torch
from torch import Tensor

__all__ = ["LAUNCH_BOUND", "butterfly", "butterfly_blocks", "butterfly_matrix", "dft_twiddles"]

#: Devices whose XD steps are bound by kernel launches, and which run complex arithmetic well: they
#: take the paths with fewer, larger kernels (the product tree here, `XDConv._xd_complex`). Meta
#: (shapes only) takes them too, standing in for CUDA where operations are counted. Other devices
#: (the CPU; MPS and XPU, whose complex support varies) take the real-arithmetic paths.
LAUNCH_BOUND = ("cuda", "meta")


def _bit_reversed(n: int) -> tuple[int, ...]:
    """The bit-reversal permutation of range(n), n a power of two (the order the FFT's stages leave)."""
    bits = n.bit_length() - 1
    return tuple(int(format(i, f"0{bits}b")[::-1], 2) for i in range(n))  # n = 1: format(0, "00b") = "0"


# cached by wrapping, not by decorating: mutmut (scripts/mutation.py) skips decorated functions
_bit_reversal = functools.cache(_bit_reversed)


def _reversal_index(n: int, device: torch.device) -> Tensor:
    """The bit-reversal permutation as an index tensor on `device`. Indexing with a Python list
    copies the list to the device at every call, which a CUDA graph cannot capture."""
    return torch.tensor(_bit_reversal(n), dtype=torch.long, device=device)


_reversal = functools.cache(_reversal_index)


def dft_twiddles(n: int, inverse: bool = False, scale: float = 1.0) -> Tensor:
    """Complex128 twiddles (log2 n, n/2, 2, 2) that make `butterfly` the DFT of length n times `scale`.

    Stage s pairs entries j and j + h (h = 2^s) of each block of 2h and maps (a, c) to
    (a + w^j c, a - w^j c), w = exp(-+2 pi i / 2h) (+ for the inverse): the radix-2
    decimation-in-time FFT. `scale` is spread evenly over the stages, so that a unitary scale
    (n^-1/2) keeps every factor unitary too.
    """
    if n < 1 or n & (n - 1):
        raise ValueError(f"a butterfly needs a power-of-two size, got {n}")
    stages = n.bit_length() - 1
    per_stage = scale ** (1 / stages) if stages else 1.0
    sign = 1.0 if inverse else -1.0
    out = torch.empty(stages, n // 2, 2, 2, dtype=torch.complex128)
    for s in range(stages):
        h = 1 << s
        j = torch.arange(n // 2, dtype=torch.float64) % h
        w = torch.polar(torch.ones_like(j), sign * math.pi * j / h)
        out[s, :, 0, 0] = 1
        out[s, :, 0, 1] = w
        out[s, :, 1, 0] = 1
        out[s, :, 1, 1] = -w
    return out * per_stage


def butterfly(x: Tensor, twiddles: Tensor) -> Tensor:
    """B x along the last axis of complex `x` (size n): bit-reversal, then the log2(n) factors
    whose 2x2 blocks are `twiddles` (log2 n, n/2, 2, 2), block g*h + j pairing j and j + h of
    block g at stage s (h = 2^s)."""
    n = x.shape[-1]
    lead = x.shape[:-1]
    x = x.index_select(-1, _reversal(n, x.device))
    for s, blocks in enumerate(twiddles):
        h = 1 << s
        t = blocks.reshape(n // (2 * h), h, 2, 2).permute(0, 2, 3, 1)  # (group, row, column, j)
        pairs = x.reshape(*lead, n // (2 * h), 1, 2, h)
        x = (t[:, :, 0] * pairs[..., 0, :] + t[:, :, 1] * pairs[..., 1, :]).reshape(*lead, n)
    return x


def _factor_blocks(twiddles: Tensor, n: int) -> Tensor:
    """The product of the butterfly factors in `twiddles` (..., stages, n/2, 2, 2), without the bit
    reversal, as its n / 2^stages diagonal blocks (..., n / 2^stages, 2^stages, 2^stages).

    Stage by stage (about 2 n^2 multiplies per stage), or on `LAUNCH_BOUND` devices as a tree of
    dense block products (`_factor_blocks_by_products`): more arithmetic, but a GPU step of an
    XD-operation this size is bound by kernel launches, and the tree takes a handful instead of ~16
    a stage."""
    if twiddles.device.type in LAUNCH_BOUND:
        return _factor_blocks_by_products(twiddles, n)
    return _factor_blocks_by_stages(twiddles, n)


def _factor_blocks_by_stages(twiddles: Tensor, n: int) -> Tensor:
    """`_factor_blocks` stage by stage: after stage s the product is block-diagonal with blocks of
    2h = 2^(s+1), block g being [[D00 X, D01 Y], [D10 X, D11 Y]] for the previous blocks X, Y and
    the diagonal twiddle matrices D; one broadcast product per stage."""
    batch = twiddles.shape[:-4]
    blocks = torch.ones(*batch, n, 1, 1, dtype=twiddles.dtype, device=twiddles.device)
    for s in range(twiddles.shape[-4]):
        h = 1 << s
        groups = n // (2 * h)
        t = twiddles[..., s, :, :, :].reshape(*batch, groups, h, 2, 2).movedim(-3, -1)  # (g, row, col, j)
        pairs = blocks.reshape(*batch, groups, 1, 2, h, h)
        blocks = (t.unsqueeze(-1) * pairs).transpose(-3, -2).reshape(*batch, groups, 2 * h, 2 * h)
    return blocks


def _tree_order(levels: int) -> list[int]:
    """The order of 2^levels factors (stage numbers) in which the product tree of
    `_factor_blocks_by_products` multiplies the first half by the second at every level and ends
    with the later stages on the left: [1, 0], [3, 1, 2, 0], [7, 3, 5, 1, 6, 2, 4, 0], ..."""
    order = [0]
    for _ in range(levels):
        order = [2 * i + 1 for i in order] + [2 * i for i in order]
    return order


def _factor_layout(n: int, stages: int, batch: int) -> Tensor:
    """Where each entry of the dense factors comes from, for `_factor_blocks_by_products`: an index
    into the flattened (batch, stages n/2 2 2 + 2) source, each row its stages' twiddles then 0 and
    1, for every entry of the factors as diagonal blocks (stages', batch, n / 2^stages, 2^stages,
    2^stages). stages' is the next power of two (the factors beyond `stages` are identities) and
    the factors come in `_tree_order`, so that each level of the tree is one batched product of
    the first half by the second, both contiguous.

    Factor s holds twiddle (g h + j, row, col) at row g 2h + row h + j, column g 2h + col h + j
    (h = 2^s; `butterfly`'s pairing of j and j + h in block g)."""
    size = 1 << stages
    blocks = n // size
    row_length = 2 * n * stages + 2  # a batch row of the source: the twiddles, 0 and 1
    levels = (stages - 1).bit_length() if stages > 1 else 0
    cpu = torch.device("cpu")  # made here once, then moved: not under another default device
    index = torch.full((1 << levels, blocks, size, size), row_length - 2, dtype=torch.long, device=cpu)
    pair = torch.arange(n // 2, device=cpu)
    diagonal = torch.arange(size, device=cpu)
    for place, s in enumerate(_tree_order(levels)):
        if s >= stages:
            index[place, :, diagonal, diagonal] = row_length - 1
            continue
        h = 1 << s
        start = 2 * h * (pair // h) + pair % h
        for row in range(2):
            for col in range(2):
                i, j = start + row * h, start + col * h
                index[place, i // size, i % size, j % size] = 4 * (s * (n // 2) + pair) + 2 * row + col
    rows = torch.arange(batch, device=cpu).reshape(1, batch, 1, 1, 1) * row_length
    return (index.unsqueeze(1) + rows).reshape(-1)


def _factor_index(n: int, stages: int, batch: int, device: torch.device) -> Tensor:
    return _factor_layout(n, stages, batch).to(device)


_factor_indices = functools.cache(_factor_index)


def _factor_blocks_by_products(twiddles: Tensor, n: int) -> Tensor:
    """`_factor_blocks` as a tree: every factor as dense diagonal blocks in one gather, then the
    first half of the factors times the second, log2(stages) batched products in all."""
    batch, stages = twiddles.shape[:-4], twiddles.shape[-4]
    size = 1 << stages
    flat = twiddles.reshape(math.prod(batch), stages * 2 * n)
    source = torch.cat([flat, flat.new_zeros(len(flat), 1), flat.new_ones(len(flat), 1)], -1)
    factors = source.reshape(-1).index_select(0, _factor_indices(n, stages, len(flat), twiddles.device))
    factors = factors.reshape(-1, size, size)  # (stages', rows) blocks, stages' outermost
    blocks = len(flat) * (n // size)
    while len(factors) > blocks:  # split, not sliced: its backward is one concatenation
        factors = torch.bmm(*factors.split(len(factors) // 2))
    return factors.reshape(*batch, n // size, size, size)


def butterfly_matrix(twiddles: Tensor, n: int) -> Tensor:
    """The n x n complex matrices of `butterfly` for twiddles (..., log2 n, n/2, 2, 2), multiplied
    out (differentiable; on CPU stage by stage, ~2 n^2 multiplies in all: `_factor_blocks`)."""
    blocks = _factor_blocks(twiddles, n)
    return blocks.reshape(*blocks.shape[:-3], n, n).index_select(-1, _reversal(n, blocks.device))


def butterfly_blocks(twiddles: Tensor, n: int) -> tuple[Tensor, Tensor]:
    """The butterfly of `butterfly_matrix` as two passes of small dense blocks, exactly (the same
    sums, regrouped): with m = 2^s1 (s1 = the first half of the log2 n stages), n / m = r,

    - the bit reversal and the first s1 stages act within the r contiguous blocks of m entries
      of the reversed input; block q reads input column rev_r(q) of the (m, r) view, rows in
      reversed order: `first` (r, m, m), first[c] mapping x[:, c] of the (m, r) view to block
      rev_r(c);
    - the later stages pair entries h >= m apart, so they keep the residue j mod m: for each j an
      r x r matrix over the blocks; `second` (m, r, r), second[j] mapping the first pass'
      entries j, in the order c, to outputs q' m + j.

    For twiddles (..., log2 n, n/2, 2, 2) the result has the same leading axes. A matrix-vector
    product then costs n (m + r) multiply-adds instead of n^2."""
    stages = n.bit_length() - 1
    s1 = (stages + 1) // 2
    m, r = 1 << s1, n >> s1
    first = _factor_blocks(twiddles[..., :s1, :, :, :], n)  # (..., r, m, m): block q
    first = first.index_select(-3, _reversal(r, first.device)).index_select(-1, _reversal(m, first.device))
    later = twiddles[..., s1:, :, :, :]
    batch = later.shape[:-4]
    # stage s >= s1 (h = 2^s): block g h + j' with j' = (u mod h / m) m + j pairs entries of residue j
    per_residue = later.reshape(*batch, stages - s1, n // (2 * m), m, 2, 2).movedim(-3, -5)
    second = _factor_blocks(per_residue, r).squeeze(-3)  # (..., m, r, r): over q for each residue
    return first, second.index_select(-1, _reversal(r, second.device))

"""XD-operations (einspace.ops.xd, einspace.ops._xd_modules): sizes, counts and refusals at their
boundaries, against hand computations and plain torch.

Written in the mutation-testing round (scripts/mutation.py): the Fourier size is checked where
size + p is exactly a power of two and where the kernel decides it, parameter and FLOP counts on
axes of different sizes (so that no two terms can be swapped unseen) with and without bias, every
argument and the kernel fit at their boundary, and the built operation against F.conv2d and
F.conv1d with a stride and padding that differ; from the fourth round, an input of another
precision and another default device; from the fifth, the functions mutmut first reached once they
lost their decorators: the bit reversal, residue-major axes and the complex product's backward.
"""

from __future__ import annotations

import math
import re
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

import einspace.ops._xd_butterflies as butterflies
import einspace.ops._xd_modules as xd_module
from einspace.errors import EinspaceError, Infeasible
from einspace.ops import canonical_args, get_op
from einspace.ops._xd_modules import XDConv, butterfly, butterfly_matrix, dft_twiddles
from einspace.ops.xd import fourier_sizes, xd_flops, xd_parameter_count
from einspace.state import COL, IM, FeatureState


def _power_of_two_at_least(value: int) -> int:
    n = 1
    while n < value:
        n *= 2
    return n


@pytest.mark.parametrize(
    "sizes, k, p",
    [((14,), 3, 2), ((15,), 3, 2), ((16,), 1, 0), ((17,), 1, 0), ((3,), 5, 0), ((3, 9), 8, 0), ((1,), 1, 0)],
)
def test_fourier_size_is_the_smallest_power_of_two_holding_the_padded_axis_and_the_kernel(
    sizes, k, p
) -> None:
    assert fourier_sizes(sizes, k, p) == tuple(_power_of_two_at_least(max(s + p, k)) for s in sizes)


def test_fourier_sizes_at_exact_powers_of_two() -> None:
    assert fourier_sizes((14, 30), 3, 2) == (16, 32)
    assert fourier_sizes((15, 31), 3, 2) == (32, 64)
    assert fourier_sizes((2, 2), 8, 0) == (8, 8)


def _count_by_hand(c_in: int, c_out: int, k: int, fourier: tuple[int, ...], bias: bool) -> int:
    """Weight, bias, C (complex), b (complex per frequency), and K, L, M: per axis log2(n) stages
    of n/2 complex 2x2 blocks (8 real numbers each)."""
    stages = {1: 0, 2: 1, 4: 2, 8: 3, 16: 4, 32: 5, 64: 6}
    blocks = sum(stages[n] * n // 2 * 8 for n in fourier)
    return (
        c_out * c_in * k ** len(fourier)
        + (c_out if bias else 0)
        + 2 * c_out * c_in
        + 2 * math.prod(fourier)
        + 3 * blocks
    )


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize(
    "c_in, c_out, k, size, p", [(3, 5, 3, (6, 30), 1), (2, 7, 5, (11,), 2), (4, 1, 1, (1, 3), 0)]
)
def test_parameter_count_by_hand_and_of_the_module(c_in, c_out, k, size, p, bias) -> None:
    module = XDConv(c_in, c_out, k, size, padding=p, bias=bias)
    fourier = module.fourier
    by_hand = _count_by_hand(c_in, c_out, k, fourier, bias)
    assert xd_parameter_count(c_in, c_out, k, fourier, bias) == by_hand
    assert sum(t.numel() for t in module.parameters()) == by_hand
    assert (module.bias is None) is not bias


def test_flops_by_hand_on_two_axes_of_different_sizes() -> None:
    """3 -> 5 channels on an 8 x 32 grid (log2: 3 and 5), output 7 x 30: each of the 8 channel
    transforms 16 * 256 * (3 + 5); 8 * 5 * 3 * 256 for diagonal and gates; 5 * 210 biases."""
    assert xd_flops(3, 5, (8, 32), (7, 30)) == 8 * 16 * 256 * 8 + 8 * 15 * 256 + 5 * 210
    assert xd_flops(4, 2, (1,), (1,)) == 8 * 2 * 4 + 2


#: (state, args, output shape, Fourier sizes): strides and paddings that differ, both modes.
GEOMETRY = [
    (FeatureState((3, 9, 13), IM), {"d": 4, "k": 3, "s": 2, "p": 1}, (4, 5, 7), (16, 16)),
    (FeatureState((2, 6, 11), IM), {"d": 3, "k": 5, "s": 3, "p": 2}, (3, 2, 4), (8, 16)),
    (FeatureState((10, 3), COL), {"d": 5, "k": 3, "s": 2, "p": 0}, (4, 5), (16,)),
    (FeatureState((7, 2), COL), {"d": 3, "k": 4, "s": 1, "p": 3}, (10, 3), (16,)),
]


@pytest.mark.parametrize("state, args, shape, fourier", GEOMETRY, ids=[str(g[0]) for g in GEOMETRY])
def test_operation_shape_counts_and_values_against_plain_torch(state, args, shape, fourier) -> None:
    op = get_op("xd")
    assert op.infer((state,), args) == (state._replace(shape=shape),)
    torch.manual_seed(0)
    module = op.build((state,), args).double()
    assert module.fourier == fourier and module.channels_last is (state.mode == COL)
    c_in = state.shape[0] if state.mode == IM else state.shape[1]
    spatial = shape[1:] if state.mode == IM else shape[:1]
    assert op.param_count((state,), args) == _count_by_hand(c_in, args["d"], args["k"], fourier, True)
    assert op.flops((state,), args) == xd_flops(c_in, args["d"], fourier, spatial)
    x = torch.randn(2, *state.shape, dtype=torch.float64)
    conv = F.conv2d if state.mode == IM else F.conv1d
    if state.mode == COL:
        expected = conv(x.transpose(1, 2), module.weight, module.bias, args["s"], args["p"]).transpose(1, 2)
    else:
        expected = conv(x, module.weight, module.bias, args["s"], args["p"])
    torch.testing.assert_close(module(x), expected, rtol=1e-5, atol=1e-6)  # twiddles rounded to float32


@pytest.mark.parametrize(
    "state, args, message",
    [
        (FeatureState((3, 3, 9), IM), {"d": 2, "k": 6, "s": 1, "p": 1},
         "xd kernel 6 larger than the padded input 5x11 of im[3x3x9]"),
        (FeatureState((4, 3), COL), {"d": 2, "k": 7, "s": 1, "p": 1},
         "xd kernel 7 larger than the padded input 6 of col[4x3]"),
    ],
)  # fmt: skip
def test_the_kernel_must_fit_the_padded_input(state, args, message) -> None:
    op = get_op("xd")
    fits = {**args, "k": args["k"] - 1}  # as large as the padded input: one output position
    (out,) = op.infer((state,), fits)
    assert 1 in out.shape
    for call in (op.infer, op.build, op.param_count, op.flops):
        with pytest.raises(Infeasible, match=f"^{re.escape(message)}$"):
            call((state,), args)


def test_arguments_at_their_boundaries() -> None:
    op = get_op("xd")
    least = {"d": 1, "k": 1, "s": 1, "p": 0}
    assert dict(canonical_args(op, least)) == least
    for name, value, phrase in (("d", 0, ">= 1"), ("k", 0, ">= 1"), ("s", 0, ">= 1"), ("p", -1, ">= 0")):
        with pytest.raises(EinspaceError, match=f"argument '{name}' of 'xd' = {value}: must be {phrase}$"):
            canonical_args(op, {**least, name: value})
    assert op.description == "XD-operation: a convolution whose DFTs are learnt butterfly (K-)matrices"
    assert op.exportable is True


def test_xdconv_refuses_what_it_cannot_compute() -> None:
    with pytest.raises(ValueError, match=r"works on 1 or 2 spatial axes, got input size \(4, 4, 4\)"):
        XDConv(2, 2, 3, (4, 4, 4))
    with pytest.raises(ValueError, match=r"kernel 5 does not fit the input \(3, 8\) padded by 0"):
        XDConv(2, 2, 5, (3, 8))
    XDConv(2, 2, 5, (3, 8), padding=1)  # 3 + 2 = 5: fits
    with pytest.raises(ValueError, match="power-of-two size, got 6"):
        dft_twiddles(6)
    with pytest.raises(ValueError, match="power-of-two size, got 0"):
        dft_twiddles(0)
    with pytest.raises(ValueError, match=r"need a square kernel over 2 axes, got weight \(2, 3, 3, 5\)"):
        XDConv.from_conv(torch.zeros(2, 3, 3, 5), None, 1, 1, (8, 8))
    with pytest.raises(ValueError, match=r"need a square kernel over 1 axes, got weight \(2, 3, 3, 3\)"):
        XDConv.from_conv(torch.zeros(2, 3, 3, 3), None, 1, 1, (8,))


@pytest.mark.parametrize(
    "n, inverse, scale", [(8, False, 1.0), (16, True, 1.0), (4, False, 0.5), (1, True, 2.0)]
)
def test_twiddles_make_the_dft_matrix(n: int, inverse: bool, scale: float) -> None:
    """butterfly(eye) against the DFT matrix exp(-+2 pi i j k / n) written out, times the scale
    (for n = 1, no stage: the identity, unscaled)."""
    j = torch.arange(n, dtype=torch.float64)
    sign = 1.0 if inverse else -1.0
    dft = torch.polar(torch.ones(n, n, dtype=torch.float64), sign * 2 * math.pi * j[:, None] * j / n)
    got = butterfly(torch.eye(n, dtype=torch.complex128), dft_twiddles(n, inverse, scale))
    torch.testing.assert_close(got, dft.T * (scale if n > 1 else 1.0))


def test_from_conv_is_that_convolution_with_and_without_bias() -> None:
    torch.manual_seed(1)
    weight, bias = torch.randn(4, 3, 3, 3, dtype=torch.float64), torch.randn(4, dtype=torch.float64)
    x = torch.randn(2, 3, 7, 6, dtype=torch.float64)
    for b in (bias, None):
        xd = XDConv.from_conv(weight, b, 2, 1, (7, 6))
        assert xd.weight.dtype == torch.float64 and (xd.bias is None) is (b is None)
        assert (xd.stride, xd.padding, xd.kernel_size, xd.out_size) == (2, 1, 3, (4, 3))
        torch.testing.assert_close(xd(x), F.conv2d(x, weight, b, stride=2, padding=1))
    tokens = torch.randn(2, 9, 3, dtype=torch.float64)
    xd = XDConv.from_conv(weight[:, :, 0], bias, 1, 2, (9,), channels_last=True)
    expected = F.conv1d(tokens.transpose(1, 2), weight[:, :, 0], bias, padding=2).transpose(1, 2)
    torch.testing.assert_close(xd(tokens), expected)


def test_extra_repr_names_the_geometry() -> None:
    xd = XDConv(2, 3, 3, (5, 6), stride=2, padding=1, bias=False, channels_last=True)
    assert xd.extra_repr() == (
        "2, 3, kernel_size=3, stride=2, padding=1, input_size=(5, 6), fourier=(8, 8), bias=False, "
        "channels_last=True"
    )


def test_butterfly_acts_on_the_last_axis_of_any_batch_shape() -> None:
    x = torch.randn(2, 3, 8, dtype=torch.complex128)
    torch.testing.assert_close(butterfly(x, dft_twiddles(8)), torch.fft.fft(x))


@pytest.mark.parametrize("spatial, k, p", [((3,), 5, 2), ((2,), 3, 3), ((3, 2), 5, 2)])
def test_two_pass_path_with_a_padding_past_the_first_block_row(monkeypatch, spatial, k, p) -> None:
    """Two-pass blocks on axes of 8 (rows of r = 2): a padding of 2 or 3 puts the input from the
    second row of the grid on, which the M side must place there."""
    monkeypatch.setattr(xd_module, "BLOCKED_MIN", 4)
    torch.manual_seed(2)
    weight = torch.randn(3, 2, *(k,) * len(spatial), dtype=torch.float64)
    bias = torch.randn(3, dtype=torch.float64)
    xd = XDConv.from_conv(weight, bias, 1, p, spatial)
    assert set(xd.fourier) == {8}
    x = torch.randn(2, 2, *spatial, dtype=torch.float64)
    conv = F.conv1d if len(spatial) == 1 else F.conv2d
    torch.testing.assert_close(xd(x), conv(x, weight, bias, padding=p))


def test_from_conv_keeps_the_weights_device() -> None:
    weight = torch.empty(2, 3, 3, 3, device="meta")
    xd = XDConv.from_conv(weight, torch.empty(2, device="meta"), 1, 1, (8, 8))
    assert all(p.is_meta for p in xd.parameters())


def test_stage_by_stage_path_with_an_axis_of_one_point(monkeypatch) -> None:
    """An axis of one point has no butterfly stage: its transform is the identity, complex still."""
    monkeypatch.setattr(xd_module, "DENSE_MAX", 0)
    weight, bias = torch.randn(3, 2, 1, 1, dtype=torch.float64), torch.randn(3, dtype=torch.float64)
    xd = XDConv.from_conv(weight, bias, 1, 0, (1, 5))
    assert xd.fourier == (1, 8)
    x = torch.randn(2, 2, 1, 5, dtype=torch.float64)
    torch.testing.assert_close(xd(x), F.conv2d(x, weight, bias))


def test_dense_path_with_an_axis_of_one_point() -> None:
    assert butterfly_matrix(dft_twiddles(1), 1).dtype == torch.complex128
    weight, bias = torch.randn(3, 2, 1, 1, dtype=torch.float64), torch.randn(3, dtype=torch.float64)
    xd = XDConv.from_conv(weight, bias, 1, 0, (5, 1))
    x = torch.randn(2, 2, 5, 1, dtype=torch.float64)
    torch.testing.assert_close(xd(x), F.conv2d(x, weight, bias))


@pytest.mark.parametrize("arithmetic", ["complex", "planes"])
@pytest.mark.parametrize("path", ["dense", "blocked", "staged"])
def test_every_path_keeps_to_the_parameters_device(monkeypatch, path: str, arithmetic: str) -> None:
    """On the meta device (shapes only) every intermediate must be made there too: meta takes the
    GPU's complex path; the CPU's real planes are sent there by hand."""
    monkeypatch.setattr(xd_module, "BLOCKED_MIN", 4 if path == "blocked" else 512)
    monkeypatch.setattr(xd_module, "DENSE_MAX", 0 if path == "staged" else 2048)
    if arithmetic == "planes":
        monkeypatch.setattr(XDConv, "_xd_complex", XDConv._xd)
    xd = XDConv(2, 3, 3, (14, 6), padding=1, device="meta")  # 16 x 8: a square two-pass grid
    y = xd(torch.empty(2, 2, 14, 6, device="meta"))
    assert y.is_meta and y.shape == (2, 3, 14, 6)


@pytest.mark.parametrize("dtype, given", [(torch.float64, torch.float32), (torch.float32, torch.bfloat16)])
def test_an_input_of_another_precision_runs_in_the_parameters_precision(dtype, given) -> None:
    """Outside autocast too, the input is cast to the parameters' precision (the real-plane GEMMs
    take one dtype): the result is that convolution of the cast input, in that precision."""
    torch.manual_seed(3)
    xd = XDConv(3, 2, 3, (6, 5), stride=2, padding=1, dtype=dtype)
    x = torch.randn(2, 3, 6, 5).to(given)
    y = xd(x)
    assert y.dtype == dtype
    expected = F.conv2d(x.to(dtype), xd.weight, xd.bias, stride=2, padding=1)
    torch.testing.assert_close(y, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("path", ["dense", "blocked", "staged"])
def test_intermediates_follow_the_input_not_the_default_device(monkeypatch, path: str) -> None:
    """With another default device set (as `torch.set_default_device("cuda")` does; here meta, on a
    machine without a GPU), an operation on CPU makes every intermediate on CPU: the square
    two-pass grid (16 points, m = r = 4) reorders b with an index that must be made there too."""
    monkeypatch.setattr(xd_module, "BLOCKED_MIN", 4 if path == "blocked" else 512)
    monkeypatch.setattr(xd_module, "DENSE_MAX", 0 if path == "staged" else 2048)
    torch.manual_seed(4)
    weight, bias = torch.randn(3, 2, 3, 3, dtype=torch.float64), torch.randn(3, dtype=torch.float64)
    xd = XDConv.from_conv(weight, bias, 1, 1, (14, 6))
    with torch.no_grad():
        xd.b.copy_(torch.randn_like(xd.b))  # b != 0: the order it is read in matters
    x = torch.randn(2, 2, 14, 6, dtype=torch.float64)
    expected = xd(x)
    with torch.device("meta"):
        y = xd(x)
    assert y.device.type == "cpu"
    torch.testing.assert_close(y, expected, rtol=0, atol=0)


def _reversed_bits(i: int, bits: int) -> int:
    """i with its `bits` low bits in reverse order, bit by bit."""
    return sum(((i >> b) & 1) << (bits - 1 - b) for b in range(bits))


@pytest.mark.parametrize("n, bits", [(1, 0), (2, 1), (4, 2), (8, 3), (16, 4), (128, 7)])
def test_bit_reversal_reverses_the_bits_of_each_index(n: int, bits: int) -> None:
    """Against the bits reversed one by one; the uncached function itself, whose cached wrapper
    (`_bit_reversal`) may hold values from earlier calls."""
    expected = tuple(_reversed_bits(i, bits) for i in range(n))
    assert butterflies._bit_reversed(n) == expected
    assert butterflies._bit_reversal(n) == expected
    assert sorted(expected) == list(range(n))


@pytest.mark.parametrize("n, square", [(16, True), (64, True), (8, False), (32, False)])
def test_an_axis_is_residue_major_on_a_square_grid_of_blocks_only(n: int, square: bool) -> None:
    """Two passes of m x m and r x r blocks, m r = n: m = r = sqrt(n) exactly when log2 n is even;
    a dense axis (no blocks) keeps its frequencies in their own order."""
    twiddles = dft_twiddles(n)
    blocks = butterflies.butterfly_blocks(twiddles, n)
    assert xd_module._Axis(n, twiddles, None, blocks).residue_major is square
    assert xd_module._Axis(n, twiddles, butterfly_matrix(twiddles, n), None).residue_major is False


def _complex_product_gradients(planes, grads, needs):
    """The gradients of sum(Re(A B) gr + Im(A B) gi) for the inputs in `needs`, by autograd
    through torch's complex matmul: independent of the hand-written real-plane backward."""
    leaves = [None if p is None else p.detach().clone().requires_grad_() for p in planes]
    ar, ai, br, bi = leaves
    a = torch.complex(ar, torch.zeros_like(ar) if ai is None else ai)
    b = torch.complex(br, torch.zeros_like(br) if bi is None else bi)
    out = a @ b
    gr, gi = grads
    loss = (out.real * gr).sum() + (0 if gi is None else (out.imag * gi).sum())
    wanted = [leaf for leaf, need in zip(leaves, needs, strict=True) if need]
    found = iter(torch.autograd.grad(loss, wanted))
    return [next(found) if need else None for need in needs]


@pytest.mark.parametrize("batch", [(), (3,)])
@pytest.mark.parametrize("transposed", ["a", "b"])
@pytest.mark.parametrize("imaginary", ["both", "a", "b"])
@pytest.mark.parametrize("real", [False, True])
@pytest.mark.parametrize(
    "needs", [(True, True, True, True), (True, False, False, True), (False, True, True, False)]
)
def test_complex_product_backward_is_the_complex_gradient_in_each_inputs_layout(
    batch, transposed, imaginary, real, needs
) -> None:
    """_ComplexProduct's backward called as autograd calls it: each needed gradient against the
    complex-matmul one, None for an input that needs none (or is None), and laid out as its input
    (one side given column-major, the other row-major), so that autograd copies nothing."""
    torch.manual_seed(0)

    def planes(rows: int, columns: int, column_major: bool) -> list[torch.Tensor]:
        if column_major:
            return [torch.randn(*batch, columns, rows, dtype=torch.float64).mT for _ in range(2)]
        return [torch.randn(*batch, rows, columns, dtype=torch.float64) for _ in range(2)]

    ar, ai = planes(5, 3, transposed == "a")
    br, bi = planes(3, 4, transposed == "b")
    ai, bi = (None if imaginary == "b" else ai), (None if imaginary == "a" else bi)
    planes = (ar, ai, br, bi)
    needs = tuple(need and plane is not None for need, plane in zip(needs, planes, strict=True))
    gr = torch.randn(*batch, 5, 4, dtype=torch.float64)
    gi = None if real else torch.randn(*batch, 5, 4, dtype=torch.float64)
    ctx = SimpleNamespace(saved_tensors=planes, needs_input_grad=(*needs, False))
    got = xd_module._ComplexProduct.backward(ctx, gr, gi)
    assert len(got) == 5 and got[4] is None
    expected = _complex_product_gradients(planes, (gr, gi), needs)
    for plane, grad, want in zip(planes, got[:4], expected, strict=True):
        if want is None or grad is None:  # None: a zero gradient (ai's when only real parts meet)
            assert grad is None and (want is None or not want.any())
            continue
        torch.testing.assert_close(grad, want)
        assert grad.stride(-2) == 1 if plane.stride(-2) == 1 else grad.stride(-1) == 1

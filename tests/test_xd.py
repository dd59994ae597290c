"""XD-operations: butterflies are the FFT at initialisation, the warm start is exactly the
convolution (forward and backward, every (k, s, p) of the grammar's grid, 1-d and 2-d), the
registry contract, and the architecture parameters can leave the convolution."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

import einspace.ops._xd_butterflies as butterflies
import einspace.ops._xd_modules as xd_module
from einspace import compile_network
from einspace.errors import Infeasible
from einspace.evaluators.base import Result, Task, run_task
from einspace.ops import get_op
from einspace.ops._xd_modules import XDConv, butterfly, butterfly_blocks, butterfly_matrix, dft_twiddles
from einspace.ops.trainable import architecture_parameters
from einspace.ops.xd import xd_flops, xd_parameter_count
from einspace.seeds.architectures import act, computation, network, seq
from einspace.state import COL, IM, FeatureState
from einspace.tree import to_text

#: The (k, s, p) grid of im2col in grammars/einspace.pcfg.
GRID = [(1, 1, 0), (1, 2, 0), (3, 1, 1), (3, 2, 1), (4, 4, 0), (8, 8, 0), (16, 16, 0)]
ARCHITECTURE = {"K", "L", "M", "b", "C"}


@pytest.fixture(autouse=True)
def _seeded_single_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    yield
    torch.set_num_threads(threads)


def relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).norm() / b.norm()).item()


def take_path(monkeypatch: pytest.MonkeyPatch, path: str) -> None:
    """Send an XD-operation on CPU down a path by the words in `path`: "staged" (no matrices),
    "blocked" (two-pass blocks from 4 points), "products" (the factors multiplied out as a tree,
    as on CUDA), "complex" (the GPU path: native complex arithmetic, with the tree)."""
    if "staged" in path:
        monkeypatch.setattr(xd_module, "DENSE_MAX", 0)
    if "blocked" in path:
        monkeypatch.setattr(xd_module, "BLOCKED_MIN", 4)
    if "products" in path or "complex" in path:
        monkeypatch.setattr(butterflies, "_factor_blocks", butterflies._factor_blocks_by_products)
    if "complex" in path:
        monkeypatch.setattr(XDConv, "_xd", XDConv._xd_complex)


# ----------------------------------------------------------------------------- butterflies


@pytest.mark.parametrize("length, n", [(1, 1), (3, 4), (5, 8), (37, 64), (100, 128)])
def test_butterfly_at_init_is_the_fft_of_the_zero_padded_axis(length: int, n: int):
    x = torch.randn(4, length, dtype=torch.complex128)
    padded = F.pad(torch.view_as_real(x), (0, 0, 0, n - length))
    padded = torch.view_as_complex(padded.contiguous())
    assert (butterfly(padded, dft_twiddles(n)) - torch.fft.fft(x, n=n)).abs().max() < 1e-12
    inverse = butterfly(padded, dft_twiddles(n, inverse=True, scale=1 / n))
    assert (inverse - torch.fft.ifft(x, n=n)).abs().max() < 1e-12
    unitary = butterfly(padded, dft_twiddles(n, scale=n**-0.5))
    assert (unitary - torch.fft.fft(x, n=n, norm="ortho")).abs().max() < 1e-12


@pytest.mark.parametrize("n", [1, 2, 16, 64])
def test_dense_matrix_multiplies_out_the_same_factors(n: int):
    """The dense form (small axes) and the stage-by-stage form (large axes) are one matrix, for
    any twiddles, and at init the DFT matrix."""
    twiddles = torch.randn(dft_twiddles(n).shape, dtype=torch.complex128)
    by_stages = butterfly(torch.eye(n, dtype=torch.complex128), twiddles).T
    assert (butterfly_matrix(twiddles, n) - by_stages).abs().max() < 1e-12
    dft = torch.fft.fft(torch.eye(n, dtype=torch.complex128), dim=0)
    assert (butterfly_matrix(dft_twiddles(n), n) - dft).abs().max() < 1e-12
    batched = butterfly_matrix(torch.stack([twiddles, dft_twiddles(n)]), n)
    assert (batched[0] - by_stages).abs().max() < 1e-12 and (batched[1] - dft).abs().max() < 1e-12


@pytest.mark.parametrize("n", [4, 8, 32, 128, 1024])
def test_two_pass_blocks_are_the_dense_matrix(n: int):
    """`butterfly_blocks` regroups the same factors: for any twiddles, the first pass (bit reversal
    and the first stages, per column of the (m, r) view) then the second (per residue) is the matrix."""
    twiddles = torch.randn(dft_twiddles(n).shape, dtype=torch.complex128)
    first, second = butterfly_blocks(twiddles, n)
    m, r = second.shape[0], first.shape[0]
    x = torch.randn(3, n, dtype=torch.complex128)
    u = torch.einsum("cja,lac->lcj", first, x.reshape(3, m, r))
    y = torch.einsum("jqc,lcj->lqj", second, u).reshape(3, n)
    dense = butterfly_matrix(twiddles, n)
    assert ((y - x @ dense.T).abs().max() / dense.abs().max()).item() < 1e-12


@pytest.mark.parametrize("n, stages", [(1, 0), (2, 1), (8, 0), (8, 3), (16, 2), (64, 5), (64, 6), (128, 7)])
@pytest.mark.parametrize("batch", [(), (3,), (2, 3)])
def test_product_tree_multiplies_out_the_same_blocks_as_the_stages(
    n: int, stages: int, batch: tuple[int, ...]
):
    """The GPU's product tree (every factor gathered as dense blocks, multiplied pairwise; a stage
    count that is not a power of two padded with identities) equals the CPU's stage-by-stage product
    for the first `stages` stages of any twiddles, in value and in gradient."""
    twiddles = torch.randn(*batch, stages, n // 2, 2, 2, dtype=torch.complex128, requires_grad=True)
    by_stages = butterflies._factor_blocks_by_stages(twiddles, n)
    by_products = butterflies._factor_blocks_by_products(twiddles, n)
    assert by_products.shape == by_stages.shape == (*batch, n >> stages, 1 << stages, 1 << stages)
    assert (by_products - by_stages).abs().max() < 1e-12
    if not stages:
        return  # no twiddles: the identity
    upstream = torch.randn_like(by_stages)
    (expected,) = torch.autograd.grad(by_stages, twiddles, upstream)
    (grad,) = torch.autograd.grad(by_products, twiddles, upstream)
    assert (grad - expected).abs().max() < 1e-12


def test_the_operation_runs_in_complex_arithmetic_on_launch_bound_devices_only(monkeypatch):
    """The CPU takes the real-plane path, CUDA the native complex one (here meta, which stands in for
    it; a GPU-free test cannot make CUDA tensors)."""
    assert xd_module.LAUNCH_BOUND == ("cuda", "meta")
    calls = []
    complex_path = XDConv._xd_complex
    monkeypatch.setattr(
        XDConv, "_xd_complex", lambda self, x: calls.append(x.device.type) or complex_path(self, x)
    )
    XDConv(2, 3, 3, (6, 5), padding=1)(torch.randn(2, 2, 6, 5))
    y = XDConv(2, 3, 3, (6, 5), padding=1, device="meta")(torch.empty(2, 2, 6, 5, device="meta"))
    assert calls == ["meta"] and y.shape == (2, 3, 6, 5)


def test_factors_are_multiplied_out_as_a_tree_on_launch_bound_devices_only(monkeypatch):
    """The CPU takes the stage-by-stage product, CUDA the tree (here meta, standing in for it)."""
    twiddles = torch.randn(3, 16, 2, 2, dtype=torch.complex128)  # 3 stages of a 32-point butterfly
    calls = []
    tree = butterflies._factor_blocks_by_products

    def spy(t: torch.Tensor, n: int) -> torch.Tensor:
        calls.append(t.device.type)
        return tree(t, n)

    monkeypatch.setattr(butterflies, "_factor_blocks_by_products", spy)
    assert butterflies._factor_blocks(twiddles, 32).shape == (4, 8, 8)
    assert butterflies._factor_blocks(twiddles.to("meta"), 32).shape == (4, 8, 8)
    assert calls == ["meta"]


class _HostData(TorchFunctionMode):
    """Records what makes tensors from host data inside a step: torch.tensor and the like, and
    indexing with a Python list (copied to the device at every call)."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[str] = []

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        name = getattr(func, "__name__", str(func))
        if name in ("tensor", "as_tensor", "from_numpy"):
            self.seen.append(name)
        if name == "__getitem__":
            index = args[1] if isinstance(args[1], tuple) else (args[1],)
            self.seen += ["list index" for i in index if isinstance(i, list | tuple)]
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize(
    "path", ["dense", "blocked", "staged", "complex", "complex blocked", "complex staged"]
)
def test_no_step_after_the_first_makes_tensors_from_host_data(monkeypatch, path: str):
    """What CUDA-graph capture needs (a host-to-device copy inside a captured step is refused):
    after the first call has cached the permutations and layouts on the device, a forward and
    backward pass makes no tensor from host data, on every path."""
    take_path(monkeypatch, path)
    xd = XDConv(2, 3, 3, (14, 6), padding=1)  # 16 x 8: a square two-pass grid when blocked
    x = torch.randn(2, 2, 14, 6, requires_grad=True)
    xd(x).sum().backward()
    with _HostData() as host:
        xd(x).sum().backward()
    assert host.seen == []


#: A network of XD-operations on the bundled digits (1 x 8 x 8), trained for one short epoch.
XD_NETWORK = network(
    seq(computation("xd", d=16, k=3, s=1, p=1), act(), computation("xd", d=16, k=3, s=2, p=1), act())
)
XD_TRAINING = {"epochs": 1, "batch_size": 48, "train_subset": 512, "threads": None}


def _xd_training(settings: dict[str, Any]) -> Result:
    task = Task(to_text(XD_NETWORK), "einspace_plus", (1, 8, 8), "training", {**XD_TRAINING, **settings})
    return run_task(task)


def test_a_network_of_xd_operations_goes_through_the_training_evaluator():
    """The network the GPU test below captures, trained on CPU (where `cuda_graphs` runs eagerly)."""
    result = _xd_training({"device": "cpu", "step_mode": "cuda_graphs"})
    assert result.ok, result.error
    assert result.metrics["step_mode_applied"] == 0.0


@pytest.mark.gpu
def test_a_network_of_xd_operations_trains_from_cuda_graphs_like_the_eager_step():
    """The training evaluator's `step_mode: cuda_graphs` captures a network of XD-operations (no
    host copies inside the step: the permutations and the gather layout are cached on the device;
    a Python list as an index was copied to the GPU at every call, which capture refuses) and
    trains it as the eager step does."""
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    eager = _xd_training({"device": "cuda"})
    graphs = _xd_training({"device": "cuda", "step_mode": "cuda_graphs"})
    assert eager.ok and graphs.ok, (eager.error, graphs.error)
    assert graphs.metrics["step_mode_applied"] == 1.0
    assert graphs.metrics["train_loss"] == pytest.approx(eager.metrics["train_loss"], rel=0.05)
    assert graphs.fitness == pytest.approx(eager.fitness, abs=0.05)


def test_butterfly_rejects_sizes_that_are_not_powers_of_two():
    with pytest.raises(ValueError, match="power-of-two"):
        dft_twiddles(12)


# ----------------------------------------------------------------------------- the convolution point


def _spatial(k: int, dims: int) -> tuple[int, ...]:
    """Non-square inputs; k = 16 gets one large enough for more than one output per axis."""
    if dims == 1:
        return (37,)
    return (33, 40) if k == 16 else (18, 20)


def _conv_pair(k: int, s: int, p: int, dims: int, channels_last: bool = False):
    """A float64 convolution's weights, bias, input, and the XD warm-started from them."""
    spatial = _spatial(k, dims)
    weight = torch.randn(5, 3, *(k,) * dims, dtype=torch.float64, requires_grad=True)
    bias = torch.randn(5, dtype=torch.float64, requires_grad=True)
    x = torch.randn(2, 3, *spatial, dtype=torch.float64, requires_grad=True)
    xd = XDConv.from_conv(weight.detach(), bias.detach(), s, p, spatial, channels_last=channels_last)
    return weight, bias, x, xd


def _check_against_conv(k: int, s: int, p: int, dims: int, channels_last: bool = False) -> None:
    weight, bias, x, xd = _conv_pair(k, s, p, dims, channels_last)
    conv = F.conv1d if dims == 1 else F.conv2d
    ref = conv(x, weight, bias, stride=s, padding=p)
    x_xd = x.detach().movedim(1, -1) if channels_last else x.detach()
    x_xd.requires_grad_()
    out = xd(x_xd)
    out = out.movedim(-1, 1) if channels_last else out
    assert out.shape == ref.shape
    assert relative(out, ref) < 1e-5
    upstream = torch.randn_like(ref)
    ref.backward(upstream)
    out.backward(upstream)
    x_grad = x_xd.grad.movedim(-1, 1) if channels_last else x_xd.grad
    assert relative(x_grad, x.grad) < 1e-5
    assert relative(xd.weight.grad, weight.grad) < 1e-5
    assert relative(xd.bias.grad, bias.grad) < 1e-5


@pytest.mark.parametrize("dims", [1, 2])
@pytest.mark.parametrize("k, s, p", GRID)
def test_warm_start_is_the_convolution_forward_and_backward(k: int, s: int, p: int, dims: int):
    _check_against_conv(k, s, p, dims)


@pytest.mark.parametrize("k, s, p", [(3, 1, 1), (4, 4, 0)])
def test_channels_last_is_the_convolution_over_tokens(k: int, s: int, p: int):
    _check_against_conv(k, s, p, 1, channels_last=True)


@pytest.mark.parametrize("k, s, p, dims", [(3, 1, 1, 2), (3, 2, 1, 1), (8, 8, 0, 2)])
def test_stage_by_stage_path_is_the_convolution_too(monkeypatch, k: int, s: int, p: int, dims: int):
    monkeypatch.setattr(xd_module, "DENSE_MAX", 0)
    _check_against_conv(k, s, p, dims)


@pytest.mark.parametrize("k, s, p, dims", [(3, 1, 1, 2), (3, 2, 1, 1), (4, 4, 0, 1), (8, 8, 0, 2)])
def test_two_pass_block_path_is_the_convolution_too(monkeypatch, k: int, s: int, p: int, dims: int):
    monkeypatch.setattr(xd_module, "BLOCKED_MIN", 4)
    _check_against_conv(k, s, p, dims)


def test_long_axis_is_the_convolution_in_float32():
    """1-d, 1000 points (1024 on the grid) and 1024 (2048, two-pass blocks), float32, warm start."""
    for length in (1000, 1024):
        weight, bias = torch.randn(4, 3, 3), torch.randn(4)
        x = torch.randn(2, 3, length)
        xd = XDConv.from_conv(weight, bias, 1, 1, (length,))
        ref = F.conv1d(x, weight, bias, padding=1)
        assert relative(xd(x), ref) < 1e-5


# ----------------------------------------------------------------------------- any parameters


def _axis_matrices(packed: torch.Tensor, sizes: tuple[int, ...]) -> list[torch.Tensor]:
    """Each axis' dense complex butterfly from the packed twiddles (sum of log2(n) n/2, 2, 2, 2),
    column j being `butterfly` applied to the unit vector e_j."""
    stages = [n.bit_length() - 1 for n in sizes]
    twiddles = torch.view_as_complex(packed).split([s * (n // 2) for n, s in zip(sizes, stages, strict=True)])
    return [
        butterfly(torch.eye(n, dtype=torch.complex128), t.reshape(s, n // 2, 2, 2)).T
        for n, s, t in zip(sizes, stages, twiddles, strict=True)
    ]


def _along_axes(matrices: list[torch.Tensor], z: torch.Tensor) -> torch.Tensor:
    """Each matrix applied along its spatial axis of z (..., n_1, ..., n_N)."""
    first = z.dim() - len(matrices)
    for a, matrix in enumerate(matrices):
        z = (z.movedim(first + a, -1) @ matrix.T).movedim(-1, first + a)
    return z


def _reference_xd(xd: XDConv, x: torch.Tensor) -> torch.Tensor:
    """Real(K diag(C (L w + b)) M x) + bias in plain complex arithmetic, from the definition:
    input and filter zero-padded to the Fourier sizes (the input shifted by p), the output
    cropped to every s-th of its first rows."""
    k_axes, l_axes, m_axes = (_axis_matrices(p, xd.fourier) for p in (xd.K, xd.L, xd.M))
    x = x.movedim(-1, 1) if xd.channels_last else x
    p = xd.padding
    x_pad = [(p, n - size - p) for size, n in zip(xd.input_size, xd.fourier, strict=True)]
    w_pad = [(0, n - xd.kernel_size) for n in xd.fourier]
    image = F.pad(x, [e for pair in reversed(x_pad) for e in pair]).to(torch.complex128)
    taps = F.pad(xd.weight, [e for pair in reversed(w_pad) for e in pair]).to(torch.complex128)
    spatial = [None] * len(xd.fourier)
    gates = torch.view_as_complex(xd.C)[(..., *spatial)]
    diagonal = gates * (_along_axes(l_axes, taps) + torch.view_as_complex(xd.b))
    mixed = torch.einsum("bi...,oi...->bo...", _along_axes(m_axes, image), diagonal)
    rows = [slice(0, (out - 1) * xd.stride + 1, xd.stride) for out in xd.out_size]
    y = _along_axes(k_axes, mixed)[(..., *rows)].real + xd.bias[(..., *spatial)]
    return y.movedim(1, -1) if xd.channels_last else y


@pytest.mark.parametrize(
    "spatial, k, s, p, channels_last, path",
    [
        ((13,), 3, 1, 1, False, "dense"),
        ((13,), 3, 2, 1, True, "dense"),
        ((6, 11), 3, 1, 1, False, "dense"),
        ((7, 12), 4, 2, 0, False, "dense"),
        ((6, 11), 3, 2, 1, False, "staged"),
        ((13,), 3, 1, 1, False, "blocked"),
        ((13,), 3, 2, 1, True, "blocked"),
        ((6, 11), 3, 2, 1, False, "blocked"),
        ((7, 12), 4, 2, 0, False, "blocked"),
        ((6, 11), 3, 1, 1, False, "dense products"),
        ((13,), 3, 2, 1, True, "blocked products"),
        ((7, 12), 4, 2, 0, False, "blocked products"),
        ((13,), 3, 2, 1, True, "complex"),
        ((7, 12), 4, 2, 0, False, "complex"),
        ((13,), 3, 1, 1, False, "complex blocked"),
        ((6, 11), 3, 2, 1, False, "complex blocked"),
        ((6, 11), 3, 2, 1, False, "complex staged"),
    ],
)
def test_any_parameters_match_an_independent_complex_computation(
    monkeypatch, spatial: tuple[int, ...], k: int, s: int, p: int, channels_last: bool, path: str
):
    """Every parameter random (far from the warm start): the output and the gradients of the
    input and of every parameter equal plain complex autograd through the definition (dense
    per-axis matrices built factor by factor), on every path: dense matrices, two-pass blocks
    (every axis of 4 points or more), stage by stage; the matrices and blocks multiplied out
    stage by stage (as on CPU) or as a product tree (as on a GPU); in real planes (the CPU's
    arithmetic) or native complex (the GPU's)."""
    take_path(monkeypatch, path)
    xd = XDConv(3, 4, k, spatial, stride=s, padding=p, channels_last=channels_last, dtype=torch.float64)
    with torch.no_grad():
        for param in xd.parameters():
            param.copy_(torch.randn_like(param))
    shape = (2, *spatial, 3) if channels_last else (2, 3, *spatial)
    x = torch.randn(shape, dtype=torch.float64, requires_grad=True)
    names, params = zip(*xd.named_parameters(), strict=True)
    out, ref = xd(x), _reference_xd(xd, x)
    assert out.shape == ref.shape
    assert relative(out, ref) < 1e-9
    upstream = torch.randn_like(ref)
    grads = torch.autograd.grad(out, (x, *params), upstream)
    ref_grads = torch.autograd.grad(ref, (x, *params), upstream)
    for name, grad, ref_grad in zip(("input", *names), grads, ref_grads, strict=True):
        assert relative(grad, ref_grad) < 1e-9, name


LONG = pytest.mark.slow  # the float64 reference multiplies out 1024- and 2048-point matrices


@pytest.mark.parametrize(
    "spatial, s, channels_last",
    [
        ((200,), 1, True),
        ((30, 30), 1, False),
        ((32, 32), 2, False),
        pytest.param((1000,), 1, True, marks=LONG),
        pytest.param((1024,), 2, False, marks=LONG),
    ],
)
@pytest.mark.parametrize("arithmetic", ["planes", "complex"])
def test_float32_matches_the_reference_at_the_benchmark_sizes(
    monkeypatch, spatial: tuple[int, ...], s: int, channels_last: bool, arithmetic: str
):
    """The benchmark's shapes in float32 (two-pass blocks on long axes: 1000 and 1024 points, or 200
    with blocks from 128; dense matrices in 2-d), parameters moved off the warm start: output and
    gradients within 1e-5 of the definition computed in float64, in the CPU's real planes and in
    the GPU's complex64."""
    monkeypatch.setattr(xd_module, "BLOCKED_MIN", 128)
    take_path(monkeypatch, arithmetic)
    xd = XDConv(3, 4, 3, spatial, stride=s, padding=1, channels_last=channels_last)
    with torch.no_grad():
        for param in xd.parameters():
            param.add_(0.05 * torch.randn_like(param))
    shape = (2, *spatial, 3) if channels_last else (2, 3, *spatial)
    x = torch.randn(shape, requires_grad=True)
    double = XDConv(3, 4, 3, spatial, stride=s, padding=1, channels_last=channels_last, dtype=torch.float64)
    double.load_state_dict(xd.state_dict())
    x64 = x.detach().double().requires_grad_()
    out, ref = xd(x), _reference_xd(double, x64)
    assert out.dtype == torch.float32 and relative(out.double(), ref) < 1e-5
    upstream = torch.randn_like(out)
    grads = torch.autograd.grad(out, (x, *xd.parameters()), upstream)
    ref_grads = torch.autograd.grad(ref, (x64, *double.parameters()), upstream.double())
    names = ("input", *(name for name, _ in xd.named_parameters()))
    for name, grad, ref_grad in zip(names, grads, ref_grads, strict=True):
        assert relative(grad.double(), ref_grad) < 1e-5, name


@pytest.mark.parametrize("spatial", [(5,), (3, 6)])
@pytest.mark.parametrize("path", ["dense", "blocked"])
def test_gradcheck_in_float64(monkeypatch, spatial: tuple[int, ...], path: str):
    """The hand-written backward of the real-plane products (transforms, L one axis at a time,
    channel mix) against finite differences, every parameter and the input."""
    if path == "blocked":
        monkeypatch.setattr(xd_module, "BLOCKED_MIN", 4)
    xd = XDConv(2, 2, 3, spatial, stride=1, padding=1, dtype=torch.float64)
    with torch.no_grad():
        for param in xd.parameters():
            param.add_(0.3 * torch.randn_like(param))
    names = [name for name, _ in xd.named_parameters()]
    params = [p.detach().clone().requires_grad_() for p in xd.parameters()]
    x = torch.randn(1, 2, *spatial, dtype=torch.float64, requires_grad=True)

    def call(x: torch.Tensor, *values: torch.Tensor) -> torch.Tensor:
        return torch.func.functional_call(xd, dict(zip(names, values, strict=True)), (x,))

    assert torch.autograd.gradcheck(call, (x, *params), eps=1e-6, atol=1e-6, fast_mode=True)


@pytest.mark.parametrize("spatial, channels_last", [((6, 11), False), ((13,), True)])
def test_the_two_arithmetics_agree_without_a_bias(monkeypatch, spatial: tuple[int, ...], channels_last: bool):
    """Without a bias (what `from_conv` makes of a bias-free convolution) the GPU path's complex
    arithmetic gives the CPU path's output and gradients."""
    xd = XDConv(
        3, 4, 3, spatial, stride=2, padding=1, bias=False, channels_last=channels_last, dtype=torch.float64
    )
    with torch.no_grad():
        for param in xd.parameters():
            param.add_(0.3 * torch.randn_like(param))
    shape = (2, *spatial, 3) if channels_last else (2, 3, *spatial)
    x = torch.randn(shape, dtype=torch.float64, requires_grad=True)
    planes = xd(x)
    planes_grads = torch.autograd.grad(planes.square().sum(), (x, *xd.parameters()))
    take_path(monkeypatch, "complex")
    out = xd(x)
    grads = torch.autograd.grad(out.square().sum(), (x, *xd.parameters()))
    assert xd.bias is None and relative(out, planes) < 1e-12
    for grad, expected in zip(grads, planes_grads, strict=True):
        assert relative(grad, expected) < 1e-12


def test_runs_in_full_precision_under_autocast():
    """Mixed-precision training autocasts the layers around it; the XD-operation itself stays
    in its parameters' precision (complex products have no reduced-precision kernels)."""
    xd = XDConv(3, 4, 3, (8, 10), padding=1)
    x = torch.randn(2, 3, 8, 10)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = xd(x.bfloat16())
    assert out.dtype == torch.float32
    assert relative(out, F.conv2d(x.bfloat16().float(), xd.weight, xd.bias, padding=1)) < 1e-5


def test_default_initialisation_is_a_fresh_convolution():
    """Weights and bias drawn as nn.Conv2d draws them, and the operation is that convolution."""
    xd = XDConv(4, 6, 3, (9, 7), stride=2, padding=1).double()
    conv = torch.nn.Conv2d(4, 6, 3)
    bound = 1 / (4 * 3 * 3) ** 0.5
    for mine, theirs in ((xd.weight, conv.weight), (xd.bias, conv.bias)):
        assert mine.shape == theirs.shape
        assert mine.abs().max() <= bound and theirs.abs().max() <= bound
        assert mine.std() > bound / 3  # uniform on [-bound, bound], not a narrower law
    x = torch.randn(2, 4, 9, 7, dtype=torch.float64)
    assert relative(xd(x), F.conv2d(x, xd.weight, xd.bias, stride=2, padding=1)) < 1e-5


def test_parameter_count_by_hand():
    """2-d, 3 -> 5 channels, k = 3, p = 1 on 18 x 20: axes of 32 points (18 + 1 and 20 + 1 pad
    to 32); each butterfly has 5 stages of 16 complex 2x2 blocks."""
    xd = XDConv(3, 5, 3, (18, 20), padding=1)
    assert xd.fourier == (32, 32)
    twiddles = 3 * 2 * (5 * 16 * 4 * 2)  # K, L, M; two axes; real numbers
    by_hand = 5 * 3 * 9 + 5 + 2 * 5 * 3 + 2 * 32 * 32 + twiddles
    assert sum(p.numel() for p in xd.parameters()) == by_hand == xd_parameter_count(3, 5, 3, (32, 32))


def test_flops_by_hand():
    """1-d, 2 -> 3 channels on 16 points: 4 butterfly factors of 16 complex multiply-adds (8
    FLOPs each) per channel transform, 5 transforms; 3 * 2 * 16 diagonal products; 3 * 8 biases."""
    assert xd_flops(2, 3, (16,), (8,)) == 5 * 4 * 16 * 16 + 8 * 3 * 2 * 16 + 3 * 8


# ----------------------------------------------------------------------------- the operation


def _state(mode: str, shape: tuple[int, ...], folds: tuple[tuple[int, int], ...] = ()) -> FeatureState:
    return FeatureState(shape, mode, folds)


CASES: list[tuple[FeatureState, dict[str, Any]]] = [
    (_state(IM, (3, 18, 20)), {"d": 16, "k": 3, "s": 1, "p": 1}),
    (_state(IM, (3, 18, 20)), {"d": 32, "k": 3, "s": 2, "p": 1}),
    (_state(IM, (2, 33, 40)), {"d": 16, "k": 16, "s": 16, "p": 0}),
    (_state(IM, (4, 8, 8), ((4, 4),)), {"d": 16, "k": 4, "s": 4, "p": 0}),
    (_state(COL, (37, 6)), {"d": 16, "k": 3, "s": 1, "p": 1}),
    (_state(COL, (64, 6), ((8, 8),)), {"d": 32, "k": 8, "s": 8, "p": 0}),
]


@pytest.mark.parametrize("state, args", CASES, ids=lambda c: str(c))
def test_registry_contract(state: FeatureState, args: dict[str, Any]):
    op = get_op("xd")
    (out_state,) = op.infer((state,), args)
    assert out_state.mode == state.mode and out_state.folds == state.folds
    module = op.build((state,), args)
    x = torch.randn(2, *state.shape)
    y = module(x)
    assert tuple(y.shape[1:]) == out_state.shape
    assert op.param_count((state,), args) == sum(p.numel() for p in module.parameters())
    assert op.flops((state,), args) > 0
    named = dict(architecture_parameters(module))
    assert set(named) == ARCHITECTURE
    y.square().mean().backward()
    for name, param in named.items():
        assert param.grad is not None and param.grad.abs().sum() > 0, name


def test_im_mode_matches_im2col_geometry():
    state = _state(IM, (3, 18, 20))
    for k, s, p in GRID:
        (xd_out,) = get_op("xd").infer((state,), {"d": 8, "k": k, "s": s, "p": p})
        (cols,) = get_op("im2col").infer((state,), {"k": k, "s": s, "p": p})
        assert xd_out.shape[1:] == cols.folds[-1]


@pytest.mark.parametrize(
    "state, args, reason",
    [
        (_state(IM, (3, 8, 8)), {"d": 8, "k": 16, "s": 16, "p": 0}, "kernel 16 larger than .* input 8x8"),
        (_state(COL, (6, 4)), {"d": 8, "k": 8, "s": 8, "p": 0}, "kernel 8 larger than .* input 6 "),
    ],
)
def test_infeasible_where_the_kernel_does_not_fit(state: FeatureState, args: dict[str, Any], reason: str):
    with pytest.raises(Infeasible, match=reason):
        get_op("xd").infer((state,), args)


def test_in_a_compiled_network():
    """A tree with an xd terminal checks, compiles and trains its architecture parameters."""
    tree = network(seq(computation("xd", d=8, k=3, s=2, p=1), act()))
    net = compile_network(tree, _state(IM, (1, 8, 8)), classes=10)
    logits = net(torch.randn(4, 1, 8, 8))
    assert logits.shape == (4, 10)
    logits.sum().backward()
    names = {name.rsplit(".", 1)[-1] for name, _ in architecture_parameters(net)}
    assert names == ARCHITECTURE


# ----------------------------------------------------------------------------- leaving the convolution


def test_architecture_parameters_alone_move_towards_a_dilated_convolution():
    """With the weights frozen at w, Adam on K, L, M, b, C fits the dilated convolution with
    the same w (taps two apart), which the warm start (an ordinary convolution) does not."""
    weight = torch.randn(2, 2, 3)
    xd = XDConv.from_conv(weight, None, 1, 1, (16,))
    data = torch.randn(64, 2, 16)
    target = F.conv1d(data, weight, padding=2, dilation=2)
    xd.weight.requires_grad_(False)
    optimiser = torch.optim.Adam([p for _, p in architecture_parameters(xd)], lr=0.01)

    def loss() -> torch.Tensor:
        return F.mse_loss(xd(data), target)

    with torch.no_grad():
        start = loss().item()
    for _ in range(60):
        optimiser.zero_grad()
        value = loss()
        value.backward()
        optimiser.step()
    with torch.no_grad():
        end = loss().item()
    assert end < 0.1 * start  # about 0.02 * start in practice


def _convolutions(tree: Any) -> tuple[int, int]:
    """(XD-operations, im2col·linear·col2im convolutions) in a tree."""
    from einspace.tree import to_text

    text = to_text(tree)
    return text.count("xd("), text.count("(R1 im2col(")


def test_mutation_turns_a_convolution_into_an_xd_operation_and_back():
    """In `einspace_plus`, resampling a subtree can swap a convolution for an XD-operation (which
    then starts from a convolution's function) and an XD-operation for a convolution."""
    import random

    from einspace import Limits, Variation, load_grammar
    from einspace.seeds.architectures import conv
    from einspace.state import input_state

    grammar, x = load_grammar("einspace_plus"), input_state((3, 16, 16))
    variation = Variation(grammar, x, Limits(max_depth=10, max_nodes=60), rng=random.Random(0))
    with_conv = network(seq(conv(16), act(), conv(16), act()))
    with_xd = network(
        seq(computation("xd", d=16, k=3, s=1, p=1), act(), computation("xd", d=16, k=3, s=1, p=1))
    )
    gained = [_convolutions(variation.mutate(with_conv)) for _ in range(400)]
    lost = [_convolutions(variation.mutate(with_xd)) for _ in range(400)]
    assert any(xds >= 1 and convs < 2 for xds, convs in gained)  # a convolution became an XD-operation
    assert any(xds < 2 and convs >= 1 for xds, convs in lost)  # an XD-operation became a convolution

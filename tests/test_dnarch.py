"""DNArch terminals: saturated masks reduce to plain torch, mask gradients point the right way,
the registry contract, the clamps, and the complexity loss against hand computations."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from einspace import CheckedTree, check_tree, compile_backbone, compile_network, parse_tree
from einspace.errors import EinspaceError, Infeasible
from einspace.ops import canonical_args, get_op
from einspace.ops._dnarch_modules import DNArchModule, GaussianMask, SigmoidMask
from einspace.ops.trainable import (
    architecture_metrics,
    architecture_parameters,
    build_network_loss,
    constrain_architecture,
    network_losses,
)
from einspace.state import COL, IM, FeatureState

torch.manual_seed(0)
LN9 = math.log(9)  # Eq. 4 with T_m = 0.1: x_T = mu + ln 9 / tau
REACH = math.sqrt(2 * math.log(10))  # Eq. 3 with T_m = 0.1: x_T = sigma * sqrt(2 ln 10)


def num(value: torch.Tensor) -> float:
    return value.detach().item()


def im(*shape: int) -> FeatureState:
    return FeatureState(tuple(shape), IM)


def col(*shape: int) -> FeatureState:
    return FeatureState(tuple(shape), COL)


def build(name: str, args: dict[str, Any], state: FeatureState) -> DNArchModule:
    return get_op(name).build((state,), args)


def set_masks(module: nn.Module, sigma: float | None = None, mu: float | None = None) -> None:
    """Set every Gaussian sigma and sigmoid mu of `module` (without the clamps)."""
    with torch.no_grad():
        for mask in module.modules():
            if isinstance(mask, GaussianMask) and sigma is not None:
                mask.sigma.fill_(sigma)
            if isinstance(mask, SigmoidMask) and mu is not None:
                mask.mu.fill_(mu)


# ---------------------------------------------------------------- registry contract

#: (op, args, input, params, FLOPs): the documented formulas, worked out by hand.
CONTRACT = [
    ("dnarch_kernel", {"k": 5, "d": 4}, im(3, 8, 9), 4 * 3 * 25 + 4 + 2, (2 * 3 * 25 + 1) * 4 * 72),
    ("dnarch_kernel", {"k": 3, "d": 4}, col(10, 6), 4 * 6 * 3 + 4 + 1, (2 * 6 * 3 + 1) * 4 * 10),
    ("dnarch_width", {"d": 7}, im(3, 8, 9), 4 * 7 + 1, 8 * 7 * 72),
    ("dnarch_width", {"d": 7}, col(10, 6), 7 * 7 + 1, 14 * 7 * 10),
    # 3 channels x (forward and inverse real FFT of 72 points, 2 per coefficient of 8 x 5)
    ("dnarch_resolution", {}, im(3, 8, 9), 2, round(3 * (5 * 72 * math.log2(72) + 2 * 40))),
    ("dnarch_resolution", {}, col(11, 6), 1, round(6 * (5 * 11 * math.log2(11) + 2 * 6))),
    ("dnarch_depth", {"blocks": 3, "k": 3}, im(3, 8, 9), 3 * (81 + 9) + 1, 3 * ((2 * 27 + 1) * 3 + 21) * 72),
    ("dnarch_depth", {"blocks": 2, "k": 1}, col(10, 6), 2 * (36 + 18) + 1, 2 * ((2 * 6 + 1) * 6 + 42) * 10),
]


@pytest.mark.parametrize("case", CONTRACT, ids=lambda c: f"{c[0]}-{c[2]}")
def test_registry_contract(case: tuple[str, dict[str, Any], FeatureState, int, int]) -> None:
    name, args, state, params, flops = case
    op = get_op(name)
    canonical_args(op, args)
    assert "DNArch" in (type(op).__doc__ or "").splitlines()[0]
    (out,) = op.infer((state,), args)
    module = build(name, args, state)
    x = torch.randn(2, *state.shape)
    y = module(x)
    assert tuple(y.shape[1:]) == out.shape and out.mode == state.mode
    assert op.param_count((state,), args) == sum(p.numel() for p in module.parameters()) == params
    assert op.flops((state,), args) == flops
    assert module.nominal == {"flops": flops, "params": params}
    # At the initial masks the differentiable cost is the nominal one.
    for measure, value in module.costs().items():
        assert num(value) == pytest.approx(module.nominal[measure], abs=1.0)
    # The architecture parameters are exactly the mask parameters.
    masks = {
        id(p) for m in module.modules() if isinstance(m, (GaussianMask, SigmoidMask)) for p in m.parameters()
    }
    assert {id(p) for _, p in architecture_parameters(module)} == masks and masks
    (y * torch.randn_like(y)).sum().backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in module.parameters())
    assert op.abstract(state.mode, 1, args) == (state.mode, 1)


@pytest.mark.parametrize(
    "name,args,state,fragment",
    [
        ("dnarch_kernel", {"k": 9, "d": 4}, im(3, 8, 16), "larger than"),
        ("dnarch_kernel", {"k": 5, "d": 4}, col(4, 6), "larger than"),
        ("dnarch_depth", {"blocks": 2, "k": 3}, im(3, 2, 8), "larger than"),
        ("dnarch_resolution", {}, im(3, 1, 8), "one sample"),
        ("dnarch_resolution", {}, col(1, 8), "one sample"),
    ],
)
def test_infeasible(name: str, args: dict[str, Any], state: FeatureState, fragment: str) -> None:
    with pytest.raises(Infeasible, match=fragment):
        get_op(name).infer((state,), args)


@pytest.mark.parametrize(
    "name,args",
    [
        ("dnarch_kernel", {"k": 4, "d": 2}),
        ("dnarch_kernel", {"k": 1, "d": 2}),
        ("dnarch_depth", {"blocks": 0, "k": 3}),
        ("dnarch_width", {"d": 0}),
    ],
)
def test_bad_arguments(name: str, args: dict[str, Any]) -> None:
    with pytest.raises(EinspaceError):
        canonical_args(get_op(name), args)


# ---------------------------------------------------------------- saturated masks = plain torch


def _compare(module: nn.Module, plain: nn.Module, x: torch.Tensor, pairs: list[tuple[Any, Any]]) -> None:
    """Equal outputs, input gradients and parameter gradients (pairs of (ours, plain) parameters)."""
    xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
    ya, yb = module(xa), plain(xb)
    torch.testing.assert_close(ya, yb, rtol=1e-5, atol=1e-5)
    weights = torch.randn_like(ya)
    (ya * weights).sum().backward()
    (yb * weights).sum().backward()
    torch.testing.assert_close(xa.grad, xb.grad, rtol=1e-5, atol=1e-5)
    for ours, theirs in pairs:
        torch.testing.assert_close(ours.grad, theirs.grad, rtol=1e-5, atol=1e-5)


class _Lambda(nn.Module):
    def __init__(self, fn: Any):
        super().__init__()
        self.fn = fn

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fn(x)


@pytest.mark.parametrize("state", [im(3, 7, 9), col(10, 6)], ids=str)
def test_saturated_kernel_is_a_plain_convolution(state: FeatureState) -> None:
    module = build("dnarch_kernel", {"k": 5, "d": 4}, state)
    set_masks(module, sigma=1e4)
    weight = module.weight.detach().clone().requires_grad_()
    bias = module.bias.detach().clone().requires_grad_()
    if state.mode == IM:
        plain = _Lambda(lambda x: F.conv2d(x, weight, bias, padding=2))
    else:
        plain = _Lambda(lambda x: F.conv1d(x.transpose(1, 2), weight, bias, padding=2).transpose(1, 2))
    _compare(module, plain, torch.randn(2, *state.shape), [(module.weight, weight), (module.bias, bias)])


@pytest.mark.parametrize("state", [im(3, 7, 9), col(10, 6)], ids=str)
def test_saturated_width_is_a_plain_linear(state: FeatureState) -> None:
    module = build("dnarch_width", {"d": 5}, state)
    set_masks(module, mu=100.0)
    linear = nn.Linear(state.shape[0] if state.mode == IM else state.shape[1], 5)
    with torch.no_grad():
        linear.weight.copy_(module.weight)
        linear.bias.copy_(module.bias)
    if state.mode == IM:
        plain = _Lambda(lambda x: linear(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2))
    else:
        plain = linear
    pairs = [(module.weight, linear.weight), (module.bias, linear.bias)]
    _compare(module, plain, torch.randn(2, *state.shape), pairs)


@pytest.mark.parametrize("state", [im(3, 8, 9), im(2, 7, 6), col(11, 6), col(10, 3)], ids=str)
def test_saturated_resolution_is_the_identity(state: FeatureState) -> None:
    module = build("dnarch_resolution", {}, state)
    set_masks(module, mu=100.0)
    _compare(module, nn.Identity(), torch.randn(2, *state.shape), [])


class _PlainSequenceBlock(nn.Module):
    """conv1d over S, LayerNorm over D, leaky ReLU, on (B, S, D)."""

    def __init__(self, d: int, k: int):
        super().__init__()
        self.conv, self.norm = nn.Conv1d(d, d, k, padding=k // 2), nn.LayerNorm(d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.leaky_relu(self.norm(self.conv(x.transpose(1, 2)).transpose(1, 2)), 0.01)


def _plain_blocks(module: nn.Module, state: FeatureState, k: int) -> list[nn.Module]:
    """Plain conv-norm-act blocks holding copies of `module`'s block weights."""
    blocks: list[nn.Module] = []
    for ours in module.blocks:
        if state.mode == IM:
            c = state.shape[0]
            block = nn.Sequential(nn.Conv2d(c, c, k, padding=k // 2), nn.BatchNorm2d(c), nn.LeakyReLU(0.01))
            conv, norm = block[0], block[1]
        else:
            block = _PlainSequenceBlock(state.shape[1], k)
            conv, norm = block.conv, block.norm
        conv.load_state_dict(ours[0].state_dict())
        norm.load_state_dict(ours[1].state_dict())
        blocks.append(block)
    return blocks


class _PlainStack(nn.Module):
    """x + s_l R_l(x) for each block, with fixed scales s_l (a zero scale skips the block)."""

    def __init__(self, blocks: list[nn.Module], scales: list[float]):
        super().__init__()
        self.blocks, self.scales = nn.ModuleList(blocks), scales

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block, scale in zip(self.blocks, self.scales, strict=True):
            if scale:
                x = x + scale * block(x)
        return x


@pytest.mark.parametrize("state", [im(3, 6, 5), col(10, 6)], ids=str)
@pytest.mark.parametrize("train", [True, False], ids=["train", "eval"])
def test_saturated_depth_is_a_plain_residual_stack(state: FeatureState, train: bool) -> None:
    module = build("dnarch_depth", {"blocks": 3, "k": 3}, state)
    set_masks(module, mu=100.0)
    plain = _PlainStack(_plain_blocks(module, state, 3), [1.0, 1.0, 1.0])
    module.train(train)
    plain.train(train)
    ours = [p for b in module.blocks for p in b.parameters()]
    theirs = [p for b in plain.blocks for p in b.parameters()]
    _compare(module, plain, torch.randn(4, *state.shape), list(zip(ours, theirs, strict=True)))


def test_depth_mask_scales_and_skips_blocks() -> None:
    """mu = -0.3, tau = 8 over blocks at -1, -1/3, 1/3, 1: two blocks kept, scaled, two skipped."""
    state = im(2, 5, 5)
    module = build("dnarch_depth", {"blocks": 4, "k": 3}, state).eval()
    set_masks(module, mu=-0.3)
    scales = [1 / (1 + math.exp(-8 * (-0.3 - c))) for c in (-1, -1 / 3, 1 / 3, 1)]
    assert scales[2] < 0.1 < scales[1]
    plain = _PlainStack(_plain_blocks(module, state, 3), [scales[0], scales[1], 0.0, 0.0]).eval()
    x = torch.randn(2, *state.shape)
    torch.testing.assert_close(module(x), plain(x))
    assert architecture_metrics(module) == {"arch/network/depth": 2.0, "arch/network/depth_nominal": 4.0}


# ---------------------------------------------------------------- masks, sizes, clamps


def test_mask_values_sizes_and_supports_by_hand() -> None:
    kernel = GaussianMask(7)  # taps at -1, -2/3, ..., 1
    with torch.no_grad():
        kernel.sigma.fill_(0.5 / REACH)  # x_T = 0.5: keeps |c| <= 0.5, three taps
    expected = [0.0, 0.0] + [math.exp(-0.5 * (c * REACH / 0.5) ** 2) for c in (-1 / 3, 0, 1 / 3)] + [0.0, 0.0]
    torch.testing.assert_close(kernel(), torch.tensor(expected))
    assert kernel.support() == 3
    assert num(kernel.size()) == pytest.approx(7 * 0.5)  # Eq. 9

    width = SigmoidMask(torch.linspace(-1, 1, 9), 9, 25.0)  # channels at -1, -0.75, ..., 1
    with torch.no_grad():
        width.mu.fill_(0.0)  # x_T = ln 9 / 25 = 0.088: keeps the five channels up to 0
    values = [1 / (1 + math.exp(-25 * (0 - c))) for c in torch.linspace(-1, 1, 9).tolist()]
    torch.testing.assert_close(width(), torch.tensor([v if v >= 0.1 else 0.0 for v in values]))
    assert int((width() > 0).sum()) == 5
    assert num(width.size()) == pytest.approx(9 * (LN9 / 25 + 1) / 2)  # Eq. 10

    with torch.no_grad():
        width.mu.fill_(3.0)  # past the last channel: the size is clipped at 9 ...
    size = width.size()
    assert num(size) == 9
    size.backward()  # ... and still has the unclipped gradient (straight-through): d size / d mu = 9 / 2
    assert float(width.mu.grad) == pytest.approx(4.5)


def test_resolution_keeps_low_frequencies_and_reports_them() -> None:
    state = col(16, 3)  # frequencies 0..8 at coordinates -1, -0.75, ..., 1
    module = build("dnarch_resolution", {}, state)
    set_masks(module, mu=0.0)  # keeps frequencies 0..4 (x_T = 0.088)
    x = torch.randn(2, *state.shape)
    spectrum = torch.fft.rfft(x, dim=1)
    scale = torch.tensor([1 / (1 + math.exp(-25 * (0 - (-1 + f / 4)))) if f <= 4 else 0.0 for f in range(9)])
    expected = torch.fft.irfft(spectrum * scale[:, None], n=16, dim=1)
    torch.testing.assert_close(module(x), expected)
    assert architecture_metrics(module) == {
        "arch/network/resolution": 9.0,
        "arch/network/resolution_nominal": 16.0,
    }
    with torch.autocast("cpu", dtype=torch.bfloat16):  # FFTs run in float32, the output keeps the dtype
        assert module(x.bfloat16()).dtype == torch.bfloat16


def test_constrain_architecture_keeps_parameters_in_range() -> None:
    state = im(3, 8, 8)
    net = nn.Sequential(
        build("dnarch_kernel", {"k": 7, "d": 3}, state),
        build("dnarch_width", {"d": 3}, state),
        build("dnarch_resolution", {}, state),
        build("dnarch_depth", {"blocks": 4, "k": 3}, state),
    )
    sigmoids = [m for m in net.modules() if isinstance(m, SigmoidMask)]
    gaussians = [m for m in net.modules() if isinstance(m, GaussianMask)]
    for low in (True, False):
        set_masks(net, sigma=-1.0 if low else 50.0, mu=-10.0 if low else 10.0)
        constrain_architecture(net)
        for mask in sigmoids:
            # Bounds: 0.95 at the lowest coordinate (-1), 0.85 at the highest (1).
            value = torch.sigmoid(mask.tau * (mask.mu - (-1 if low else 1)))
            assert num(value) == pytest.approx(0.95 if low else 0.85, abs=1e-5)
            assert (mask() > 0).any()
        for mask in gaussians:
            if low:  # never fewer than three taps: x_T reaches the neighbours at 2 / (k - 1)
                assert mask.support() == 3
                assert num(mask.cutoff()) == pytest.approx(2 / 6)
            else:
                assert num(mask.sigma) == 50.0  # no upper bound: the size clip handles growth
    assert all(0 < mask.support() for mask in gaussians)


# ---------------------------------------------------------------- mask gradients


def _energy_gradient(module: nn.Module, x: torch.Tensor) -> list[float]:
    """d(-output energy)/d(mask parameter), one per architecture parameter."""
    (-(module(x) ** 2).sum()).backward()
    return [float(p.grad) for _, p in architecture_parameters(module)]


def single(call: str, state: FeatureState) -> tuple[nn.Module, CheckedTree]:
    """The module of a one-terminal tree, and the checked tree (its costs are the terminal's)."""
    checked = check_tree(parse_tree(f"(S (C {call}))"), None, state)
    return compile_backbone(checked), checked


def _complexity_gradient(module: nn.Module, checked: CheckedTree) -> list[float]:
    """d(complexity loss, target 10% of nominal FLOPs)/d(mask parameter)."""
    for _, p in architecture_parameters(module):
        p.grad = None
    build_network_loss("complexity", module, checked, {"target": 0.1}).loss().backward()
    return [float(p.grad) for _, p in architecture_parameters(module)]


@pytest.mark.parametrize("state", [im(2, 8, 8), col(12, 3)], ids=str)
def test_kernel_mask_gradients(state: FeatureState) -> None:
    module, checked = single("dnarch_kernel(k=5, d=3)", state)
    with torch.no_grad():
        module.weight.abs_()
        module.bias.zero_()
    set_masks(module, sigma=0.3)  # taps at 0 and ±0.5 kept, ±1 cut
    grads = _energy_gradient(module, torch.rand(2, *state.shape))
    assert len(grads) == len(state.shape) - 1 and all(g < 0 for g in grads)  # -energy widens the kernel
    assert all(g > 0 for g in _complexity_gradient(module, checked))  # the complexity loss narrows it


@pytest.mark.parametrize("state", [im(2, 8, 8), col(12, 3)], ids=str)
def test_width_mask_gradients(state: FeatureState) -> None:
    module, checked = single("dnarch_width(d=8)", state)
    set_masks(module, mu=0.0)
    assert _energy_gradient(module, torch.randn(2, *state.shape))[0] < 0
    assert _complexity_gradient(module, checked)[0] > 0


@pytest.mark.parametrize("state", [im(2, 8, 8), col(12, 3)], ids=str)
def test_resolution_mask_gradients(state: FeatureState) -> None:
    module, checked = single("dnarch_resolution", state)
    set_masks(module, mu=0.0)
    grads = _energy_gradient(module, torch.randn(2, *state.shape))
    assert len(grads) == len(state.shape) - 1 and all(g < 0 for g in grads)
    assert all(g > 0 for g in _complexity_gradient(module, checked))


@pytest.mark.parametrize("state", [im(2, 6, 6), col(12, 3)], ids=str)
def test_depth_mask_gradients(state: FeatureState) -> None:
    module, checked = single("dnarch_depth(blocks=2, k=3)", state)
    module.eval()
    with torch.no_grad():  # every block adds 1: R(x) = leaky(norm(0) + shift 1)
        for block in module.blocks:
            block[0].weight.zero_()
            block[0].bias.zero_()
            block[1].bias.fill_(1.0)
    set_masks(module, mu=1.0)  # the second block half on
    assert _energy_gradient(module, torch.rand(2, *state.shape))[0] < 0
    assert _complexity_gradient(module, checked)[0] > 0


def test_complexity_gradient_flows_through_the_clip_at_initialisation() -> None:
    module, checked = single("dnarch_width(d=8)", col(6, 4))
    assert num(module.mask.size()) == 8  # initial mask past the last channel: the size is clipped
    assert _complexity_gradient(module, checked)[0] > 0


# ---------------------------------------------------------------- complexity loss

TREE = (
    "(S (C dnarch_width(d=8)) (C leaky_relu) (C dnarch_kernel(k=5, d=4)) (C dnarch_resolution)"
    " (C dnarch_depth(blocks=4, k=3)) (C norm))"
)


def test_complexity_loss_matches_a_hand_computation() -> None:
    assert "complexity" in network_losses()
    state = im(2, 8, 8)
    checked = check_tree(parse_tree(TREE), None, state)
    # Nominal FLOPs and params, term by term on 64 positions.
    width = ((2 * 2 + 2) * 8 * 64, 3 * 8 + 1)
    leaky = (8 * 64, 0)
    kernel = ((2 * 8 * 25 + 1) * 4 * 64, 8 * 25 * 4 + 4 + 2)
    resolution = (4 * (5 * 64 * 6 + 2 * 8 * 5), 2)
    block = ((2 * 4 * 9 + 1) * 4 * 64 + 7 * 4 * 64, 4 * 4 * 9 + 4 + 8)
    depth = (4 * block[0], 4 * block[1] + 1)
    norm = (4 * 4 * 64, 8)
    terms = (width, leaky, kernel, resolution, depth, norm)
    assert (checked.flops, checked.params) == tuple(sum(t[i] for t in terms) for i in range(2))

    network = compile_network(checked, classes=10)
    with torch.no_grad():
        (w,) = [m for m in network.modules() if type(m).__name__ == "MaskedLinear"]
        w.mask.mu.fill_(0.0)
        (k,) = [m for m in network.modules() if type(m).__name__ == "MaskedConv"]
        k.masks[0].sigma.fill_(0.3)
        k.masks[1].sigma.fill_(0.4)
        (r,) = [m for m in network.modules() if type(m).__name__ == "LowPass"]
        r.masks[0].mu.fill_(0.0)
        r.masks[1].mu.fill_(1.5)  # past the highest frequency: clipped to the full 8
        (d,) = [m for m in network.modules() if type(m).__name__ == "ResidualStack"]
        d.mask.mu.fill_(0.0)
    s_width = 8 * (1 + LN9 / 25) / 2
    taps = (5 * 0.3 * REACH) * (5 * 0.4 * REACH)
    kept = 8 * (1 + LN9 / 25) / 2 * 8
    s_depth = 4 * (1 + LN9 / 8) / 2
    flops = (
        (2 * 2 + 2) * s_width * 64
        + leaky[0]
        + (2 * 8 * taps + 1) * 4 * 64
        + 4 * (2.5 * 64 * 6 + 2 * 8 * 5 + 2.5 * kept * math.log2(kept))
        + block[0] * s_depth
        + norm[0]
    )
    params = (3 * s_width + 1) + (8 * taps * 4 + 4 + 2) + 2 + (block[1] * s_depth + 1) + norm[1]

    loss = build_network_loss("complexity", network, checked, {"target": 0.5, "measure": "flops"})
    target = 0.5 * checked.flops
    assert num(loss.loss()) == pytest.approx((flops / target - 1) ** 2, rel=1e-5)
    metrics = loss.metrics()
    assert metrics["flops_effective"] == pytest.approx(flops, rel=1e-6)
    assert metrics["params_effective"] == pytest.approx(params, rel=1e-6)
    assert (metrics["flops_nominal"], metrics["params_nominal"]) == (checked.flops, checked.params)
    assert metrics["ratio"] == pytest.approx(flops / target, rel=1e-6)

    absolute = build_network_loss("complexity", network, checked, {"target": 1000, "measure": "params"})
    assert num(absolute.loss()) == pytest.approx((params / 1000 - 1) ** 2, rel=1e-5)
    loss.loss().backward()  # every mask moves the FLOPs (the low-pass has no parameters to save)
    assert all(float(p.grad) != 0 for _, p in architecture_parameters(network))


@pytest.mark.parametrize(
    "options,fragment",
    [({"measure": "latency"}, "measure"), ({"target": -1}, "target"), ({"target": "x"}, "target")],
)
def test_complexity_loss_rejects_bad_options(options: dict[str, Any], fragment: str) -> None:
    checked = check_tree(parse_tree(TREE), None, im(2, 8, 8))
    with pytest.raises(EinspaceError, match=fragment):
        build_network_loss("complexity", compile_network(checked, classes=3), checked, options)

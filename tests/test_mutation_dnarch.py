"""DNArch terminals (einspace.ops.dnarch, einspace.ops._dnarch_modules): boundaries, initial masks,
costs at small masks and the complexity loss's target, against hand computations.

Written in the mutation-testing round (scripts/mutation.py): every refusal is tried at its boundary
(a kernel as large as the axis accepted, one more refused; target 1 a fraction, above 1 absolute),
the initial masks against Eqs. 1-2 evaluated by hand, and the low-pass cost below one kept point.
"""

from __future__ import annotations

import math
import re
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from einspace import check_tree, compile_backbone, parse_tree
from einspace.errors import EinspaceError, Infeasible
from einspace.ops import canonical_args, get_op
from einspace.ops._dnarch_modules import GaussianMask, SigmoidMask
from einspace.ops.dnarch import check_complexity_options
from einspace.ops.trainable import (
    architecture_metrics,
    build_network_loss,
    check_network_loss,
    constrain_architecture,
)
from einspace.state import COL, IM, FeatureState

REACH = math.sqrt(2 * math.log(10))  # Eq. 3 with T_m = 0.1: x_T = sigma * sqrt(2 ln 10)


def im(*shape: int) -> FeatureState:
    return FeatureState(tuple(shape), IM)


def col(*shape: int) -> FeatureState:
    return FeatureState(tuple(shape), COL)


# ---------------------------------------------------------------- arguments and shapes


#: (op, accepted argument sets, refused ones with the phrase they get).
ARGUMENTS = [
    ("dnarch_kernel", [{"k": 3, "d": 1}, {"k": 9, "d": 2}],
     [({"k": 1, "d": 2}, "must be odd and >= 3"), ({"k": 4, "d": 2}, "must be odd and >= 3"),
      ({"k": 3, "d": 0}, "must be >= 1")]),
    ("dnarch_width", [{"d": 1}], [({"d": 0}, "must be >= 1"), ({"d": -3}, "must be >= 1")]),
    ("dnarch_depth", [{"blocks": 1, "k": 1}, {"blocks": 2, "k": 3}],
     [({"blocks": 0, "k": 1}, "must be >= 1"), ({"blocks": 1, "k": 2}, "must be odd and >= 1"),
      ({"blocks": 1, "k": -1}, "must be odd and >= 1")]),
]  # fmt: skip


@pytest.mark.parametrize("name, good, bad", ARGUMENTS, ids=[a[0] for a in ARGUMENTS])
def test_arguments_at_their_boundaries(name: str, good: list[dict], bad: list[tuple[dict, str]]) -> None:
    op = get_op(name)
    for args in good:
        assert dict(canonical_args(op, args)) == args
    for args, phrase in bad:
        with pytest.raises(EinspaceError, match=f": {re.escape(phrase)}$"):
            canonical_args(op, args)


#: (op, args, input accepted, input refused, message): a kernel as large as the smallest spatial
#: axis fits, one more does not; two samples can be filtered, one cannot.
FITS = [
    ("dnarch_kernel", {"k": 5, "d": 2}, im(3, 5, 8), im(3, 8, 4),
     "dnarch_kernel: kernel 5 larger than the spatial extent (8, 4) of im[3x8x4]"),
    ("dnarch_kernel", {"k": 3, "d": 2}, col(3, 2), col(2, 7),
     "dnarch_kernel: kernel 3 larger than the spatial extent (2,) of col[2x7]"),
    ("dnarch_depth", {"blocks": 2, "k": 3}, im(2, 3, 3), im(2, 3, 2),
     "dnarch_depth: kernel 3 larger than the spatial extent (3, 2) of im[2x3x2]"),
    ("dnarch_resolution", {}, im(2, 2, 2), im(2, 2, 1),
     "dnarch_resolution: no frequencies to cut on a spatial axis of one sample in im[2x2x1]"),
    ("dnarch_resolution", {}, col(2, 1), col(1, 5),
     "dnarch_resolution: no frequencies to cut on a spatial axis of one sample in col[1x5]"),
]  # fmt: skip


@pytest.mark.parametrize("name, args, good, bad, message", FITS, ids=[f"{f[0]}-{f[4]}" for f in FITS])
def test_spatial_extents_at_their_boundaries(name, args, good, bad, message) -> None:
    op = get_op(name)
    module = op.build((good,), args)
    (out,) = op.infer((good,), args)
    assert module(torch.randn(2, *good.shape)).shape == (2, *out.shape)
    for call in (op.infer, op.build):
        with pytest.raises(Infeasible, match=f"^{re.escape(message)}$"):
            call((bad,), args)


@pytest.mark.parametrize("name", ["dnarch_kernel", "dnarch_width", "dnarch_resolution", "dnarch_depth"])
def test_refused_by_export_with_the_reason(name: str) -> None:
    op = get_op(name)
    assert not op.exportable
    assert op.export_refusal.startswith("DNArch terminals learn their size through masks while training")


# ---------------------------------------------------------------- masks at initialisation


def test_gaussian_mask_starts_with_its_support_just_reaching_the_outermost_taps() -> None:
    mask = GaussianMask(5)
    coords = [-1.0, -0.5, 0.0, 0.5, 1.0]
    expected = [math.exp(-0.5 * (c * REACH) ** 2) for c in coords]
    assert expected[0] == pytest.approx(0.1)
    torch.testing.assert_close(mask(), torch.tensor(expected))
    assert mask.support() == 5
    assert mask.sigma_min == pytest.approx(0.5 / REACH)  # x_T = 0.5: the neighbours of the centre


def test_sigmoid_masks_start_at_the_upper_bound_and_are_clamped_between_the_bounds() -> None:
    mask = SigmoidMask(torch.linspace(-1, 1, 5), 5, 25.0)
    # 0.85 at the highest coordinate (1) at the start and the upper clamp, 0.95 at the lowest at the other
    values = [1 / (1 + math.exp(-25 * (mask.mu.item() - c))) for c in (-1, -0.5, 0, 0.5, 1)]
    assert values[-1] == pytest.approx(0.85, abs=1e-6)
    torch.testing.assert_close(mask(), torch.tensor(values))
    assert mask.mu_min == pytest.approx(-1 + math.log(0.95 / 0.05) / 25)
    assert mask.mu_max == pytest.approx(1 + math.log(0.85 / 0.15) / 25)
    with torch.no_grad():
        mask.mu.fill_(0.5)
    constrain_architecture(mask)
    assert mask.mu.item() == 0.5  # inside the bounds: untouched


def test_weights_start_as_a_fresh_layer_would() -> None:
    """U(±1/sqrt(fan_in)) for the kernel's and the width's weights and biases."""
    torch.manual_seed(0)
    kernel = get_op("dnarch_kernel").build((im(16, 7, 7),), {"k": 5, "d": 64})
    width = get_op("dnarch_width").build((col(3, 400),), {"d": 64})
    for module, fan_in in ((kernel, 16 * 25), (width, 400)):
        for tensor in (module.weight, module.bias):
            bound = 1 / math.sqrt(fan_in)
            tensor = tensor.detach()
            assert float(tensor.abs().max()) <= bound
            assert float(tensor.max()) > 0.9 * bound and float(tensor.min()) < -0.9 * bound


# ---------------------------------------------------------------- costs and metrics


def test_low_pass_cost_at_a_cut_below_one_point_counts_no_inverse_transform() -> None:
    """At the lowest clamp on 8x8 each axis keeps 0.103 of its size: 0.68 points in all, where
    log2 would be negative; the inverse FFT then costs nothing."""
    module = get_op("dnarch_resolution").build((im(3, 8, 8),), {})
    with torch.no_grad():
        for mask in module.masks:
            mask.mu.fill_(-10.0)
    constrain_architecture(module)
    per_axis = (module.masks[0].mu.item() + math.log(9) / 25 + 1) / 2 * 8
    kept = per_axis**2
    assert kept < 1
    costs = module.costs()
    assert costs["flops"].item() == pytest.approx(3 * (2.5 * 64 * 6 + 2 * 8 * 5), rel=1e-6)
    assert costs["params"].item() == 2
    with torch.no_grad():
        for mask in module.masks:
            mask.mu.fill_(0.5)  # 0.59 of each axis: 22.4 points
    kept = ((0.5 + math.log(9) / 25 + 1) / 2 * 8) ** 2
    flops = 3 * (2.5 * 64 * 6 + 2 * 8 * 5 + 2.5 * kept * math.log2(kept))
    assert module.costs()["flops"].item() == pytest.approx(flops, rel=1e-5)
    assert module.costs()["flops"].dtype == torch.float32


def test_low_pass_metrics_on_two_axes_of_even_and_odd_size() -> None:
    """Saturated: all n samples (min(n, 2 f_c + 1): 8 of 9 on the even axis); at mu = 0 the
    frequencies up to the middle coordinate, 0..2 of 0..4 and 0..3 of 0..7."""
    module = get_op("dnarch_resolution").build((im(2, 8, 15),), {})
    with torch.no_grad():
        for mask in module.masks:
            mask.mu.fill_(5.0)
    assert architecture_metrics(module) == {
        "arch/network/resolution_h": 8.0,
        "arch/network/resolution_h_nominal": 8.0,
        "arch/network/resolution_w": 15.0,
        "arch/network/resolution_w_nominal": 15.0,
    }
    with torch.no_grad():
        for mask in module.masks:
            mask.mu.fill_(0.0)
    metrics = architecture_metrics(module)
    assert (metrics["arch/network/resolution_h"], metrics["arch/network/resolution_w"]) == (5.0, 7.0)


def test_kernel_and_width_metrics() -> None:
    kernel = get_op("dnarch_kernel").build((im(2, 9, 9),), {"k": 7, "d": 3})
    with torch.no_grad():
        kernel.masks[0].sigma.fill_(0.4 / REACH)  # |c| <= 0.4 of 0, ±1/3, ±2/3, ±1: three taps
    assert architecture_metrics(kernel) == {
        "arch/network/kernel_h": 3.0,
        "arch/network/kernel_h_nominal": 7.0,
        "arch/network/kernel_w": 7.0,
        "arch/network/kernel_w_nominal": 7.0,
    }
    width = get_op("dnarch_width").build((col(4, 3),), {"d": 9})
    with torch.no_grad():
        width.mask.mu.fill_(-0.3)  # keeps -1, -0.75, -0.5 and -0.25 (sigmoid(25 * -0.05) > 0.1)
    assert architecture_metrics(width) == {"arch/network/width": 4.0, "arch/network/width_nominal": 9.0}


# ---------------------------------------------------------------- the complexity loss's options


@pytest.mark.parametrize(
    "options",
    [{}, {"target": 1e-9}, {"target": 1}, {"target": 3}, {"measure": "params"}, {"measure": "flops"}],
)
def test_complexity_options_accepted(options: dict[str, Any]) -> None:
    check_complexity_options(**options)
    check_network_loss("complexity", options)


@pytest.mark.parametrize(
    "options, message",
    [
        ({"target": 0}, "complexity loss: target must be a number > 0, got 0"),
        ({"target": -0.5}, "complexity loss: target must be a number > 0, got -0.5"),
        ({"target": True}, "complexity loss: target must be a number > 0, got True"),
        ({"target": "1"}, "complexity loss: target must be a number > 0, got '1'"),
        ({"measure": "latency"}, "complexity loss: measure must be flops or params, got 'latency'"),
    ],
)
def test_complexity_options_refused(options: dict[str, Any], message: str) -> None:
    checks = (lambda: check_complexity_options(**options), lambda: check_network_loss("complexity", options))
    for check in checks:
        with pytest.raises(EinspaceError, match=f"^{re.escape(message)}$"):
            check()


def _single(call: str, state: FeatureState) -> tuple[torch.nn.Module, Any]:
    checked = check_tree(parse_tree(f"(S (C {call}))"), None, state)
    return compile_backbone(checked), checked


@pytest.mark.parametrize("target, expected", [(1, "nominal"), (0.25, "quarter"), (1.5, 1.5), (40, 40.0)])
def test_a_target_up_to_1_is_a_fraction_of_the_nominal_cost_above_it_a_number(target, expected) -> None:
    network, checked = _single("dnarch_width(d=8)", col(6, 4))
    loss = build_network_loss("complexity", network, checked, {"target": target, "measure": "params"})
    nominal = 5 * 8 + 1
    want = {"nominal": nominal, "quarter": nominal / 4}.get(expected, expected)
    assert loss.target == pytest.approx(want)
    assert loss.metrics()["target"] == pytest.approx(want)
    # at the initial masks the width is the nominal 8 (clipped): the loss is (41 / target - 1)^2
    assert loss.loss().item() == pytest.approx((nominal / want - 1) ** 2, rel=1e-5)


def test_a_network_without_dnarch_terminals_has_a_constant_cost() -> None:
    network, checked = _single("leaky_relu", im(2, 3, 4))
    loss = build_network_loss("complexity", network, checked, {"target": 0.5})
    assert isinstance(loss.loss(), torch.Tensor)
    assert loss.loss().item() == pytest.approx(1.0)
    assert loss.metrics() == {
        "flops_effective": 24.0,
        "params_effective": 0.0,
        "flops_nominal": 24.0,
        "params_nominal": 0.0,
        "target": 12.0,
        "ratio": 2.0,
    }
    message = "^complexity loss: the network has no params to set a target on$"
    with pytest.raises(EinspaceError, match=message):
        build_network_loss("complexity", network, checked, {"measure": "params"})


# ---------------------------------------------------------------- masked modules at unsaturated masks


def _sigmoid_mask(coords: list[float], mu: float, tau: float) -> torch.Tensor:
    """Eq. 2 with the threshold, by hand."""
    values = [1 / (1 + math.exp(-tau * (mu - c))) for c in coords]
    return torch.tensor([v if v >= 0.1 else 0.0 for v in values], dtype=torch.float64)


def test_kernel_masks_apply_per_axis() -> None:
    """Different sigmas on H and W: the kernel is the weight times mask_h (rows) x mask_w (columns)."""
    torch.manual_seed(4)
    module = get_op("dnarch_kernel").build((im(2, 7, 6),), {"k": 5, "d": 3}).double()
    with torch.no_grad():
        module.masks[0].sigma.fill_(0.3)  # taps 0, ±0.5 kept
        module.masks[1].sigma.fill_(1.0)  # every tap kept
    coords = [-1.0, -0.5, 0.0, 0.5, 1.0]
    gauss = [[math.exp(-0.5 * (c / s) ** 2) for c in coords] for s in (0.3, 1.0)]
    h, w = (torch.tensor([v if v >= 0.1 else 0.0 for v in g], dtype=torch.float64) for g in gauss)
    assert h.tolist()[0] == 0.0 and w.tolist()[0] > 0
    x = torch.randn(2, 2, 7, 6, dtype=torch.float64)
    expected = F.conv2d(x, module.weight * h[:, None] * w[None, :], module.bias, padding=2)
    torch.testing.assert_close(module(x), expected)
    size = (2 * 0.3 * REACH / 2 * 5) * 5  # Eq. 9 per axis, the second clipped at 5
    assert module.masked_size().item() == pytest.approx(size)


@pytest.mark.parametrize("state", [im(3, 4, 5), col(4, 3)], ids=str)
def test_width_mask_scales_the_output_channels(state: FeatureState) -> None:
    torch.manual_seed(5)
    module = get_op("dnarch_width").build((state,), {"d": 5}).double()
    with torch.no_grad():
        module.mask.mu.fill_(0.1)
    mask = _sigmoid_mask([-1, -0.5, 0, 0.5, 1], 0.1, 25.0)
    x = torch.randn(2, *state.shape, dtype=torch.float64)
    if state.mode == IM:
        linear = torch.einsum("bchw,dc->bdhw", x, module.weight) + module.bias[:, None, None]
        expected = linear * mask[:, None, None]
    else:
        expected = (x @ module.weight.T + module.bias) * mask
    torch.testing.assert_close(module(x), expected)


def test_low_pass_on_two_axes_masks_each_by_its_own_frequencies() -> None:
    """8 x 6: H two-sided (|frequency| 0, 1, 2, 3, 4, 3, 2, 1 of 4), W one-sided (0..3 of 3)."""
    torch.manual_seed(6)
    module = get_op("dnarch_resolution").build((im(2, 8, 6),), {})
    with torch.no_grad():
        module.masks[0].mu.fill_(-0.2)
        module.masks[1].mu.fill_(0.4)
    h = _sigmoid_mask([-1 + f / 2 for f in (0, 1, 2, 3, 4, 3, 2, 1)], -0.2, 25.0)
    w = _sigmoid_mask([-1 + f * 2 / 3 for f in range(4)], 0.4, 25.0)
    x = torch.randn(2, 2, 8, 6)
    expected = torch.fft.irfft2(torch.fft.rfft2(x.double()) * torch.outer(h, w), s=(8, 6))
    torch.testing.assert_close(module(x), expected.float())
    assert module.costs()["params"].dtype == torch.float32
    assert module(x.double()).dtype == torch.float64  # computed in float32, returned as given
    assert module.nominal == {"flops": round(2 * (5 * 48 * math.log2(48) + 2 * 8 * 4)), "params": 2}


def test_depth_stack_runs_on_the_meta_device_for_shapes() -> None:
    with torch.device("meta"):
        module = get_op("dnarch_depth").build((im(2, 5, 5),), {"blocks": 2, "k": 5})
        out = module(torch.empty(3, 2, 5, 5))
    assert out.is_meta and out.shape == (3, 2, 5, 5)


def test_a_block_under_a_zero_mask_is_not_run() -> None:
    """Training: a skipped block's BatchNorm keeps its running statistics, a run block's move."""
    module = get_op("dnarch_depth").build((im(2, 4, 4),), {"blocks": 2, "k": 3}).train()
    with torch.no_grad():
        module.mask.mu.fill_(-0.5)  # block coordinates -1 (kept) and 1 (zero)
    assert module.mask().tolist()[1] == 0.0
    module(torch.randn(3, 2, 4, 4) + 5)
    first, second = (block[1].running_mean for block in module.blocks)
    assert float(first.abs().min()) > 0 and second.tolist() == [0.0, 0.0]


def test_depth_blocks_use_a_leaky_slope_of_one_hundredth() -> None:
    module = get_op("dnarch_depth").build((col(4, 2),), {"blocks": 1, "k": 1}).eval()
    block = module.blocks[0]
    assert isinstance(block[2], torch.nn.LeakyReLU) and block[2].negative_slope == 0.01
    assert isinstance(block[1], torch.nn.LayerNorm) and block[0].padding == (0,)


def test_complexity_loss_defaults_are_half_the_flops() -> None:
    network, checked = _single("dnarch_width(d=4)", col(3, 2))
    loss = build_network_loss("complexity", network, checked, {})
    assert loss.measure == "flops"
    assert loss.target == pytest.approx(0.5 * checked.flops)


def test_a_fraction_may_set_a_target_of_one_or_less() -> None:
    """Two mask parameters, half of them: a target of 1 parameter, which is still a cost."""
    network, checked = _single("dnarch_resolution", im(2, 4, 4))
    loss = build_network_loss("complexity", network, checked, {"target": 0.5, "measure": "params"})
    assert loss.target == 1.0
    assert loss.loss().item() == pytest.approx(1.0)


def test_mask_coordinates_are_not_saved() -> None:
    """Only parameters go into a state dict: the coordinates are rebuilt from the shapes."""
    module = get_op("dnarch_kernel").build((im(2, 5, 5),), {"k": 3, "d": 2})
    assert set(module.state_dict()) == {"weight", "bias", "masks.0.sigma", "masks.1.sigma"}
    width = get_op("dnarch_width").build((col(3, 2),), {"d": 3})
    assert set(width.state_dict()) == {"weight", "bias", "mask.mu"}


def test_costs_follow_the_masks_device_and_dtype() -> None:
    with torch.device("meta"):
        low_pass = get_op("dnarch_resolution").build((im(2, 4, 4),), {})
    costs = low_pass.costs()  # a parameter count that does not depend on the masks, too
    assert {c.device.type for c in costs.values()} == {"meta"}
    kernel = get_op("dnarch_kernel").build((im(2, 5, 5),), {"k": 3, "d": 2}).double()
    assert {c.dtype for c in kernel.costs().values()} == {torch.float64}

"""NOS calibrations (einspace.ops.nos, einspace.ops._nos_modules): exact counts and refusals.

Written in the mutation-testing round (scripts/mutation.py): parameters and FLOPs are counted by
hand from the definition (module by module, a multiply-add 2), every refusal is tried at its
boundary (16 and 8 generator channels accepted, one fewer refused), and the modules are checked
against plain torch on inputs where a mix-up shows (features and generator of different widths
and resolutions, a kernel that is not symmetric).
"""

from __future__ import annotations

import math
import re
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from einspace.errors import EinspaceError, Infeasible
from einspace.ops import canonical_args, get_op
from einspace.ops.registry import Group
from einspace.state import COL, IM, FeatureState


def im(*shape: int) -> FeatureState:
    return FeatureState(tuple(shape), IM)


# ---------------------------------------------------------------- counts by hand


def channel_counts(f: tuple[int, ...], g: tuple[int, ...]) -> tuple[int, int]:
    """Pool, 1x1 conv to C_g//16, ReLU, 1x1 conv to C_f, sigmoid on (C_f, 1, 1); F + F·A."""
    c_g, r, c_f = g[0], g[0] // 16, f[0]
    params = c_g * r + r * c_f
    made = math.prod(g) + 2 * c_g * r + r + 2 * r * c_f + c_f
    return params, made + 2 * math.prod(f)


def spatial_counts(f: tuple[int, ...], g: tuple[int, ...]) -> tuple[int, int]:
    """Per position: 1x1 conv to C_g//16, BatchNorm (4/element, 2 params/channel), ReLU, 3x3 conv
    to 1, sigmoid; F + F·A."""
    c_g, r, hw = g[0], g[0] // 16, g[1] * g[2]
    params = c_g * r + 2 * r + 9 * r
    made = (2 * c_g * r + 4 * r + r + 2 * 9 * r + 1) * hw
    return params, made + 2 * math.prod(f)


def dynamic_counts(f: tuple[int, ...], g: tuple[int, ...], k: int) -> tuple[int, int]:
    """u: 1x1 conv to C_g//8, BatchNorm, ReLU; m: 1x1 conv to k², softmax (3/element); u·mᵀ;
    1x1 conv C' -> C_f on (k, k); softmax over the taps; F + F ⊛ D (2k² per element, 1 to add)."""
    c_g, r, hw, c_f, t = g[0], g[0] // 8, g[1] * g[2], f[0], k * k
    params = c_g * r + 2 * r + c_g * t + r * c_f
    u = (2 * c_g * r + 4 * r + r) * hw
    m = (2 * c_g * t + 3 * t) * hw
    kernel = 2 * r * t * hw + 2 * r * c_f * t + 3 * c_f * t
    return params, u + m + kernel + 2 * t * math.prod(f) + math.prod(f)


#: (op, args, features, generator or None for the unary form, (params, FLOPs)).
COUNTS: list[tuple[str, dict[str, Any], FeatureState, FeatureState | None, tuple[int, int]]] = [
    ("channel_attention", {}, im(48, 5, 7), None, channel_counts((48, 5, 7), (48, 5, 7))),
    ("channel_calibrate", {}, im(24, 6, 5), im(33, 3, 4), channel_counts((24, 6, 5), (33, 3, 4))),
    ("channel_calibrate", {}, im(5, 2, 3), im(16, 7, 4), channel_counts((5, 2, 3), (16, 7, 4))),
    ("spatial_attention", {}, im(40, 6, 3), None, spatial_counts((40, 6, 3), (40, 6, 3))),
    ("spatial_calibrate", {}, im(7, 5, 6), im(35, 5, 6), spatial_counts((7, 5, 6), (35, 5, 6))),
    ("dynamic_conv", {"k": 3}, im(24, 5, 7), None, dynamic_counts((24, 5, 7), (24, 5, 7), 3)),
    ("dynamic_calibrate", {"k": 5}, im(6, 7, 5), im(17, 3, 4), dynamic_counts((6, 7, 5), (17, 3, 4), 5)),
    ("dynamic_calibrate", {"k": 1}, im(3, 4, 4), im(8, 2, 5), dynamic_counts((3, 4, 4), (8, 2, 5), 1)),
]


def _signal(f: FeatureState, g: FeatureState | None) -> tuple[FeatureState, ...]:
    return (f,) if g is None else (f, g)


@pytest.mark.parametrize("name, args, f, g, counts", COUNTS, ids=[f"{c[0]}-{c[2]}-{c[3]}" for c in COUNTS])
def test_params_and_flops_are_the_hand_counts(name, args, f, g, counts) -> None:
    op = get_op(name)
    signal = _signal(f, g)
    assert (op.param_count(signal, args), op.flops(signal, args)) == counts
    assert op.infer(signal, args) == (f,)
    assert op.transfer(signal, args) == (f,)
    module = op.build(signal, args)
    assert sum(p.numel() for p in module.parameters()) == counts[0]


# ---------------------------------------------------------------- the registry's view


UNARY = ("channel_attention", "spatial_attention", "dynamic_conv")
COMBINATIONS = ("channel_calibrate", "spatial_calibrate", "dynamic_calibrate")

DESCRIPTIONS = {
    "channel_attention": "NOS self-calibration by channel attention (r = 16): x + x·A(x), im mode",
    "spatial_attention": "NOS self-calibration by spatial attention (r = 16): x + x·A(x), im mode",
    "dynamic_conv": "NOS self-calibration by dynamic convolution (r = 8): x + x ⊛ D(x), im mode",
    "channel_calibrate": "NOS calibrating combination by channel attention (r = 16): F + F·A(G)",
    "spatial_calibrate": "NOS calibrating combination by spatial attention (r = 16): F + F·A(G)",
    "dynamic_calibrate": "NOS calibrating combination by dynamic convolution (r = 8): F + F ⊛ D(G)",
}


@pytest.mark.parametrize("name", UNARY + COMBINATIONS)
def test_registered_with_group_arguments_description_and_export(name: str) -> None:
    op = get_op(name)
    assert op.group is (Group.COMPUTATION if name in UNARY else Group.AGGREGATION)
    assert [a.name for a in op.arguments] == (["k"] if name.startswith("dynamic") else [])
    assert op.description == DESCRIPTIONS[name]
    assert op.exportable is True


@pytest.mark.parametrize("name", ["dynamic_conv", "dynamic_calibrate"])
def test_the_dynamic_kernel_size_must_be_odd_and_positive(name: str) -> None:
    op = get_op(name)
    for k in (1, 3, 7):
        assert canonical_args(op, {"k": k}) == (("k", k),)
    for k in (0, -1, 2, 4):
        with pytest.raises(EinspaceError, match=f"= {k}: must be an odd kernel size >= 1"):
            canonical_args(op, {"k": k})


def test_the_analysis_sees_one_branch_in_for_the_unary_form_two_for_the_combination() -> None:
    for name in UNARY:
        op = get_op(name)
        args = {"k": 3} if name.startswith("dynamic") else {}
        assert op.abstract(IM, 1, args) == (IM, 1)
        assert op.abstract(IM, 2, args) is None
        assert op.abstract(COL, 1, args) is None
    for name in COMBINATIONS:
        op = get_op(name)
        args = {"k": 3} if name.startswith("dynamic") else {}
        assert op.abstract(IM, 2, args) == (IM, 1)
        assert op.abstract(IM, 1, args) is None
        assert op.abstract(IM, 3, args) is None
        assert op.abstract(COL, 2, args) is None


# ---------------------------------------------------------------- refusals at their boundaries


#: (op, args, signal that is accepted, signal just past the boundary, message it gets).
BOUNDARIES = [
    ("channel_attention", {}, (im(16, 2, 2),), (im(15, 2, 2),),
     "channel_attention reduces 15 channels by 16 to none: it needs at least 16"),
    ("spatial_attention", {}, (im(16, 2, 2),), (im(15, 2, 2),),
     "spatial_attention reduces 15 channels by 16 to none: it needs at least 16"),
    ("dynamic_conv", {"k": 3}, (im(8, 2, 2),), (im(7, 2, 2),),
     "dynamic_conv reduces 7 channels by 8 to none: it needs at least 8"),
    ("channel_calibrate", {}, (im(1, 2, 2), im(16, 5, 5)), (im(16, 2, 2), im(15, 5, 5)),
     "channel_calibrate reduces 15 channels by 16 to none: it needs at least 16"),
    ("dynamic_calibrate", {"k": 3}, (im(1, 2, 2), im(8, 3, 3)), (im(8, 2, 2), im(7, 3, 3)),
     "dynamic_calibrate reduces 7 channels by 8 to none: it needs at least 8"),
    ("spatial_calibrate", {}, (im(3, 4, 5), im(16, 4, 5)), (im(3, 4, 5), im(16, 4, 6)),
     "spatial_calibrate needs features and generator of one resolution, got im[3x4x5] and im[16x4x6]"),
    ("spatial_calibrate", {}, (im(3, 4, 5), im(16, 4, 5)), (im(3, 4, 5), im(16, 5, 5)),
     "spatial_calibrate needs features and generator of one resolution, got im[3x4x5] and im[16x5x5]"),
    ("channel_calibrate", {}, (im(16, 2, 2), im(16, 2, 2)), (im(16, 2, 2),) * 3,
     "channel_calibrate needs 2 branches (features, generator), got 3 x im[16x2x2]"),
    ("channel_calibrate", {}, (im(16, 2, 2), im(16, 2, 2)), (im(16, 2, 2), FeatureState((4, 16), COL)),
     "channel_calibrate needs im-mode features (C, H, W), got col[4x16]"),
    ("channel_calibrate", {}, (im(16, 2, 2), im(16, 2, 2)), (FeatureState((4, 16), COL), im(16, 2, 2)),
     "channel_calibrate needs im-mode features (C, H, W), got col[4x16]"),
    ("dynamic_conv", {"k": 3}, (im(8, 2, 2),), (FeatureState((8, 2, 2), COL),),
     "dynamic_conv needs im-mode features (C, H, W), got col[8x2x2]"),
    ("spatial_attention", {}, (im(16, 2, 2),), (FeatureState((16, 4), IM),),
     "spatial_attention needs im-mode features (C, H, W), got im[16x4]"),
]  # fmt: skip


@pytest.mark.parametrize(
    "name, args, good, bad, message", BOUNDARIES, ids=[f"{b[0]}-{b[3][-1]}" for b in BOUNDARIES]
)
def test_refused_just_past_each_boundary_with_the_reason(name, args, good, bad, message) -> None:
    op = get_op(name)
    assert op.infer(good, args) == good[:1]
    assert op.param_count(good, args) > 0 and op.flops(good, args) > 0
    for call in (op.infer, op.param_count, op.flops, op.build):
        with pytest.raises(Infeasible, match=f"^{re.escape(message)}"):
            call(bad, args)


def test_channel_and_dynamic_calibration_take_a_generator_of_another_resolution() -> None:
    """Only spatial attention needs F and G of one resolution: the other two pool G."""
    f, g = torch.randn(2, 3, 5, 6), torch.randn(2, 16, 2, 3)
    for name, args in (("channel_calibrate", {}), ("dynamic_calibrate", {"k": 3})):
        op = get_op(name)
        module = op.build((im(3, 5, 6), im(16, 2, 3)), args)
        assert module([f, g]).shape == f.shape


# ---------------------------------------------------------------- the modules against plain torch


def test_channel_attention_of_the_generator_scales_each_feature_channel() -> None:
    """Two samples, C_f != C_g, G of another resolution: A(G) differs per sample and channel."""
    torch.manual_seed(1)
    module = get_op("channel_calibrate").build((im(3, 4, 5), im(32, 2, 3)), {}).double()
    gen = module.generator
    assert (gen.reduce.weight.shape, gen.expand.weight.shape) == ((2, 32, 1, 1), (3, 2, 1, 1))
    assert gen.reduce.bias is None and gen.expand.bias is None
    f, g = torch.randn(2, 3, 4, 5, dtype=torch.float64), torch.randn(2, 32, 2, 3, dtype=torch.float64)
    pooled = g.sum(dim=(2, 3)) / 6  # (2, 32)
    hidden = (pooled @ gen.reduce.weight[:, :, 0, 0].T).clamp(min=0)
    a = 1 / (1 + torch.exp(-(hidden @ gen.expand.weight[:, :, 0, 0].T)))  # (2, 3)
    torch.testing.assert_close(module([f, g]), f * (1 + a[:, :, None, None]))


def test_spatial_attention_uses_batch_statistics_when_training() -> None:
    torch.manual_seed(2)
    module = get_op("spatial_attention").build((im(16, 4, 3),), {}).double().train()
    gen = module.generator
    assert gen.spatial.weight.shape == (1, 1, 3, 3) and gen.spatial.bias is None
    assert gen.reduce.bias is None and gen.norm.num_features == 1
    x = torch.randn(3, 16, 4, 3, dtype=torch.float64)
    h = F.conv2d(x, gen.reduce.weight)
    h = (h - h.mean()) / torch.sqrt(h.var(unbiased=False) + gen.norm.eps)  # one channel, fresh affine
    a = torch.sigmoid(F.conv2d(h.clamp(min=0), gen.spatial.weight, padding=1))
    torch.testing.assert_close(module(x), x + x * a)


def test_dynamic_kernel_is_applied_as_a_correlation_with_same_padding() -> None:
    """A kernel with different taps everywhere (not symmetric), by explicit shifted sums."""
    torch.manual_seed(3)
    op = get_op("dynamic_calibrate")
    module = op.build((im(2, 5, 4), im(8, 3, 3)), {"k": 3}).double().eval()
    gen = module.generator
    assert (gen.k, gen.values.weight.shape, gen.taps.weight.shape) == (3, (1, 8, 1, 1), (9, 8, 1, 1))
    assert gen.expand.weight.shape == (2, 1, 1, 1)
    assert all(c.bias is None for c in (gen.values, gen.taps, gen.expand))
    f, g = torch.randn(2, 2, 5, 4, dtype=torch.float64), torch.randn(2, 8, 3, 3, dtype=torch.float64)
    kernel = gen(g)
    assert kernel.shape == (2, 2, 3, 3)
    torch.testing.assert_close(kernel.sum(dim=(2, 3)), torch.ones(2, 2, dtype=torch.float64))
    padded = F.pad(f, (1, 1, 1, 1))
    taps = [(i, j) for i in range(3) for j in range(3)]
    filtered = sum(kernel[:, :, i, j, None, None] * padded[:, :, i : i + 5, j : j + 4] for i, j in taps)
    torch.testing.assert_close(module([f, g]), f + filtered)

"""The core operations: registry contract over every op, equivalences with plain torch, infeasible reasons."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import einops
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from einspace.errors import EinspaceError, Infeasible, UnknownOperationError
from einspace.ops import (
    Group,
    Operation,
    _modules,
    canonical_args,
    get_op,
    list_ops,
    register_op,
    unregister_op,
)
from einspace.state import COL, IM, FeatureState, Signal

torch.manual_seed(0)


def im(*shape: int, folds: tuple[tuple[int, int], ...] = ()) -> FeatureState:
    return FeatureState(tuple(shape), IM, folds)


def col(*shape: int, folds: tuple[tuple[int, int], ...] = ()) -> FeatureState:
    return FeatureState(tuple(shape), COL, folds)


def run(name: str, args: dict[str, Any], signal: Signal, inputs: Any) -> Any:
    """Build op `name` for `signal` and apply it to `inputs` (a tensor, or a list for several branches)."""
    return get_op(name).build(signal, args)(inputs)


def chain(
    steps: Sequence[tuple[str, dict[str, Any]]], state: FeatureState
) -> tuple[nn.Sequential, FeatureState]:
    """A sequence of one-to-one ops as one module, with the state it infers."""
    modules = []
    for name, args in steps:
        op = get_op(name)
        modules.append(op.build((state,), args))
        (state,) = op.infer((state,), args)
    return nn.Sequential(*modules), state


# ---------------------------------------------------------------- registry contract, every op

#: (op, args, input signal): representative uses of every core op, both modes where both apply.
CASES: list[tuple[str, dict[str, Any], Signal]] = [
    ("clone", {"b": 2}, (im(3, 8, 10),)),
    ("clone", {"b": 4}, (col(6, 5),)),
    ("group_dim", {"dim": 1, "b": 2}, (im(4, 6, 8),)),
    ("group_dim", {"dim": 3, "b": 4}, (im(3, 6, 8),)),
    ("group_dim", {"dim": 2, "b": 2}, (col(6, 4),)),
    ("matmul", {"scaled": False}, (col(5, 4), col(4, 3))),
    ("matmul", {"scaled": True}, (im(2, 5, 4), im(2, 4, 3))),
    ("add", {}, (im(3, 4, 5),) * 2),
    ("add", {}, (col(6, 4),) * 4),
    ("concat", {"dim": 1, "b": 2}, (im(3, 4, 5), im(2, 4, 5))),
    ("concat", {"dim": 2, "b": 4}, (col(6, 4),) * 4),
    ("concat", {"dim": 3, "b": 2}, (im(3, 4, 5), im(3, 4, 2))),
    ("identity", {}, (im(3, 4, 5),)),
    ("im2col", {"k": 3, "s": 2, "p": 1}, (im(3, 8, 10),)),
    ("im2col", {"k": 4, "s": 4, "p": 0}, (im(2, 8, 12, folds=((6, 6),)),)),
    ("col2im", {}, (col(20, 6, folds=((4, 5),)),)),
    ("permute", {"order": (2, 3, 1)}, (im(3, 5, 7),)),
    ("permute", {"order": (2, 1)}, (col(6, 4),)),
    ("linear", {"d": 7}, (col(5, 4),)),
    ("linear", {"d": 7}, (im(3, 6, 8),)),
    ("norm", {}, (im(3, 6, 8),)),
    ("norm", {}, (col(5, 4),)),
    ("leaky_relu", {}, (im(3, 4, 5),)),
    ("softmax", {}, (col(5, 4),)),
    ("pos_enc", {}, (im(3, 4, 5),)),
    ("pos_enc", {}, (col(5, 4),)),
]


def _case_id(case: tuple[str, dict[str, Any], Signal]) -> str:
    name, args, signal = case
    return f"{name}({','.join(f'{k}={v}' for k, v in args.items())})-{'+'.join(map(str, signal))}"


def test_every_core_op_has_cases() -> None:
    core = {n for n in list_ops() if type(get_op(n)).__module__ == "einspace.ops.core"}
    assert {name for name, _, _ in CASES} == core


@pytest.mark.parametrize("case", CASES, ids=_case_id)
def test_op_contract(case: tuple[str, dict[str, Any], Signal]) -> None:
    name, args, signal = case
    op = get_op(name)
    canonical_args(op, args)
    out_signal = op.infer(signal, args)
    module = op.build(signal, args)

    inputs = [torch.randn(2, *s.shape) for s in signal]
    outputs = module(inputs if op.group is Group.AGGREGATION else inputs[0])
    outputs = outputs if op.group is Group.BRANCHING else [outputs]
    assert [tuple(t.shape[1:]) for t in outputs] == [s.shape for s in out_signal]
    assert all(t.shape[0] == 2 and torch.isfinite(t).all() for t in outputs)

    parameters = list(module.parameters())
    assert op.param_count(signal, args) == sum(p.numel() for p in parameters)
    if parameters:
        sum((t * torch.randn_like(t)).sum() for t in outputs).backward()
        assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in parameters)

    flops = op.flops(signal, args)
    assert flops >= 0 and (flops > 0 or name not in {"linear", "matmul"})
    assert op.abstract(signal[0].mode, len(signal), args) == (out_signal[0].mode, len(out_signal))


@pytest.mark.parametrize(
    "name,args,signal,params,flops",
    [
        ("linear", {"d": 7}, (col(5, 4),), 4 * 7 + 7, (2 * 4 * 7 + 7) * 5),
        ("linear", {"d": 7}, (im(3, 6, 8),), 3 * 7 + 7, (2 * 3 * 7 + 7) * 6 * 8),
        ("matmul", {"scaled": False}, (col(5, 4), col(4, 3)), 0, 2 * 5 * 4 * 3),
        ("matmul", {"scaled": True}, (im(2, 5, 4), im(2, 4, 3)), 0, 2 * 2 * 5 * 4 * 3 + 2 * 5 * 3),
        ("add", {}, (col(6, 4),) * 4, 0, 3 * 24),
        ("norm", {}, (im(3, 6, 8),), 2 * 3, 4 * 144),
        ("norm", {}, (col(5, 4),), 2 * 4, 4 * 20),
        ("softmax", {}, (col(5, 4),), 0, 3 * 20),
        ("pos_enc", {}, (col(5, 4),), 20, 20),
        ("im2col", {"k": 3, "s": 1, "p": 1}, (im(3, 6, 8),), 0, 0),
    ],
)
def test_params_and_flops_follow_the_documented_formulas(
    name: str, args: dict[str, Any], signal: Signal, params: int, flops: int
) -> None:
    assert (get_op(name).param_count(signal, args), get_op(name).flops(signal, args)) == (params, flops)


#: Every one-to-one op with the argument values the paper's grammar uses (linear: two small widths).
ONE_TO_ONE = (
    [
        ("im2col", {"k": k, "s": s, "p": p})
        for k, s, p in [(1, 1, 0), (1, 2, 0), (3, 1, 1), (3, 2, 1), (4, 4, 0)]
    ]
    + [("permute", {"order": o}) for o in [(2, 1), (1, 3, 2), (2, 1, 3), (2, 3, 1), (3, 1, 2), (3, 2, 1)]]
    + [("linear", {"d": 3}), ("linear", {"d": 6})]
    + [(name, {}) for name in ("col2im", "identity", "norm", "leaky_relu", "softmax", "pos_enc")]
)


@settings(max_examples=60, deadline=None)
@given(
    shape=st.one_of(
        st.tuples(st.integers(1, 4), st.integers(1, 12), st.integers(1, 12)),
        st.tuples(*[st.integers(1, 9)] * 2),
    ),
    steps=st.lists(st.sampled_from(ONE_TO_ONE), min_size=1, max_size=6),
)
def test_random_chains_infer_the_real_shapes(
    shape: tuple[int, ...], steps: list[tuple[str, dict[str, Any]]]
) -> None:
    """Apply the feasible steps of a random chain; each inferred shape must be the real one."""
    state = im(*shape) if len(shape) == 3 else col(*shape)
    x = torch.randn(2, *shape)
    for name, args in steps:
        op = get_op(name)
        try:
            (after,) = op.infer((state,), args)
        except Infeasible:
            continue
        x = op.build((state,), args)(x)
        state = after
        assert tuple(x.shape[1:]) == state.shape and torch.isfinite(x).all()


# ---------------------------------------------------------------- equivalences with plain torch

CONV_SETTINGS = [(1, 1, 0), (1, 2, 0), (3, 1, 1), (3, 2, 1), (4, 4, 0), (8, 8, 0), (16, 16, 0)]


@pytest.mark.parametrize("shape", [(3, 32, 48), (2, 17, 33)], ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("k,s,p", CONV_SETTINGS)
def test_im2col_linear_col2im_is_conv2d(shape: tuple[int, int, int], k: int, s: int, p: int) -> None:
    d = 5
    block, out = chain(
        [("im2col", {"k": k, "s": s, "p": p}), ("linear", {"d": d}), ("col2im", {})], im(*shape)
    )
    x = torch.randn(2, *shape)
    linear = block[1]
    expected = F.conv2d(x, linear.weight.reshape(d, shape[0], k, k), linear.bias, stride=s, padding=p)
    y = block(x)
    assert tuple(y.shape[1:]) == out.shape and out.folds == ()
    torch.testing.assert_close(y, expected, rtol=1e-4, atol=1e-5)


def test_figure3_residual_block_matches_torch() -> None:
    """Paper Fig. 3: clone -> [im2col(3,1,1) linear col2im norm leaky_relu] + [identity] -> add."""
    c = 4
    state = im(c, 9, 11)
    conv_path, _ = chain(
        [("im2col", {"k": 3, "s": 1, "p": 1}), ("linear", {"d": c}), ("col2im", {})]
        + [("norm", {}), ("leaky_relu", {})],
        state,
    )
    clone, skip = get_op("clone").build((state,), {"b": 2}), get_op("identity").build((state,), {})
    add = get_op("add").build((state, state), {})

    def block(x: torch.Tensor) -> torch.Tensor:
        a, b = clone(x)
        return add([conv_path(a), skip(b)])

    conv, bn = nn.Conv2d(c, c, 3, padding=1), nn.BatchNorm2d(c)
    with torch.no_grad():
        conv.weight.copy_(conv_path[1].weight.reshape(c, c, 3, 3))
        conv.bias.copy_(conv_path[1].bias)
        bn.weight.uniform_(0.5, 1.5)
        bn.bias.uniform_(-0.5, 0.5)
        conv_path[3].load_state_dict(bn.state_dict())

    def reference(x: torch.Tensor) -> torch.Tensor:
        return F.leaky_relu(bn(conv(x)), 0.01) + x

    for train in (True, False):
        conv_path.train(train)
        bn.train(train)
        x = torch.randn(3, *state.shape)
        torch.testing.assert_close(block(x), reference(x), rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(conv_path[3].running_mean, bn.running_mean)


def test_im_linear_is_1x1_conv() -> None:
    linear = get_op("linear").build((im(3, 5, 6),), {"d": 4})
    conv = nn.Conv2d(3, 4, 1)
    with torch.no_grad():
        conv.weight.copy_(linear.weight[:, :, None, None])
        conv.bias.copy_(linear.bias)
    x = torch.randn(2, 3, 5, 6)
    torch.testing.assert_close(linear(x), conv(x))


@pytest.mark.parametrize(
    "order", [(1, 2, 3), (1, 3, 2), (2, 1, 3), (2, 3, 1), (3, 1, 2), (3, 2, 1), (1, 2), (2, 1)]
)
def test_permute_matches_torch(order: tuple[int, ...]) -> None:
    shape = (2, 3, 4, 5)[: len(order)]
    state = im(*shape) if len(order) == 3 else col(*shape)
    x = torch.randn(2, *shape)
    y = run("permute", {"order": order}, (state,), x)
    assert torch.equal(y, x.permute(0, *order))
    assert get_op("permute").infer((state,), {"order": order})[0].shape == tuple(y.shape[1:])


@pytest.mark.parametrize("order", [(1, 3, 2), (2, 3, 1), (2, 1), (1, 2)])
def test_permute_builds_a_module_that_keeps_its_order(order: tuple[int, ...]) -> None:
    """A routing module of its own, which lowering and export read by type and order: the view
    einops' rearrange makes, strides included."""
    shape = (2, 3, 4, 5)[: len(order)]
    state = im(*shape) if len(order) == 3 else col(*shape)
    module = get_op("permute").build((state,), {"order": order})
    assert type(module) is _modules.Permute and module.order == order
    assert module.swaps_last_two == (order in ((1, 3, 2), (2, 1)))
    x = torch.randn(2, *shape)
    axes = [f"a{i}" for i in range(1, len(order) + 1)]
    pattern = f"b {' '.join(axes)} -> b {' '.join(axes[i - 1] for i in order)}"
    expected = einops.rearrange(x, pattern)
    assert torch.equal(module(x), expected) and module(x).stride() == expected.stride()


def test_col2im_builds_a_module_that_keeps_its_fold() -> None:
    module = get_op("col2im").build((col(12, 5, folds=((3, 4),)),), {})
    assert type(module) is _modules.Col2Im and (module.h, module.w) == (3, 4)
    x = torch.randn(2, 12, 5)
    expected = einops.rearrange(x, "b (h w) d -> b d h w", h=3, w=4)
    assert torch.equal(module(x), expected) and module(x).stride() == expected.stride()


def test_every_builtin_operation_declares_whether_it_can_be_exported() -> None:
    """`exportable` on the operation class decides export; the ones that cannot say why."""
    from einspace.ops.registry import BUILTIN_OPERATIONS

    refused = set()
    for names in BUILTIN_OPERATIONS.values():
        for name in names:
            op = get_op(name)
            assert type(op.exportable) is bool, name
            if not op.exportable:
                refused.add(name)
                assert "plain PyTorch" in op.export_refusal, name
    assert refused == {"dnarch_depth", "dnarch_kernel", "dnarch_resolution", "dnarch_width"}


@pytest.mark.parametrize("dim", [1, 2, 3])
def test_group_dim_and_concat_match_torch(dim: int) -> None:
    state = im(4, 8, 12)
    x = torch.randn(2, *state.shape)
    parts = run("group_dim", {"dim": dim, "b": 4}, (state,), x)
    assert all(torch.equal(a, b) for a, b in zip(parts, torch.chunk(x, 4, dim=dim), strict=True))
    joined = run(
        "concat", {"dim": dim, "b": 4}, get_op("group_dim").infer((state,), {"dim": dim, "b": 4}), parts
    )
    assert torch.equal(joined, torch.cat(parts, dim=dim)) and torch.equal(joined, x)


@pytest.mark.parametrize("scaled", [False, True])
def test_matmul_is_scaled_dot_product(scaled: bool) -> None:
    q, k = torch.randn(2, 6, 8), torch.randn(2, 8, 6)
    y = run("matmul", {"scaled": scaled}, (col(6, 8), col(8, 6)), [q, k])
    torch.testing.assert_close(y, q @ k / (math.sqrt(8) if scaled else 1))


def test_norm_matches_functional() -> None:
    x = torch.randn(2, 5, 4)
    torch.testing.assert_close(run("norm", {}, (col(5, 4),), x), F.layer_norm(x, (4,)))
    x = torch.randn(2, 3, 4, 5)
    torch.testing.assert_close(run("norm", {}, (im(3, 4, 5),), x), F.batch_norm(x, None, None, training=True))


def test_activations_and_pos_enc() -> None:
    x = torch.randn(2, 5, 4)
    torch.testing.assert_close(run("softmax", {}, (col(5, 4),), x), x.softmax(-1))
    torch.testing.assert_close(run("leaky_relu", {}, (col(5, 4),), x), torch.where(x > 0, x, 0.01 * x))
    pos_enc = get_op("pos_enc").build((col(5, 4),), {})
    assert tuple(pos_enc.weight.shape) == (1, 5, 4)
    torch.testing.assert_close(pos_enc(x), x + pos_enc.weight)


# ---------------------------------------------------------------- infeasible cases

#: (op, args, input signal, fragment of the reason, whether the shape-free `abstract` also rejects it).
INFEASIBLE: list[tuple[str, dict[str, Any], Signal, str, bool]] = [
    ("group_dim", {"dim": 2, "b": 2}, (im(3, 7, 8),), "size 7, not divisible into 2", False),
    ("group_dim", {"dim": 3, "b": 2}, (col(6, 4),), "dim 3 does not exist", True),
    ("clone", {"b": 2}, (im(3, 4, 4),) * 2, "clone takes one branch, got 2", True),
    (
        "im2col",
        {"k": 16, "s": 16, "p": 0},
        (im(3, 8, 32),),
        "kernel 16 larger than the padded input 8x32",
        False,
    ),
    ("im2col", {"k": 3, "s": 1, "p": 1}, (col(6, 4),), "im2col needs im mode", True),
    ("col2im", {}, (col(16, 4),), "needs a pending fold", False),
    ("col2im", {}, (col(8, 4, folds=((4, 4),)),), "sequence length changed", False),
    ("col2im", {}, (im(3, 4, 4, folds=((4, 4),)),), "col2im needs col mode", True),
    ("add", {}, (im(3, 4, 4), im(3, 4, 5)), "im[3x4x4] and im[3x4x5]", False),
    ("add", {}, (im(3, 4, 4),), "at least 2 branches, got 1", True),
    ("add", {}, (im(3, 4, 4), col(4, 4)), "one mode and rank", False),
    ("concat", {"dim": 1, "b": 4}, (im(3, 4, 4),) * 2, "exactly 4 branches, got 2", True),
    ("concat", {"dim": 2, "b": 2}, (im(3, 4, 4), im(2, 4, 4)), "other axes equal", False),
    ("matmul", {"scaled": False}, (col(4, 4),) * 3, "exactly 2 branches, got 3", True),
    ("matmul", {"scaled": True}, (col(5, 4), col(5, 4)), "inner sizes that match (4 vs 5)", False),
    ("matmul", {"scaled": True}, (im(2, 5, 4), im(3, 4, 5)), "equal leading axes", False),
    ("permute", {"order": (2, 1)}, (im(3, 4, 5),), "has 2 axes but im[3x4x5] has 3", True),
    ("linear", {"d": 8}, (col(5, 4),) * 2, "linear takes one branch, got 2", True),
]


@pytest.mark.parametrize("case", INFEASIBLE, ids=lambda c: f"{c[0]}-{c[3]}")
def test_infeasible_reasons(case: tuple[str, dict[str, Any], Signal, str, bool]) -> None:
    name, args, signal, fragment, abstract_rejects = case
    op = get_op(name)
    for attempt in (op.infer, op.build):
        with pytest.raises(Infeasible) as error:
            attempt(signal, args)
        assert fragment in str(error.value)
    assert (op.abstract(signal[0].mode, len(signal), args) is None) == abstract_rejects


# ---------------------------------------------------------------- arguments and registry


@pytest.mark.parametrize(
    "name,args,fragment",
    [
        ("clone", {"b": 1}, "must be >= 2"),
        ("im2col", {"k": 0, "s": 1, "p": 0}, "must be >= 1"),
        ("im2col", {"k": 3, "s": 1, "p": -1}, "must be >= 0"),
        ("permute", {"order": (1, 1, 2)}, "permutation of 1..3"),
        ("matmul", {"scaled": 1}, "must be bool"),
        ("linear", {"width": 8}, "no argument 'width'"),
    ],
)
def test_bad_arguments(name: str, args: dict[str, Any], fragment: str) -> None:
    with pytest.raises(EinspaceError) as error:
        canonical_args(get_op(name), args)
    assert fragment in str(error.value)


def test_duplicate_registration_is_an_error() -> None:
    class Twice(Operation):
        name = "test_twice"
        group = Group.COMPUTATION

    register_op(Twice)
    try:
        with pytest.raises(EinspaceError, match="already registered"):
            register_op(Twice)
        with pytest.raises(EinspaceError, match="already registered"):
            register_op(type("Linear2", (Operation,), {"name": "linear", "group": Group.COMPUTATION}))
    finally:
        unregister_op("test_twice")


def test_unknown_op_suggests_close_match() -> None:
    with pytest.raises(UnknownOperationError, match="did you mean 'linear'"):
        get_op("linaer")

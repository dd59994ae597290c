"""Lowering never changes results: a lowered network has the literal one's parameters and
computes the same outputs and gradients, in train and eval mode, and the patterns do fire.

Networks run in float64, so that agreement is tight even through deep random trees.
"""

from __future__ import annotations

import copy
import random
import subprocess
import sys
from collections import Counter
from dataclasses import replace

import pytest
import torch
from torch import nn
from tree_samples import cheap, sampled_trees

from einspace import (
    Limits,
    Sampler,
    Variation,
    check_tree,
    compile_backbone,
    compile_network,
    load_grammar,
    parse_tree,
    to_text,
)
from einspace.checker import CheckedTree
from einspace.errors import VariationError
from einspace.grammar.model import OpItem
from einspace.network.lowering import Attention, Folded, Kernel, lowered_kernels
from einspace.ops import _modules
from einspace.seeds import architectures as arch
from einspace.seeds import list_seeds, load_seed
from einspace.state import input_state
from einspace.testing.op_trace import OpTrace, differences
from einspace.testing.reference_models import load_from, reference
from einspace.tree import Node

PAPER = load_grammar("einspace")


pytestmark = pytest.mark.usefixtures("one_thread")


# ----------------------------------------------------------------------------- tree text helpers
# Modules of grammars/einspace.pcfg as bracket text, so each case below reads like the network.


def comp(op: str) -> str:
    return f"(M (C {op}))"


def lin(d: int) -> str:
    return comp(f"linear(d={d})")


def seq(*modules: str) -> str:
    out = modules[-1]
    for module in reversed(modules[:-1]):
        out = f"(M {module} {out})"
    return out


def route(first: str, inner: str, last: str) -> str:
    return f"(M (R1 {first}) {inner} (R2 {last}))"


def branch(split: str, branches: list[str] | str, merge: str, times: int = 0) -> str:
    inner = f"{branches}*{times}" if isinstance(branches, str) else f"[{' '.join(branches)}]"
    return f"(M (B {split}) (Branches {inner}) (A {merge}))"


def net(module: str) -> str:
    return "(S" + module[2:]


def im2col(k: int, s: int, p: int) -> str:
    return f"im2col(k={k}, s={s}, p={p})"


def conv(d: int, k: int = 3, s: int = 1, p: int = 1) -> str:
    return route(im2col(k, s, p), lin(d), "col2im")


SWAP = "permute(order=(2, 1))"


def head(d: int, scaled: str = "true", outer: str = "false", q: str = "", k: str = "", v: str = "") -> str:
    """softmax(q kᵀ) v with linear projections to d, unless another branch is given."""
    keys = k or route("identity", lin(d), SWAP)
    scores = seq(branch("clone(b=2)", [q or lin(d), keys], f"matmul(scaled={scaled})"), comp("softmax"))
    return branch("clone(b=2)", [scores, v or lin(d)], f"matmul(scaled={outer})")


def im2col_grid() -> list[tuple[int, int, int]]:
    """Every (k, s, p) the paper grammar's im2col takes."""
    grid = set()
    for rule in PAPER.rules_for("R1"):
        for alternative in rule.alternatives:
            for item in alternative.items:
                if isinstance(item, OpItem) and item.name == "im2col":
                    grid |= {(a["k"], a["s"], a["p"]) for a in map(dict, item.choices)}
    return sorted(grid)


# ----------------------------------------------------------------------------- agreement


def _pair(checked: CheckedTree) -> tuple[nn.Module, nn.Module]:
    """(literal, lowered) with the same weights, after checking that their parameters match."""
    literal = compile_backbone(checked, lower=False)
    lowered = compile_backbone(checked)
    assert not lowered_kernels(literal)
    shapes = [(k, tuple(v.shape)) for k, v in literal.state_dict().items()]
    assert [(k, tuple(v.shape)) for k, v in lowered.state_dict().items()] == shapes
    assert [n for n, _ in literal.named_parameters()] == [n for n, _ in lowered.named_parameters()]
    lowered.load_state_dict(literal.state_dict())
    assert sum(p.numel() for p in lowered.parameters()) == checked.params
    return literal.double(), lowered.double()


def _close(actual: torch.Tensor, expected: torch.Tensor, name: str, scaled: bool) -> None:
    """torch's float64 tolerance, or with `scaled` a tolerance of 1e-4 of the tensor's largest
    entry: random trees can be ill-conditioned (a batch norm of a nearly constant channel, in
    a batch of 2, amplifies rounding by orders of magnitude), so summing in another order
    differs visibly in float64 too, while a wrong lowering is off by O(1)."""
    if scaled:
        atol = 1e-4 * float(expected.detach().abs().max()) + 1e-10
        torch.testing.assert_close(actual, expected, rtol=0, atol=atol, msg=lambda m: f"{name}: {m}")
    else:
        torch.testing.assert_close(actual, expected, msg=lambda m: f"{name}: {m}")


def assert_agree(checked: CheckedTree, batch: int = 3, seed: int = 0, scaled: bool = False) -> Counter[str]:
    """Outputs, input and parameter gradients and norm statistics agree, train and eval mode (in
    eval mode an image reaches the lowered network channels-last, as on a GPU); returns the
    kernels the lowered network runs."""
    literal, lowered = _pair(checked)
    generator = torch.Generator().manual_seed(seed)
    shape = checked.input[0].shape
    for train in (True, False):
        literal.train(train)
        lowered.train(train)
        x = torch.randn(batch, *shape, generator=generator, dtype=torch.float64)
        layout = torch.channels_last if x.dim() == 4 and not train else torch.contiguous_format
        xa, xb = x.clone().requires_grad_(), x.clone(memory_format=layout).requires_grad_()
        a, b = literal(xa), lowered(xb)
        _close(b, a, "output", scaled)
        cotangent = torch.randn(a.shape, generator=generator, dtype=torch.float64)
        literal.zero_grad(set_to_none=True)
        lowered.zero_grad(set_to_none=True)
        (a * cotangent).sum().backward()
        (b * cotangent).sum().backward()
        _close(xb.grad, xa.grad, "input gradient", scaled)
        for (name, p), (_, q) in zip(literal.named_parameters(), lowered.named_parameters(), strict=True):
            assert (p.grad is None) == (q.grad is None), name
            if p.grad is not None:
                _close(q.grad, p.grad, f"gradient of {name}", scaled)
        for (name, u), (_, v) in zip(literal.named_buffers(), lowered.named_buffers(), strict=True):
            _close(v, u, name, scaled)
    # Kernels refer to modules they adopted; a deep copy must refer to its own copies of them:
    # scaled alike, the copies of both networks still agree.
    duplicate, twin = copy.deepcopy(lowered), copy.deepcopy(literal)
    assert not {id(p) for p in duplicate.parameters()} & {id(p) for p in lowered.parameters()}
    with torch.no_grad():
        for p, q in zip(duplicate.parameters(), twin.parameters(), strict=True):
            p.mul_(1.5)
            q.mul_(1.5)
        _close(duplicate(x), twin(x), "output of a deep copy", scaled)
    return lowered_kernels(lowered)


def check(tree: str, shape: tuple[int, ...]) -> CheckedTree:
    return check_tree(parse_tree(tree), PAPER, input_state(shape))


# ----------------------------------------------------------------------------- hand-written patterns


@pytest.mark.parametrize("k,s,p", im2col_grid())
@pytest.mark.parametrize("fold", [True, False], ids=["image", "tokens"])
def test_every_im2col_lowers_to_a_convolution(k, s, p, fold):
    shape = (2, 18, 21) if k < 16 else (2, 33, 40)  # non-square; the last rows/columns may not fit
    tree = net(route(im2col(k, s, p), lin(16), "col2im" if fold else "identity"))
    assert assert_agree(check(tree, shape)) == Counter({"conv" if fold else "patch_embed": 1})


STRIDED_POINTWISE = """
import sys, torch, einspace as es
torch.manual_seed(0)
torch.set_num_threads(1)  # the single-threaded kernel is the faulty one
tree, channels_last = sys.argv[1], sys.argv[2] == "channels_last"
net = es.compile_backbone(es.parse_tree(tree), es.input_state((2, 8, 8)), es.load_grammar("einspace"))
for _ in range(30):
    x = torch.randn(128, 2, 8, 8)
    x = (x.contiguous(memory_format=torch.channels_last) if channels_last else x).requires_grad_()
    out = net(x)
    (out[0] if isinstance(out, tuple) else out).square().mean().backward()
print("ok")
"""


@pytest.mark.parametrize(
    ("tree", "layout"),
    [
        ("(S (R1 im2col(k=1, s=2, p=0)) (M (C linear(d=32))) (R2 col2im))", "channels_last"),
        # a patch embedding makes its input channels-last itself: a row-major image reaches the bug
        ("(S (R1 im2col(k=1, s=2, p=0)) (M (C linear(d=32))) (R2 identity))", "row_major"),
    ],
)
def test_strided_pointwise_convolution_survives_few_channels(tree, layout):
    """oneDNN's strided 1x1 convolution (torch 2.13, CPU) corrupts the heap in its backward pass
    on a channels-last input with few channels -- which a 1-channel image makes every later
    activation; it crashed training on the bundled digits, and (as a patch embedding of a
    row-major input) a sampled tree in a search. The lowered kernel avoids it. Run in a
    subprocess: heap corruption aborts the process."""
    code = [sys.executable, "-c", STRIDED_POINTWISE, tree, layout]
    done = subprocess.run(code, capture_output=True, text=True)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]


class _Operations(OpTrace):
    """An OpTrace that also keeps the weight and stride of every convolution."""

    def __init__(self):
        super().__init__()
        self.convolutions: list[tuple[torch.Tensor, list[int]]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten.convolution.default:
            self.convolutions.append((args[1], list(args[3])))
        return super().__torch_dispatch__(func, types, args, kwargs)


@pytest.mark.parametrize("k, s, channels", [(3, 1, 16), (3, 2, 4), (1, 2, 16), (1, 2, 3)])
def test_channels_last_convolutions_get_channels_last_weights(k, s, channels):
    """On a channels-last input the lowered convolution's weight is channels-last and in autocast's
    dtype (one copy, as a hand-written channels-last network's cast), not row-major (which the
    convolution copies in its forward and again in its backward), and its gradient comes back to
    the linear's [d, C·k·k] weight in one copy too (no clone); a strided 1x1 kernel is a plain
    strided convolution except where oneDNN's bug lies (CPU, channels-last, < 16 channels).
    The numbers and gradients are the literal network's."""
    checked = check(net(route(im2col(k, s, k // 2), lin(16), "col2im")), (channels, 8, 8))
    literal, lowered = compile_network(checked, classes=3, lower=False), compile_network(checked, classes=3)
    lowered.load_state_dict(literal.state_dict())
    x = torch.randn(2, channels, 8, 8).contiguous(memory_format=torch.channels_last)
    for network in (literal, lowered):
        network(x).square().sum().backward()
    for (name, a), b in zip(lowered.named_parameters(), literal.parameters(), strict=True):
        torch.testing.assert_close(a.grad, b.grad, msg=name)
        assert a.grad.is_contiguous(), name
    with _Operations() as ran, torch.autocast("cpu", dtype=torch.bfloat16):
        lowered(x).sum().backward()
    ((weight, stride),) = ran.convolutions
    assert weight.dtype == torch.bfloat16 and weight.is_contiguous(memory_format=torch.channels_last)
    assert stride == [1, 1] if k == 1 and channels < 16 else stride == [s, s]
    assert "clone" not in ran.names, ran.names


CASES = {
    # convolutions in context: after norm, nested in other nestings, on permuted images
    "conv_norm_act": (
        net(seq(conv(16), comp("norm"), comp("leaky_relu"), conv(32, 3, 2, 1))),
        (3, 12, 10),
        {"conv": 2},
    ),
    "conv_split_differently": (
        net(seq(route(im2col(3, 1, 1), seq(lin(16), comp("identity")), "col2im"), comp("norm"))),
        (3, 9, 11),
        {"conv": 1},
    ),
    "conv_of_permuted_image": (
        net(route("permute(order=(2, 1, 3))", conv(16), "permute(order=(2, 1, 3))")),
        (4, 6, 10),
        {"conv": 1},
    ),
    "linear_then_act_stays_tokens": (
        net(route(im2col(3, 1, 1), seq(lin(16), comp("leaky_relu")), "col2im")),
        (3, 7, 9),
        {"patch_embed": 1},
    ),
    "residual_conv_block": (
        net(
            seq(
                branch("clone(b=2)", [seq(conv(16), comp("norm")), conv(16, 1, 1, 0)], "add"),
                comp("leaky_relu"),
            )
        ),
        (3, 10, 8),
        {"conv": 2},
    ),
    # attention on tokens (L = 12, D = 32)
    "attention": (net(head(16)), (12, 32), {"attention": 1}),
    "attention_unscaled": (net(head(16, scaled="false")), (12, 32), {"attention": 1}),
    "attention_outer_scaled": (net(head(16, outer="true")), (12, 32), {"attention": 1}),
    "attention_key_split": (
        net(head(16, k=seq(lin(16), route("identity", comp("identity"), SWAP)))),
        (12, 32),
        {"attention": 1},
    ),
    "attention_key_permute_first_nest": (
        net(head(16, k=seq(lin(16), route(SWAP, comp("identity"), "identity")))),
        (12, 32),
        {"attention": 1},
    ),
    "attention_query_with_act": (
        net(head(16, q=seq(lin(16), comp("leaky_relu")))),
        (12, 32),
        {"attention": 1},
    ),
    "attention_identity_value": (net(head(16, v=comp("identity"))), (12, 32), {"attention": 1}),
    "attention_no_projections": (
        net(head(16, q=comp("identity"), k=route("identity", comp("identity"), SWAP), v=comp("identity"))),
        (12, 32),
        {"attention": 1},
    ),
    "attention_normed_scores": (
        net(
            branch(
                "clone(b=2)",
                [
                    seq(
                        comp("norm"),
                        branch(
                            "clone(b=2)", [lin(16), route("identity", lin(16), SWAP)], "matmul(scaled=true)"
                        ),
                        comp("softmax"),
                    ),
                    lin(32),
                ],
                "matmul(scaled=false)",
            )
        ),
        (12, 32),
        {"attention": 1},
    ),
    "attention_over_image_rows": (
        net(
            head(
                16,
                k=route("identity", lin(16), "permute(order=(1, 3, 2))"),
            )
        ),
        (3, 8, 6),
        {"attention": 1},
    ),
    "attention_residual_norm": (
        net(seq(branch("clone(b=2)", [head(32), comp("identity")], "add"), comp("norm"))),
        (12, 32),
        {"attention": 1},
    ),
    # multi-head attention
    "heads_4_concat_features": (
        net(seq(branch("clone(b=4)", head(16), "concat(dim=2, b=4)", 4), lin(32))),
        (12, 32),
        {"multi_head_attention": 1},
    ),
    "heads_8_concat_features": (
        net(branch("clone(b=8)", head(16, scaled="false"), "concat(dim=2, b=8)", 8)),
        (10, 16),
        {"multi_head_attention": 1},
    ),
    "heads_concat_sequence": (
        net(branch("clone(b=4)", head(16, outer="true"), "concat(dim=1, b=4)", 4)),
        (12, 32),
        {"multi_head_attention": 1},
    ),
    "heads_add": (net(branch("clone(b=4)", head(16), "add", 4)), (12, 32), {"multi_head_attention": 1}),
    "heads_2_parallel": (
        net(branch("clone(b=2)", [head(16), head(16)], "concat(dim=2, b=2)")),
        (12, 32),
        {"multi_head_attention": 1},
    ),
    "heads_2_of_two_widths": (
        net(branch("clone(b=2)", [head(16), head(32)], "concat(dim=2, b=2)")),
        (12, 32),
        {"attention": 2},
    ),
    "heads_without_plain_projections": (
        net(branch("clone(b=4)", head(16, v=comp("identity")), "concat(dim=2, b=4)", 4)),
        (12, 32),
        {"attention": 4},
    ),
    # repeated linear branches
    "linears_concat_features": (
        net(branch("clone(b=4)", lin(16), "concat(dim=2, b=4)", 4)),
        (12, 32),
        {"branch_linear": 1},
    ),
    "linears_concat_sequence": (
        net(branch("clone(b=8)", lin(16), "concat(dim=1, b=8)", 8)),
        (6, 32),
        {"branch_linear": 1},
    ),
    "linears_add": (net(branch("clone(b=4)", lin(64), "add", 4)), (12, 32), {"branch_linear": 1}),
    "linears_two_widths": (
        net(branch("clone(b=2)", [lin(16), lin(32)], "concat(dim=2, b=2)")),
        (12, 32),
        {"branch_linear": 1},
    ),
    "channel_linears_concat": (
        net(branch("clone(b=4)", lin(16), "concat(dim=1, b=4)", 4)),
        (3, 7, 5),
        {"branch_linear": 1},
    ),
    "channel_linears_add": (net(branch("clone(b=8)", lin(16), "add", 8)), (3, 7, 5), {"branch_linear": 1}),
    "linears_inside_im2col": (
        net(route(im2col(3, 1, 1), branch("clone(b=4)", lin(16), "add", 4), "col2im")),
        (3, 6, 7),
        {"branch_linear": 1},
    ),
    # what is not recognised runs literally
    "attention_without_softmax": (
        net(
            branch(
                "clone(b=2)",
                [
                    branch("clone(b=2)", [lin(16), route("identity", lin(16), SWAP)], "matmul(scaled=true)"),
                    lin(16),
                ],
                "matmul(scaled=false)",
            )
        ),
        (12, 32),
        {},
    ),
    "channel_linears_concat_height": (
        net(branch("clone(b=4)", lin(16), "concat(dim=2, b=4)", 4)),
        (3, 7, 5),
        {},
    ),
    "matmul_of_linears": (
        net(branch("clone(b=2)", [lin(16), route("identity", lin(16), SWAP)], "matmul(scaled=true)")),
        (12, 32),
        {},
    ),
}


@pytest.mark.parametrize("name", list(CASES))
def test_pattern_agrees_and_fires(name):
    tree, shape, kernels = CASES[name]
    assert assert_agree(check(tree, shape)) == Counter(kernels)


@pytest.mark.parametrize(
    "name", ["conv_norm_act", "conv_of_permuted_image", "attention", "attention_key_split", "heads_add"]
)
def test_fusion_does_not_depend_on_how_a_pattern_is_written(renamed_pattern_axes, name):
    """With the axes of every einops pattern renamed, the same kernels fire and attention keeps its
    one projection: lowering knows col2im and the key's transpose by their modules' types and
    data (the fold, the order), not by comparing pattern strings."""
    tree, shape, kernels = CASES[name]
    lowered = compile_backbone(check(tree, shape))
    assert lowered_kernels(lowered) == Counter(kernels)
    attention = [m for m in lowered.modules() if isinstance(m, Attention)]
    assert all(head.linears is not None for m in attention for head in m.heads)
    assert not [m for m in lowered.modules() if type(m).__module__.startswith("einops")]


def test_lowered_network_reads_like_the_literal_one():
    """The tree, its checked facts and the network's head do not depend on lowering; the
    kernels' slots hold markers without parameters; copies and the state dict work both ways."""
    checked = check(net(seq(conv(16), comp("norm"), comp("leaky_relu"))), (3, 8, 8))
    text, stats = to_text(checked.tree), checked.stats
    literal = compile_network(checked, classes=5, lower=False)
    lowered = compile_network(checked, classes=5)
    assert to_text(checked.tree) == text and replace(checked).stats == stats  # recounted from the facts
    assert sum(p.numel() for p in lowered.backbone.parameters()) == checked.params
    literal.load_state_dict(lowered.state_dict())
    lowered.load_state_dict(literal.state_dict())
    assert lowered_kernels(lowered) == Counter({"conv": 1})
    folded = [m for m in lowered.modules() if isinstance(m, Folded)]
    assert len(folded) == 2 and all(not list(m.parameters()) for m in folded)
    duplicate = copy.deepcopy(lowered)
    x = torch.randn(2, 3, 8, 8)
    lowered.eval()
    duplicate.eval()
    torch.testing.assert_close(duplicate(x), lowered(x))
    kernel = next(m for m in duplicate.modules() if isinstance(m, Kernel))
    assert kernel.weight is not next(m for m in lowered.modules() if isinstance(m, Kernel)).weight


def test_meta_device_build_and_forward():
    """Lowered networks build and run on `meta` (shapes only), as the property tests do."""
    checked = check(net(seq(branch("clone(b=4)", head(16), "concat(dim=2, b=4)", 4), lin(32))), (12, 32))
    with torch.device("meta"):
        backbone = compile_backbone(checked)
        out = backbone(torch.empty(2, 12, 32))
    assert out.shape == (2, 12, 32) and lowered_kernels(backbone)["multi_head_attention"] == 1


# ----------------------------------------------------------------------------- seeds

#: What must fire in each bundled seed (a silent fallback to literal execution fails here).
SEED_KERNELS = {
    "resnet18": {"conv": 21},
    "resnet_small": {"conv": 6},  # stem, 2 in the first block, 2 and a 1x1 shortcut in the second
    "wide_resnet16_4": {"conv": 16},
    "vit": {"multi_head_attention": 4, "patch_embed": 1},
    "mlp_mixer": {"patch_embed": 1},
    "densenet": {"conv": 39},
}


@pytest.mark.parametrize("name", list_seeds())
def test_seed_lowers_and_agrees(name):
    checked = check_tree(load_seed(name, PAPER, input_state((3, 64, 64))), PAPER, input_state((3, 64, 64)))
    assert assert_agree(checked, batch=2) == Counter(SEED_KERNELS[name])


def test_every_seed_has_its_expected_kernels():
    assert set(SEED_KERNELS) == set(list_seeds())


@pytest.mark.parametrize("name", ["resnet_small", "densenet"])
def test_lowered_convolution_seeds_run_the_hand_written_operations(name):
    """With the GPU's settings (channels-last, bfloat16 autocast) a lowered convolutional seed runs
    the hand-written model's operations one for one -- no copy that model does not make (a
    transposed operand, a row-major weight, a strided 1x1 workaround); only each weight's cast
    also changes its layout (the linear's [d, C·k·k] row-major weight to the convolution's)."""
    shape = (3, 16, 16)
    x = input_state(shape)
    lowered = compile_network(load_seed(name, PAPER, x), x, 10)
    hand = reference(name, shape)
    load_from(hand, lowered)
    images = torch.randn(2, *shape).contiguous(memory_format=torch.channels_last)
    labels = torch.tensor([1, 2])
    traces = []
    for model in (hand, lowered):
        model.to(memory_format=torch.channels_last)
        with OpTrace() as trace, torch.autocast("cpu", dtype=torch.bfloat16):
            nn.functional.cross_entropy(model(images), labels).backward()
        traces.append(trace)
    assert traces[1].names == traces[0].names, "\n".join(differences(traces[0].lines, traces[1].lines))


def test_mixer_activations_stay_dense():
    """The token MLP ends in a transposed view; its residual sum must still come out dense, or
    every later layer norm reads (and its backward writes) a transposed tensor, as the hand-written
    Mixer's never does; and the head's average hands the last layer norm a dense gradient. The
    sum is the same floats either way."""
    torch.manual_seed(0)
    x = input_state((3, 32, 32))
    network = compile_network(check_tree(arch.mlp_mixer(layers=2, width=32, tokens=64), PAPER, x), classes=3)
    sums, norms, gradients = [], [], []
    for module in network.modules():
        if isinstance(module, _modules.Add):
            module.register_forward_hook(lambda m, xs, out: sums.append((xs[0], out)))
        if isinstance(module, nn.LayerNorm):
            module.register_forward_pre_hook(lambda m, xs: norms.append(xs[0]))
            module.register_full_backward_hook(lambda m, grad_in, grad_out: gradients.append(grad_out[0]))
    network(torch.randn(2, 3, 32, 32)).sum().backward()
    assert len(sums) == 4 and len(norms) >= 4 and len(gradients) == len(norms)
    assert all(out.is_contiguous() for _, out in sums) and all(n.is_contiguous() for n in norms)
    assert gradients[0].is_contiguous()  # the last norm's (backward runs last to first), from the head
    branches, out = sums[0]
    assert not branches[0].is_contiguous()  # the case this guards: a transposed first branch
    assert torch.equal(out, branches[0] + branches[1])


# ----------------------------------------------------------------------------- random trees

RANDOM_INPUTS = [(3, 16, 16), (2, 12, 20), (16, 32), (3, 9, 14)]
RANDOM_LIMITS = Limits(max_depth=14, max_nodes=90, max_params=300_000)
MUTATION_LIMITS = Limits(max_depth=30, max_nodes=600, max_params=300_000)
KINDS = ("conv", "patch_embed", "attention", "multi_head_attention", "branch_linear")


def _small(checked: CheckedTree) -> bool:
    """Cheap to run literally in float64."""
    return cheap(checked, max_flops=2e7, max_instances=500)


def _random_trees(count: int) -> list[CheckedTree]:
    """`count` small sampled trees (deterministic)."""
    return sampled_trees(PAPER, RANDOM_INPUTS, RANDOM_LIMITS, count, max_flops=2e7, max_instances=500)


def test_random_trees_agree():
    """~100 sampled trees: lowering never changes outputs or gradients. The paper's grammar
    rarely derives a whole pattern by chance (a few trees in a hundred lower anything, hardly
    ever attention): these are the near misses; the pattern trees below exercise each kernel."""
    fired: Counter[str] = Counter()
    for checked in _random_trees(100):
        fired += assert_agree(checked, batch=2, scaled=True)
    assert sum(fired.values()) >= 5, fired


IMAGE, TOKENS = (3, 16, 16), (16, 32)


def _pattern_donors() -> dict[str, tuple[tuple[int, ...], Node]]:
    """Small trees holding every lowered pattern, on images and on tokens: the seeds'
    architectures at a size that runs literally in milliseconds, repeated linear branches,
    one attention head."""
    linears = seq(branch("clone(b=4)", lin(16), "concat(dim=1, b=4)", 4), comp("norm"))
    two_widths = branch("clone(b=2)", [lin(16), lin(32)], "concat(dim=1, b=2)")
    one_head = arch.residual(arch.seq(arch.attention_head(32), arch.linear(32)))
    return {
        "resnet": (IMAGE, arch.resnet((1, 1), (16, 32))),
        "vit": (IMAGE, arch.vit(layers=1, width=32, heads=4, head_dim=16, hidden=32, patch=4)),
        "mixer": (IMAGE, arch.mlp_mixer(layers=1, width=32, patch=4, tokens=16)),
        "channel_linears": (IMAGE, parse_tree(net(seq(linears, two_widths)))),
        "transformer": (TOKENS, arch.network(arch.transformer_layer(32, 4, 16, 32))),
        "attention": (TOKENS, arch.network(arch.seq(one_head, arch.norm()))),
        "token_linears": (TOKENS, parse_tree(net(branch("clone(b=4)", lin(16), "add", 4)))),
    }


def _pattern_trees(per_donor: int) -> list[tuple[str, CheckedTree]]:
    """(origin, tree) for trees that contain the patterns, partly rewritten, broken or kept:
    per donor, `per_donor` mutants ("mutant") and `per_donor` crossovers with fresh random
    trees, alternately a random tree with a subtree of the donor grafted in and the donor with
    a subtree of the random tree ("graft"; pairs that share no exchangeable subtree are
    skipped). Only trees cheap enough to run literally are kept; the donors themselves not."""
    trees = []
    for name, (shape, donor) in _pattern_donors().items():
        x = input_state(shape)
        rng = random.Random(name)
        variation = Variation(PAPER, x, MUTATION_LIMITS, rng=rng)
        sampler = Sampler(PAPER, x, RANDOM_LIMITS, rng=rng)
        children = [("mutant", variation.mutate(donor)) for _ in range(per_donor)]
        for i in range(per_donor):
            pair = (sampler.sample(), donor)
            try:
                children.append(("graft", variation.crossover(*(pair if i % 2 == 0 else pair[::-1]))))
            except VariationError:
                continue
        checked = [(origin, check_tree(child, PAPER, x)) for origin, child in children]
        trees += [(origin, c) for origin, c in checked if _small(c)]
    return trees


def test_pattern_trees_agree():
    """Mutants of the pattern donors and random trees crossed with them: every tree agrees, and
    every kind of kernel fires in several of them (counted per tree, so one tree with many
    convolutions counts once)."""
    trees_with: Counter[str] = Counter()
    grafts_lowering = 0
    for origin, checked in _pattern_trees(10):
        kinds = set(assert_agree(checked, batch=2, scaled=True))
        trees_with.update(kinds)
        grafts_lowering += origin == "graft" and bool(kinds)
    for kind in KINDS:
        assert trees_with[kind] >= 8, trees_with
    assert grafts_lowering >= 10

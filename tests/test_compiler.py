"""The compiler: a compiled tree computes what its operations say, with separate weights per repeat."""

from __future__ import annotations

import re

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from einspace import check_tree, compile_backbone, compile_network, load_grammar, parse_tree
from einspace.errors import BuildError, EinspaceError, TreeError
from einspace.ops import Group, Operation, register_op, unregister_op
from einspace.state import input_state

FIGURE_3 = (
    "(S (B clone(b=2)) (Branches [(M (M (R1 im2col(k=3, s=1, p=1)) (M (C linear(d=16))) (R2 col2im))"
    " (M (M (C norm)) (M (C leaky_relu)))) (M (C linear(d=16)))]) (A add))"
)


@pytest.fixture(scope="module")
def paper():
    return load_grammar("grammars/einspace.pcfg")


@pytest.mark.parametrize("lower", [False, True], ids=["literal", "lowered"])
def test_figure_3_block_equals_hand_written_torch(paper, lower):
    """conv3x3 - batch norm - leaky ReLU, plus a 1x1 projection on the skip, then add."""
    x = input_state((3, 12, 10))
    backbone = compile_backbone(parse_tree(FIGURE_3), x, paper, lower=lower)
    conv, norm, skip = nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.Conv2d(3, 16, 1)
    # The two linears' (weight, bias), in tree order (lowering keeps the parameters as they are).
    params = list(backbone.parameters())
    linears = [(w, params[i + 1]) for i, w in enumerate(params) if w.dim() == 2]
    (bn,) = [m for m in backbone.modules() if isinstance(m, nn.BatchNorm2d)]
    with torch.no_grad():
        conv.weight.copy_(linears[0][0].reshape(16, 3, 3, 3))
        conv.bias.copy_(linears[0][1])
        skip.weight.copy_(linears[1][0][:, :, None, None])
        skip.bias.copy_(linears[1][1])
        norm.load_state_dict(bn.state_dict())
    inputs = torch.randn(4, 3, 12, 10)
    for train in (True, False):
        backbone.train(train)
        norm.train(train)
        expected = F.leaky_relu(norm(conv(inputs)), 0.01) + skip(inputs)
        torch.testing.assert_close(backbone(inputs), expected)


def test_repeat_builds_separate_weights(paper):
    tree = parse_tree("(S (B clone(b=4)) (Branches (M (C linear(d=16)))*4) (A add))")
    x = input_state((16, 5))
    checked = check_tree(tree, paper, x)
    backbone = compile_backbone(checked)
    linears = [m for m in backbone.modules() if isinstance(m, nn.Linear)]
    assert len(linears) == 4
    assert len({id(m.weight) for m in linears}) == 4
    assert not torch.equal(linears[0].weight, linears[1].weight)
    assert checked.params == sum(p.numel() for p in backbone.parameters()) == 4 * (5 * 16 + 16)
    inputs = torch.randn(2, 16, 5)
    expected = sum(m(inputs) for m in linears)
    torch.testing.assert_close(backbone(inputs), expected)


@pytest.mark.parametrize(
    "tree,shape,classes",
    [
        (FIGURE_3, (3, 12, 10), 10),
        ("(S (R1 im2col(k=4, s=4, p=0)) (M (C linear(d=32))) (R2 identity))", (3, 16, 16), 7),
        ("(S (M (C pos_enc)) (M (C softmax)))", (20, 6), 3),
    ],
)
def test_network_head_maps_to_classes(paper, tree, shape, classes):
    net = compile_network(parse_tree(tree), input_state(shape), classes, paper)
    out = net(torch.randn(2, *shape))
    assert out.shape == (2, classes)
    assert torch.isfinite(out).all()


def test_col_head_pools_tokens(paper):
    net = compile_network(parse_tree("(S (M (C identity)) (M (C identity)))"), input_state((5, 6)), 2, paper)
    x = torch.randn(3, 5, 6)
    torch.testing.assert_close(net(x), net.head.linear(x.mean(dim=1)))


def test_compile_reports_the_node_that_does_not_fit(paper):
    tree = parse_tree("(S (M (C identity)) (M (R1 identity) (M (C identity)) (R2 col2im)))")
    with pytest.raises(TreeError, match="S > M#1 > R2#2: R2 cannot derive these children"):
        compile_backbone(tree, input_state((3, 8, 8)), paper)
    with pytest.raises(TreeError, match="R2#2 > col2im#0: col2im cannot apply to im"):
        compile_backbone(tree, input_state((3, 8, 8)))  # without a grammar: shapes only
    with pytest.raises(EinspaceError, match="input"):
        compile_backbone(tree)


class _BrokenBuild(Operation):
    """A plugin whose shape rule holds but whose `build` fails with `error`."""

    name, group = "test_broken_build", Group.COMPUTATION
    error: Exception = ValueError("no module today")

    def infer(self, signal, args):
        return signal

    def build(self, signal, args):
        raise type(self).error


@pytest.fixture
def broken_build():
    register_op(_BrokenBuild)
    yield _BrokenBuild
    unregister_op(_BrokenBuild.name)


BROKEN_TREE = "(S (M (C identity)) (M (R1 identity) (M (C test_broken_build)) (R2 identity)))"
BROKEN_NODE = "at node S > M#1 > M#1 > C#0 > test_broken_build#0: "


@pytest.mark.parametrize(
    "error, message",
    [
        (
            ValueError("no module today"),
            r"operation 'test_broken_build' \(defined at .*test_compiler.py:\d+\) "
            r"failed in build: ValueError: no module today \(.*test_compiler.py:\d+\)",
        ),
        (
            EinspaceError("weights too large"),
            "operation 'test_broken_build' failed in build: weights too large",
        ),
    ],
    ids=["bug", "refusal"],
)
def test_a_failing_build_names_the_node_and_the_operation(broken_build, monkeypatch, error, message):
    monkeypatch.setattr(broken_build, "error", error)
    with pytest.raises(BuildError) as caught:
        compile_backbone(parse_tree(BROKEN_TREE), input_state((3, 8, 8)))
    assert str(caught.value).startswith(BROKEN_NODE), str(caught.value)
    assert re.search(message, str(caught.value)), str(caught.value)
    assert caught.value.path == BROKEN_NODE[len("at node ") : -2]


def test_an_allocation_failure_in_build_keeps_its_type_and_names_the_node(broken_build, monkeypatch):
    """Evaluators report running out of memory apart from other failures: it passes unchanged,
    with a note naming where it happened."""
    failure = RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")
    monkeypatch.setattr(broken_build, "error", failure)
    with pytest.raises(RuntimeError, match="CUDA out of memory") as caught:
        compile_backbone(parse_tree(BROKEN_TREE), input_state((3, 8, 8)))
    assert not isinstance(caught.value, EinspaceError)
    assert caught.value.__notes__ == [
        "while building operation 'test_broken_build' at node S > M#1 > M#1 > C#0 > test_broken_build#0"
    ]

"""Export, module by module, fast enough to run once per mutant: a small network for every module
type and every branching the writer knows, each exported, executed (in this process: its file
imports only torch) with the exported state_dict, and compared with the compiled network in
float64, eval and train, with every parameter and running statistic random; the class names and
docstrings of the branching classes; and the writer's refusals. test_export.py runs the same
comparison on hundreds of sampled trees in a fresh process without einspace."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from torch import nn

from einspace import check_tree, compile_network
from einspace.errors import EinspaceError
from einspace.network.compiler import Branches
from einspace.network.export import export_networks
from einspace.network.export.parts import Instance
from einspace.network.export.writer import Writer
from einspace.ops import _modules
from einspace.seeds import architectures as arch
from einspace.state import input_state

pytestmark = pytest.mark.usefixtures("one_thread")

op, seq, branching = arch.op, arch.seq, arch.branching
clone2 = op("clone", b=2)


def _c(name: str, **args) -> arch.Module:
    return arch.computation(name, **args)


def _attention(
    d: int, query: arch.Module | None = None, outer: bool = False, scaled: bool = True
) -> arch.Module:
    """One attention head (arch.attention_head), optionally with a query that is not a plain
    linear (written out branch by branch), unscaled scores and scaled values."""
    keys_t = arch.routing("identity", arch.linear(d), op("permute", order=(2, 1)))
    scores = seq(
        branching(clone2, [query or arch.linear(d), keys_t], op("matmul", scaled=scaled)), arch.softmax()
    )
    return branching(clone2, [scores, arch.linear(d)], op("matmul", scaled=outer))


#: name -> (backbone, input shape, lines the export must contain).
CASES: dict[str, tuple[arch.Module, tuple[int, ...], tuple[str, ...]]] = {
    "conv": (
        seq(arch.conv(8, 3, 2), arch.norm(), arch.act(), arch.softmax()),
        (4, 8, 8),
        ("nn.Conv2d(4, 8, 3, 2, 1)", "nn.BatchNorm2d(8)", "F.leaky_relu(x, 0.01)", "x.softmax(dim=-1)"),
    ),
    "residual": (
        arch.residual(seq(arch.conv(4), arch.norm())),
        (4, 6, 6),
        ('"""Two branches of x, one of them x itself, added."""', "return x + x1"),
    ),
    "sum of four": (
        seq(branching(op("clone", b=4), arch.conv(4), op("add")), arch.identity()),
        (3, 5, 5),
        ('"""Four branches of x, added."""', "return x1 + x2 + x3 + x4", "class Sum("),
    ),
    "sum of three": (
        seq(branching(op("clone", b=3), arch.norm(), op("add")), arch.identity()),
        (3, 5, 5),
        ('"""3 branches of x, added."""',),
    ),
    "dense": (
        seq(branching(clone2, [arch.identity(), arch.conv(4)], op("concat", dim=1, b=2)), arch.norm()),
        (3, 6, 6),
        ('"""Two branches of x, one of them x itself, concatenated along dim 1."""', "class Dense("),
    ),
    "concat width": (
        seq(branching(op("clone", b=8), arch.norm(), op("concat", dim=3, b=8)), arch.identity()),
        (2, 3, 2),
        ('"""Eight branches of x, concatenated along dim 3."""', "class Concat("),
    ),
    "grouped": (
        seq(
            branching(op("group_dim", dim=1, b=2), [arch.conv(3), arch.conv(5, 1)], op("concat", dim=1, b=2)),
            branching(op("group_dim", dim=3, b=2), [arch.norm(), arch.act()], op("add")),
        ),
        (4, 6, 6),
        (
            "x1, x2 = x.chunk(2, dim=1)",
            '"""x split into 2 parts along dim 1, a branch each, concatenated along dim 1."""',
            '"""x split into 2 parts along dim 3, a branch each, added."""',
            "class GroupedConcat(",
            "class GroupedResidual(",
        ),
    ),
    "product": (
        seq(
            branching(clone2, [arch.conv(3, 1), arch.identity()], op("matmul", scaled=False)),
            branching(clone2, [arch.norm(), arch.identity()], op("matmul", scaled=True)),
        ),
        (3, 5, 5),
        (
            '"""Two branches of x, one of them x itself, multiplied as matrices."""',
            "return x1 @ x",
            "class Product(",
        ),
    ),
    "routing": (
        seq(
            arch.routing(op("permute", order=(2, 3, 1)), arch.norm(), op("permute", order=(3, 1, 2))),
            arch.routing(op("permute", order=(1, 3, 2)), arch.act(), "identity"),
            arch.routing(op("im2col", k=3, s=1, p=1), arch.norm(), op("col2im")),
        ),
        (3, 6, 8),
        (".permute(0, 2, 3, 1)", ".transpose(2, 3)", "F.unfold(x, 3, padding=1, stride=1).transpose(1, 2)"),
    ),
    "unfold strided": (
        arch.routing(op("im2col", k=3, s=2, p=0), arch.norm(), "identity"),
        (2, 7, 7),
        ("F.unfold(x, 3, padding=0, stride=2).transpose(1, 2)",),
    ),
    "channel linears": (
        seq(
            branching(clone2, [arch.linear(4), arch.linear(6)], op("concat", dim=1, b=2)),
            branching(clone2, [arch.linear(5), arch.linear(5)], op("add")),
            arch.linear(7),
        ),
        (3, 4, 4),
        (
            "x = torch.cat([self.conv1(x), self.conv2(x)], dim=1)",
            "x = torch.stack([layer(x) for layer in self.convs1]).sum(0)",
            "nn.Conv2d(5, 7, 1, 1, 0)",
        ),
    ),
    "token linears": (
        seq(
            branching(clone2, [arch.linear(4), arch.linear(6)], op("concat", dim=2, b=2)),
            branching(op("clone", b=4), arch.linear(5), op("add")),
            branching(clone2, [arch.linear(3), arch.linear(3)], op("concat", dim=1, b=2)),
        ),
        (6, 8),
        (
            "x = torch.cat([self.linear1(x), self.linear2(x)], dim=2)",
            "nn.ModuleList(nn.Linear(10, 5) for _ in range(4))",
            "x = torch.stack([layer(x) for layer in self.linears1]).sum(0)",
            "torch.cat([layer(x) for layer in self.linears2], dim=1)",
        ),
    ),
    "tokens": (
        seq(arch.pos_enc(), arch.linear(16), arch.norm(), arch.act(), arch.softmax()),
        (6, 8),
        ("nn.Parameter(torch.randn(1, 6, 8) * 0.02)", "nn.LayerNorm(16)", "x = x + self.position1"),
    ),
    "image position": (seq(arch.pos_enc(), arch.identity()), (2, 3, 4), ("torch.randn(1, 2, 3, 4) * 0.02",)),
    "patches": (
        seq(arch.patch_embed(8, 4), arch.norm()),
        (3, 8, 8),
        ("nn.Conv2d(3, 8, 4, 4, 0)", "x = self.conv1(x).flatten(2).transpose(1, 2)", "self.head(x.mean(1))"),
    ),
    "attention": (
        seq(_attention(8), arch.identity()),
        (5, 8),
        (
            "x = F.scaled_dot_product_attention(q, k, v)",
            "q, k, v = self.qkv(x).split([8, 8, 8], dim=-1)",
            '"""Self-attention, 1 head of 8: one qkv projection."""',
        ),
    ),
    "scaled attention": (
        seq(_attention(8, outer=True), arch.identity()),
        (5, 8),
        ("x = x * 0.4472135954999579",),
    ),
    "attention written out": (
        seq(_attention(8, seq(arch.linear(8), arch.act())), arch.identity()),
        (5, 8),
        (
            "x = F.scaled_dot_product_attention(q, k.transpose(-2, -1), v, scale=0.35355339059327373)",
            '"""Self-attention softmax(q k^T * scale) v, with q, k, v computed by the branches below."""',
        ),
    ),
    "heads concatenated": (
        arch.multi_head_attention(2, 4, 8),
        (5, 8),
        (
            "q, k, v = self.qkv(x).split([8, 8, 8], dim=-1)",
            "q, k, v = (t.unflatten(-1, (2, -1)).transpose(1, 2) for t in (q, k, v))",
            "return x.transpose(1, 2).flatten(2)",
            '"""Self-attention, 2 heads of 4, concatenated: one qkv projection."""',
        ),
    ),
    "heads added": (
        seq(branching(op("clone", b=4), _attention(4), op("add")), arch.identity()),
        (5, 8),
        ("return x.sum(1)", '"""Self-attention, 4 heads of 4, added: one qkv projection."""'),
    ),
    "heads joined": (
        seq(branching(clone2, [_attention(4), _attention(4)], op("concat", dim=1, b=2)), arch.identity()),
        (5, 8),
        (
            "return x.flatten(1, 2)",
            '"""Self-attention, 2 heads of 4, joined along the tokens: one qkv projection."""',
        ),
    ),
    "heads scaled": (
        seq(branching(op("clone", b=4), _attention(4, outer=True), op("add")), arch.identity()),
        (3, 8),
        ("x = x * 0.5773502691896258",),
    ),
    "unscaled scores": (
        seq(_attention(8, scaled=False), arch.identity()),
        (5, 8),
        ("x = F.scaled_dot_product_attention(q, k, v, scale=1.0)",),
    ),
    "written out, scaled": (
        seq(_attention(8, seq(arch.linear(8), arch.act()), outer=True), arch.identity()),
        (5, 8),
        ("return x * 0.4472135954999579",),
    ),
}

#: The einspace_plus and einspace_zoo operations.
CASES.update(
    {
        "calibrations": (
            seq(arch.conv(16), _c("channel_attention"), _c("spatial_attention"), _c("dynamic_conv", k=3)),
            (3, 6, 6),
            ("class ChannelAttention", "class SpatialAttention", "class DynamicKernel", "depthwise(x, "),
        ),
        "calibrated pairs": (
            seq(
                arch.conv(16),
                branching(clone2, [arch.conv(16), arch.conv(16, 1)], op("channel_calibrate")),
                branching(clone2, [arch.norm(), arch.act()], op("spatial_calibrate")),
                branching(clone2, [arch.identity(), arch.conv(16)], op("dynamic_calibrate", k=5)),
            ),
            (3, 6, 6),
            ('"""Two branches of x, the first calibrated by the second."""', "class Calibrated("),
        ),
        "xd image": (seq(_c("xd", d=6, k=3, s=2, p=1), arch.act()), (4, 8, 9), ("XD(4, 6, 3, 2, 1, 8, 9)",)),
        "xd tokens": (
            seq(_c("xd", d=6, k=3, s=1, p=1), arch.identity()),
            (10, 4),
            ("XD(4, 6, 3, 1, 1, 10, channels_last=True)",),
        ),
        "activations": (
            seq(*(_c(name) for name in ("relu", "relu6", "gelu", "silu", "hardswish")), _c("dropout", p=0.2)),
            (3, 4, 4),
            (
                "F.relu(x)",
                "F.relu6(x)",
                "F.gelu(x)",
                "F.silu(x)",
                "F.hardswish(x)",
                "F.dropout(x, 0.2, self.training)",
            ),
        ),
        "pools": (
            seq(_c("max_pool", k=3, s=2, p=1), _c("avg_pool", k=2, s=2, p=0)),
            (3, 9, 9),
            ("F.max_pool2d(x, 3, 2, 1)", "F.avg_pool2d(x, 2, 2, 0)"),
        ),
        "zoo convolutions": (
            seq(
                arch.conv(8),
                _c("depthwise_conv", k=5, s=2, p=2),
                _c("grouped_conv", g=4, k=3, s=1, p=1),
                _c("squeeze_excite", r=4, act="silu"),
                _c("squeeze_excite", r=4, act="relu"),
                _c("layer_scale"),
                _c("affine"),
                _c("channel_norm"),
            ),
            (3, 8, 8),
            (
                "nn.Conv2d(8, 8, 5, 2, 2, groups=8)",
                "nn.Conv2d(8, 8, 3, 1, 1, groups=4)",
                "nn.Conv2d(8, 2, 1)",
                "nn.Conv2d(2, 8, 1)",
                "x = x * torch.sigmoid(self.excite1(F.silu(self.squeeze1(x.mean((2, 3), keepdim=True)))))",
                "F.relu(self.squeeze2(",
                "nn.Parameter(torch.full((8, 1, 1), 0.1))",
                "self.scale2 = nn.Parameter(torch.ones((8, 1, 1)))",
                "self.shift1 = nn.Parameter(torch.zeros((8, 1, 1)))",
                "x = torch.addcmul(self.shift1, self.scale2, x)",
                "nn.LayerNorm(8, eps=1e-06)",
                "x = self.norm1(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)",
            ),
        ),
        "token scale": (
            seq(_c("layer_scale"), _c("affine")),
            (4, 6),
            (
                "nn.Parameter(torch.full((6,), 0.1))",
                "self.scale2 = nn.Parameter(torch.ones((6,)))",
                "self.shift1 = nn.Parameter(torch.zeros((6,)))",
                "x = torch.addcmul(self.shift1, self.scale2, x)",
            ),
        ),
    }
)


#: case -> the layers its class sets in __init__, each named by its kind and numbered.
LAYERS: dict[str, list[str]] = {
    "conv": ["self.conv1 = nn.Conv2d(4, 8, 3, 2, 1)", "self.norm1 = nn.BatchNorm2d(8)"],
    "residual": [
        "self.conv1 = nn.Conv2d(4, 4, 3, 1, 1)",
        "self.norm1 = nn.BatchNorm2d(4)",
        "self.residual1 = Residual()",
    ],
    "sum of four": [
        "self.conv1 = nn.Conv2d(3, 4, 3, 1, 1)",
        "self.conv2 = nn.Conv2d(3, 4, 3, 1, 1)",
        "self.conv3 = nn.Conv2d(3, 4, 3, 1, 1)",
        "self.conv4 = nn.Conv2d(3, 4, 3, 1, 1)",
        "self.sum1 = Sum()",
    ],
    "dense": [
        "self.conv1 = nn.Conv2d(3, 4, 3, 1, 1)",
        "self.dense1 = Dense()",
        "self.norm1 = nn.BatchNorm2d(7)",
    ],
    "concat width": [
        "self.norm1 = nn.BatchNorm2d(2)",
        "self.norm2 = nn.BatchNorm2d(2)",
        "self.norm3 = nn.BatchNorm2d(2)",
        "self.norm4 = nn.BatchNorm2d(2)",
        "self.norm5 = nn.BatchNorm2d(2)",
        "self.norm6 = nn.BatchNorm2d(2)",
        "self.norm7 = nn.BatchNorm2d(2)",
        "self.norm8 = nn.BatchNorm2d(2)",
        "self.concat1 = Concat()",
    ],
    "grouped": [
        "self.conv1 = nn.Conv2d(2, 3, 3, 1, 1)",
        "self.conv2 = nn.Conv2d(2, 5, 1, 1, 0)",
        "self.norm1 = nn.BatchNorm2d(8)",
        "self.grouped_concat1 = GroupedConcat()",
        "self.grouped_residual1 = GroupedResidual()",
    ],
    "product": [
        "self.conv1 = nn.Conv2d(3, 3, 1, 1, 0)",
        "self.norm1 = nn.BatchNorm2d(3)",
        "self.product1 = Product()",
        "self.product2 = Product2()",
    ],
    "routing": ["self.norm1 = nn.BatchNorm2d(6)", "self.norm2 = nn.LayerNorm(27)"],
    "unfold strided": ["self.norm1 = nn.LayerNorm(18)"],
    "channel linears": [
        "self.conv1 = nn.Conv2d(3, 4, 1, 1, 0)",
        "self.conv2 = nn.Conv2d(3, 6, 1, 1, 0)",
        "self.convs1 = nn.ModuleList(nn.Conv2d(10, 5, 1) for _ in range(2))",
        "self.conv3 = nn.Conv2d(5, 7, 1, 1, 0)",
    ],
    "token linears": [
        "self.linear1 = nn.Linear(8, 4)",
        "self.linear2 = nn.Linear(8, 6)",
        "self.linears1 = nn.ModuleList(nn.Linear(10, 5) for _ in range(4))",
        "self.linears2 = nn.ModuleList(nn.Linear(5, 3) for _ in range(2))",
    ],
    "tokens": [
        "self.position1 = nn.Parameter(torch.randn(1, 6, 8) * 0.02)",
        "self.linear1 = nn.Linear(8, 16)",
        "self.norm1 = nn.LayerNorm(16)",
    ],
    "image position": ["self.position1 = nn.Parameter(torch.randn(1, 2, 3, 4) * 0.02)"],
    "patches": ["self.conv1 = nn.Conv2d(3, 8, 4, 4, 0)", "self.norm1 = nn.LayerNorm(8)"],
    "attention": ["self.qkv = nn.Linear(8, 24)", "self.attention1 = Attention()"],
    "scaled attention": ["self.qkv = nn.Linear(8, 24)", "self.attention1 = Attention()"],
    "attention written out": [
        "self.linear1 = nn.Linear(8, 8)",
        "self.linear2 = nn.Linear(8, 8)",
        "self.linear3 = nn.Linear(8, 8)",
        "self.attention1 = Attention()",
    ],
    "heads concatenated": [
        "self.qkv = nn.Linear(8, 24)",
        "self.attention1 = MultiHeadAttention()",
        "self.linear1 = nn.Linear(8, 8)",
    ],
    "heads added": ["self.qkv = nn.Linear(8, 48)", "self.attention1 = MultiHeadAttention()"],
    "heads joined": ["self.qkv = nn.Linear(8, 24)", "self.attention1 = MultiHeadAttention()"],
    "heads scaled": ["self.qkv = nn.Linear(8, 48)", "self.attention1 = MultiHeadAttention()"],
    "unscaled scores": ["self.qkv = nn.Linear(8, 24)", "self.attention1 = Attention()"],
    "written out, scaled": [
        "self.linear1 = nn.Linear(8, 8)",
        "self.linear2 = nn.Linear(8, 8)",
        "self.linear3 = nn.Linear(8, 8)",
        "self.attention1 = Attention()",
    ],
    "calibrations": [
        "self.conv1 = nn.Conv2d(3, 16, 3, 1, 1)",
        "self.channel_attention1 = ChannelAttention(16, 16)",
        "self.spatial_attention1 = SpatialAttention(16)",
        "self.dynamic_kernel1 = DynamicKernel(16, 16, 3)",
    ],
    "calibrated pairs": [
        "self.conv1 = nn.Conv2d(16, 16, 3, 1, 1)",
        "self.conv2 = nn.Conv2d(16, 16, 1, 1, 0)",
        "self.channel_attention1 = ChannelAttention(16, 16)",
        "self.norm1 = nn.BatchNorm2d(16)",
        "self.spatial_attention1 = SpatialAttention(16)",
        "self.conv1 = nn.Conv2d(16, 16, 3, 1, 1)",
        "self.dynamic_kernel1 = DynamicKernel(16, 16, 5)",
        "self.conv1 = nn.Conv2d(3, 16, 3, 1, 1)",
        "self.calibrated1 = Calibrated()",
        "self.calibrated2 = Calibrated2()",
        "self.calibrated3 = Calibrated3()",
    ],
    "xd image": ["self.xd1 = XD(4, 6, 3, 2, 1, 8, 9)"],
    "xd tokens": ["self.xd1 = XD(4, 6, 3, 1, 1, 10, channels_last=True)"],
    "zoo convolutions": [
        "self.conv1 = nn.Conv2d(3, 8, 3, 1, 1)",
        "self.depthwise1 = nn.Conv2d(8, 8, 5, 2, 2, groups=8)",
        "self.grouped1 = nn.Conv2d(8, 8, 3, 1, 1, groups=4)",
        "self.squeeze1 = nn.Conv2d(8, 2, 1)",
        "self.excite1 = nn.Conv2d(2, 8, 1)",
        "self.squeeze2 = nn.Conv2d(8, 2, 1)",
        "self.excite2 = nn.Conv2d(2, 8, 1)",
        "self.scale1 = nn.Parameter(torch.full((8, 1, 1), 0.1))",
        "self.norm1 = nn.LayerNorm(8, eps=1e-06)",
    ],
    "token scale": ["self.scale1 = nn.Parameter(torch.full((6,), 0.1))"],
}


def _randomised(network: nn.Module) -> nn.Module:
    """float64, and every parameter and floating buffer drawn at random (variances positive)."""
    network = network.double()
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, tensor in [*network.named_parameters(), *network.named_buffers()]:
            if tensor.is_floating_point():
                value = torch.randn(tensor.shape, generator=generator, dtype=tensor.dtype)
                tensor.copy_(value.abs() + 0.5 if name.endswith("running_var") else value)
    return network


def _agrees(tree: arch.Module, shape: tuple[int, ...], what: str) -> str:
    """The exported class, run here with the exported state, computes what the compiled network
    does (eval and train, the same parameter count); its source."""
    checked = check_tree(arch.network(tree), None, input_state(shape))
    network = _randomised(compile_network(checked, classes=3))
    exported = export_networks({"Net": network})
    namespace: dict = {}
    exec(compile(exported.source, f"{what}.py", "exec"), namespace)
    model = namespace["Net"]().double()
    model.load_state_dict(exported.state_dicts["Net"], strict=True)
    assert sum(p.numel() for p in model.parameters()) == sum(p.numel() for p in network.parameters())
    x = torch.randn(2, *shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    for train in (False, True):
        network.train(train), model.train(train)
        with torch.no_grad():
            torch.manual_seed(2)
            wanted = network(x)
            torch.manual_seed(2)
            got = model(x)
        torch.testing.assert_close(
            got, wanted, rtol=1e-9, atol=1e-9, msg=lambda m, train=train: f"{what} train={train}: {m}"
        )
    return exported.source


@pytest.mark.parametrize("case", list(CASES))
def test_the_exported_class_computes_what_the_network_does(case: str):
    tree, shape, lines = CASES[case]
    source = _agrees(tree, shape, case)
    for line in [*lines, *(f"        {layer}" for layer in LAYERS.get(case, ()))]:
        assert line in source, line


def _c8(name: str, **args) -> Callable[[int], arch.Module]:
    return lambda width: _c(name, **args)


#: name -> (the block of a given width, input, the shared block's constructor).
SHARED = {
    "norm": (lambda w: arch.norm(), (8, 4, 4), "channels: int"),
    "conv": (lambda w: arch.conv(w), (8, 4, 4), "channels: int"),
    "depthwise": (_c8("depthwise_conv", k=3, s=1, p=1), (8, 4, 4), "channels: int"),
    "grouped": (
        lambda w: _c("grouped_conv", g=w // 4, k=3, s=1, p=1),
        (8, 4, 4),
        "channels: int, groups: int",
    ),
    "squeeze": (_c8("squeeze_excite", r=4, act="relu"), (8, 4, 4), "channels: int, squeezed: int"),
    "scale": (_c8("layer_scale"), (8, 4, 4), "features: int"),
    "channel norm": (_c8("channel_norm"), (8, 4, 4), "channels: int"),
    "position": (lambda w: arch.pos_enc(), (8, 4, 4), "channels: int"),
    "xd": (lambda w: _c("xd", d=w, k=3, s=1, p=1), (8, 4, 4), "channels: int"),
    "channel linear": (lambda w: arch.linear(w), (8, 4, 4), "channels: int"),
    "token linear": (lambda w: arch.linear(w), (5, 8), "features: int"),
    "token position": (lambda w: arch.pos_enc(), (5, 8), "features: int"),
    "token norm": (lambda w: arch.norm(), (5, 8), "features: int"),
    "branch linears": (
        lambda w: branching(clone2, [arch.linear(w), arch.linear(w)], op("add")),
        (5, 8),
        "features: int",
    ),
    "branch convs": (
        lambda w: branching(clone2, [arch.linear(w), arch.linear(w)], op("add")),
        (8, 4, 4),
        "channels: int",
    ),
    "token scale": (_c8("layer_scale"), (5, 8), "features: int"),
    "affine": (_c8("affine"), (8, 4, 4), "features: int"),
    "token affine": (_c8("affine"), (5, 8), "features: int"),
}


@pytest.mark.parametrize("case", list(SHARED))
def test_a_block_used_at_two_widths_is_one_class_taking_them(case: str):
    """The sizes that differ between uses of a class become its constructor's arguments, named
    by their role."""
    make, shape, arguments = SHARED[case]
    tree = seq(arch.residual(make(8)), arch.linear(16), arch.residual(make(16)))
    source = _agrees(tree, shape, case)
    assert source.count("class Residual") == 1
    assert f"    def __init__(self, {arguments}) -> None:" in source


def test_the_classes_are_named_for_their_sizes_and_documented():
    checked = check_tree(arch.network(CASES["residual"][0]), None, input_state((4, 6, 6)))
    source = export_networks({"Net": compile_network(checked, classes=3)}, {"Net": "Net: a block."}).source
    assert (
        "class Residual(nn.Module):" in source
        and "    def __init__(self, classes: int = 3) -> None:" in source
    )
    assert '    """Net: a block."""' in source
    assert "        self.head = nn.Linear(4, classes)" in source
    assert "        x = self.residual1(x)" in source


def _network(shape: tuple[int, ...] = (4, 6, 6)) -> nn.Module:
    return compile_network(
        check_tree(arch.network(CASES["residual"][0]), None, input_state(shape)), classes=3
    )


def test_a_head_other_than_the_papers_is_refused():
    network = _network()
    network.head = nn.Identity()
    with pytest.raises(EinspaceError, match="export writes the paper's classification head, not Identity"):
        export_networks({"Net": network})


def test_a_module_export_does_not_know_is_refused_by_its_type():
    network = _network()
    network.backbone = nn.Sequential(nn.Tanh())
    with pytest.raises(
        EinspaceError,
        match=r"export cannot write a Tanh module as plain PyTorch \(an operation that declares "
        r"`exportable = True` must build modules export knows\)",
    ):
        export_networks({"Net": network})


@pytest.mark.parametrize(
    "modules, message",
    [
        ([_modules.Clone(2)], "export needs a Clone followed by branches and an aggregation"),
        ([_modules.Clone(2), nn.Identity(), nn.Identity()], "export needs a Clone followed by branches"),
        ([_modules.Clone(2), Branches([nn.Identity(), nn.Identity()])], "export needs a Clone followed by"),
        (
            [_modules.GroupDim(1, 2), nn.ModuleList([nn.Identity(), nn.Identity()])],
            "export needs a GroupDim followed by branches and an aggregation",
        ),
    ],
)
def test_a_split_without_its_branches_and_aggregation_is_refused(modules, message):
    with pytest.raises(EinspaceError, match=message):
        Writer().sequence(Instance("", ""), modules, "x", "x")


def test_an_aggregation_export_does_not_know_is_refused():
    network = _network()
    backbone = network.backbone
    branching = next(
        m
        for m in backbone.modules()
        if isinstance(m, nn.Sequential) and any(isinstance(c, _modules.Add) for c in m)
    )
    index = next(i for i, c in enumerate(branching) if isinstance(c, _modules.Add))
    branching[index] = nn.Tanh()
    with pytest.raises(EinspaceError, match="export cannot write the aggregation Tanh"):
        export_networks({"Net": network})


def test_a_sequence_of_a_split_its_branches_and_more_is_written_in_order():
    """A split with exactly its branches and aggregation at the end of a sequence (i + 2 is the
    last index) is accepted."""
    writer, scope = Writer(), Instance("", "")
    branches = [m for m in _network().backbone.modules() if type(m).__name__ == "Branches"]
    assert branches
    out = writer.sequence(scope, [_modules.Clone(2), branches[0], _modules.Add()], "x", "x")
    assert out == "x" and scope.lines == ["x = self.residual1(x)"]


#: name -> (the two branches' operation at the first use, at the second, input, the constructor).
PAIRS = {
    "depthwise": (
        _c("depthwise_conv", k=3, s=1, p=1),
        _c("depthwise_conv", k=5, s=2, p=2),
        (8, 8, 8),
        "kernel_size: int, stride: int, padding: int",
    ),
    "grouped": (
        _c("grouped_conv", g=2, k=3, s=1, p=1),
        _c("grouped_conv", g=4, k=5, s=2, p=2),
        (8, 8, 8),
        "groups: int, kernel_size: int, stride: int, padding: int",
    ),
    "conv": (
        arch.conv(8, 3, 1),
        arch.conv(8, 5, 2),
        (8, 8, 8),
        "kernel_size: int, stride: int, padding: int",
    ),
    "xd": (
        _c("xd", d=8, k=3, s=1, p=1),
        _c("xd", d=8, k=5, s=2, p=2),
        (8, 8, 8),
        "kernel_size: int, stride: int, padding: int",
    ),
    "xd at two sizes": (
        _c("xd", d=8, k=3, s=2, p=1),
        _c("xd", d=8, k=3, s=1, p=1),
        (8, 8, 8),
        "stride: int, height: int, width: int",
    ),
    "xd over tokens": (
        _c("xd", d=8, k=4, s=2, p=1),
        _c("xd", d=8, k=3, s=1, p=1),
        (8, 8),
        "kernel_size: int, stride: int, length: int",
    ),
}


@pytest.mark.parametrize("case", list(PAIRS))
def test_kernels_strides_and_sizes_that_differ_between_uses_are_arguments(case: str):
    first, second, shape, arguments = PAIRS[case]
    tree = seq(branching(clone2, [first, first], op("add")), branching(clone2, [second, second], op("add")))
    source = _agrees(tree, shape, case)
    assert source.count("class Residual") == 1
    assert f"    def __init__(self, {arguments}) -> None:" in source


@pytest.mark.parametrize(
    "between, shape, arguments",
    [
        (arch.conv(8, 3, 2), (8, 8, 6), "height: int, width: int"),
        (
            branching(clone2, [arch.identity(), arch.identity()], op("concat", dim=1, b=2)),
            (5, 8),
            "tokens: int",
        ),
    ],
)
def test_a_positional_encoding_at_two_sizes_takes_them(between, shape, arguments):
    tree = seq(arch.residual(arch.pos_enc()), between, arch.residual(arch.pos_enc()))
    source = _agrees(tree, shape, "position")
    assert f"    def __init__(self, {arguments}) -> None:" in source

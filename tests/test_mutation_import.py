"""Import, rule by rule, fast enough to run once per mutant: small hand-written torch models, each
imported and its network run with the model's weights against the model itself (float64, eval
and train), with the exact tree expected; every substitution and refusal of the layer rules and
of the converter at its boundary (a slope, an eps, a momentum, a dilation, a shape off by one).
test_fx_import.py and test_import_zoo.py import whole architectures."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from test_fx_import import sequence_form
from torch import nn

from einspace import load_grammar
from einspace.network.importer import ModelImportError, import_model
from einspace.network.importer.converter import grammar_grid
from einspace.network.importer.layers import activation_name, exact_but_groups, square
from einspace.seeds import architectures as arch
from einspace.state import input_state

pytestmark = pytest.mark.usefixtures("one_thread")

PAPER, ZOO = load_grammar("einspace"), load_grammar("einspace_zoo")
TOKENS, IMAGE = (6, 16), (4, 6, 6)
op, seq, c = arch.op, arch.seq, arch.computation


class Fn(nn.Module):
    """A model from a function of its layers and learnt tensors, so each case is one line."""

    def __init__(self, forward, tensors: dict[str, torch.Tensor] | None = None, **layers: nn.Module):
        super().__init__()
        self.layers = nn.ModuleDict(layers)
        self.tensors = nn.ParameterDict({k: nn.Parameter(v) for k, v in (tensors or {}).items()})
        self.function = forward

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.function(self, x)


def _randomise_statistics(model: nn.Module) -> None:
    """Running statistics at random, so that eval mode reads the imported ones."""
    generator = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for buffer in model.buffers():
            if buffer.is_floating_point():
                buffer.copy_(torch.rand(buffer.shape, generator=generator, dtype=buffer.dtype) + 0.5)


def _same(model: nn.Module, imported, grammar, shape, added: int = 0, modes=(False, True)) -> None:
    """The imported network computes what `model` does, float64, eval then train (dropout with
    the same seed), with `added` parameters more."""
    network = imported.network(grammar).double()
    model = model.double()
    assert sum(p.numel() for p in network.parameters()) == sum(p.numel() for p in model.parameters()) + added
    x = torch.randn(2, *shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    for train in modes:
        network.train(train), model.train(train)
        with torch.no_grad():
            torch.manual_seed(0)
            wanted = model(x)
            torch.manual_seed(0)
            torch.testing.assert_close(network(x), wanted)
    model.float()


def bn(n: int = 4, **kw) -> nn.BatchNorm2d:
    return nn.BatchNorm2d(n, **kw)


#: name -> (model, input, grammar, the tree's backbone, substitution fragments (none: exact)).
EXACT = {
    "leaky positional slope": (
        Fn(lambda m, x: F.leaky_relu(x, 0.01)),
        TOKENS,
        PAPER,
        seq(arch.act(), arch.identity()),
    ),
    "leaky keyword slope": (
        Fn(lambda m, x: F.leaky_relu(x, negative_slope=0.01)),
        TOKENS,
        PAPER,
        seq(arch.act(), arch.identity()),
    ),
    "leaky default slope": (
        Fn(lambda m, x: F.leaky_relu(x)),
        TOKENS,
        PAPER,
        seq(arch.act(), arch.identity()),
    ),
    "softmax positional": (
        Fn(lambda m, x: F.softmax(x, -1)),
        TOKENS,
        PAPER,
        seq(arch.softmax(), arch.identity()),
    ),
    "softmax keyword last": (
        Fn(lambda m, x: torch.softmax(x, dim=2)),
        TOKENS,
        PAPER,
        seq(arch.softmax(), arch.identity()),
    ),
    "softmax method": (Fn(lambda m, x: x.softmax(-1)), TOKENS, PAPER, seq(arch.softmax(), arch.identity())),
    "softmax module": (
        nn.Sequential(nn.Softmax(-1), nn.Identity()),
        TOKENS,
        PAPER,
        seq(arch.softmax(), arch.identity()),
    ),
    "zoo activations": (
        Fn(lambda m, x: F.hardswish(F.silu(F.gelu(F.relu6(x.relu()))))),
        IMAGE,
        ZOO,
        seq(c("relu"), c("relu6"), c("gelu"), c("silu"), c("hardswish")),
    ),
    "zoo activation modules": (
        nn.Sequential(nn.ReLU(), nn.GELU(), nn.SiLU(), nn.ReLU6(), nn.Hardswish()),
        IMAGE,
        ZOO,
        seq(c("relu"), c("gelu"), c("silu"), c("relu6"), c("hardswish")),
    ),
    "kept dropout": (
        Fn(lambda m, x: F.dropout(x, 0.2, m.training)),
        IMAGE,
        ZOO,
        seq(c("dropout", p=0.2), arch.identity()),
    ),
    "default dropout": (
        Fn(lambda m, x: F.dropout(x, training=m.training)),
        IMAGE,
        ZOO,
        seq(c("dropout", p=0.5), arch.identity()),
    ),
    "dropout module": (
        nn.Sequential(nn.Dropout(0.1), nn.ReLU()),
        IMAGE,
        ZOO,
        seq(c("dropout", p=0.1), c("relu")),
    ),
    "left out dropout": (
        nn.Sequential(nn.Dropout(0.3), nn.ReLU()),
        IMAGE,
        ZOO,
        seq(c("relu"), arch.identity()),
    ),
    "identity left out": (
        nn.Sequential(nn.Identity(), nn.LeakyReLU()),
        TOKENS,
        PAPER,
        seq(arch.act(), arch.identity()),
    ),
    "pools": (
        Fn(lambda m, x: F.avg_pool2d(F.max_pool2d(x, 3, 1, 1), kernel_size=2)),
        IMAGE,
        ZOO,
        seq(c("max_pool", k=3, s=1, p=1), c("avg_pool", k=2, s=2, p=0)),
    ),
    "pool modules": (
        nn.Sequential(nn.MaxPool2d(3, 2, 1), nn.AvgPool2d(3, 1, 1)),
        IMAGE,
        ZOO,
        seq(c("max_pool", k=3, s=2, p=1), c("avg_pool", k=3, s=1, p=1)),
    ),
    "positional": (
        Fn(lambda m, x: x + m.tensors["pos"], {"pos": torch.randn(6, 16)}),
        TOKENS,
        PAPER,
        seq(arch.pos_enc(), arch.identity()),
    ),
    "positional batched": (
        Fn(lambda m, x: torch.add(x, m.tensors["pos"]), {"pos": torch.randn(1, 4, 6, 6)}),
        IMAGE,
        PAPER,
        seq(arch.pos_enc(), arch.identity()),
    ),
    "layer scale image": (
        Fn(lambda m, x: x * m.tensors["g"], {"g": torch.randn(4, 1, 1)}),
        IMAGE,
        ZOO,
        seq(c("layer_scale"), arch.identity()),
    ),
    "layer scale batched": (
        Fn(lambda m, x: torch.mul(x, m.tensors["g"]), {"g": torch.randn(1, 4, 1, 1)}),
        IMAGE,
        ZOO,
        seq(c("layer_scale"), arch.identity()),
    ),
    "layer scale tokens": (
        Fn(lambda m, x: x.mul(m.tensors["g"]), {"g": torch.randn(1, 1, 16)}),
        TOKENS,
        ZOO,
        seq(c("layer_scale"), arch.identity()),
    ),
    "affine tokens": (  # timm's Affine: addcmul(beta, alpha, x), both (1, 1, D)
        Fn(
            lambda m, x: torch.addcmul(m.tensors["b"], m.tensors["a"], x),
            {"a": torch.randn(1, 1, 16), "b": torch.randn(1, 1, 16)},
        ),
        TOKENS,
        ZOO,
        seq(c("affine"), arch.identity()),
    ),
    "affine tokens, x in the middle": (
        Fn(
            lambda m, x: torch.addcmul(m.tensors["b"], x, m.tensors["a"]),
            {"a": torch.randn(16), "b": torch.randn(1, 1, 16)},
        ),
        TOKENS,
        ZOO,
        seq(c("affine"), arch.identity()),
    ),
    "affine image, method and keywords": (
        Fn(
            lambda m, x: m.tensors["b"].addcmul(tensor1=x, tensor2=m.tensors["a"], value=1),
            {"a": torch.randn(4, 1, 1), "b": torch.randn(1, 4, 1, 1)},
        ),
        IMAGE,
        ZOO,
        seq(c("affine"), arch.identity()),
    ),
    "conv": (
        nn.Sequential(nn.Conv2d(4, 16, 3, 2, 1), bn(16)),
        IMAGE,
        PAPER,
        seq(arch.conv(16, 3, 2), arch.norm()),
    ),
    "depthwise": (
        nn.Sequential(nn.Conv2d(4, 4, 5, 1, 2, groups=4), nn.Conv2d(4, 4, 3, 2, 1, groups=2)),
        IMAGE,
        ZOO,
        seq(c("depthwise_conv", k=5, s=1, p=2), c("grouped_conv", g=2, k=3, s=2, p=1)),
    ),
    "layer norm": (
        nn.Sequential(nn.Linear(16, 32), nn.LayerNorm(32)),
        TOKENS,
        PAPER,
        seq(arch.linear(32), arch.norm()),
    ),
    "channel norm module": (
        Fn(
            lambda m, x: m.layers["ln"](x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2),
            ln=nn.LayerNorm(4, eps=1e-6),
        ),
        IMAGE,
        ZOO,
        seq(c("channel_norm"), arch.identity()),
    ),
    "channel norm function": (
        Fn(
            lambda m, x: F.layer_norm(
                x.permute(0, 2, 3, 1), (4,), m.tensors["w"], m.tensors["b"], 1e-6
            ).permute(0, 3, 1, 2),
            {"w": torch.randn(4), "b": torch.randn(4)},
        ),
        IMAGE,
        ZOO,
        seq(c("channel_norm"), arch.identity()),
    ),
    "unfold then fold": (
        Fn(
            lambda m, x: (
                m.layers["lin"](F.unfold(x, 3, padding=1).transpose(1, 2))
                .transpose(1, 2)
                .unflatten(2, (6, 6))
            ),
            lin=nn.Linear(36, 16),
        ),
        IMAGE,
        PAPER,
        arch.conv(16, 3, 1),
    ),
    "unfold positional": (
        Fn(lambda m, x: m.layers["lin"](F.unfold(x, 3, 1, 1, 2).transpose(1, 2)), lin=nn.Linear(36, 16)),
        IMAGE,
        PAPER,
        arch.routing(op("im2col", k=3, s=2, p=1), arch.linear(16), "identity"),
    ),
    "unfold defaults": (
        Fn(lambda m, x: m.layers["lin"](F.unfold(x, kernel_size=1).transpose(1, 2)), lin=nn.Linear(4, 16)),
        IMAGE,
        PAPER,
        arch.routing(op("im2col", k=1, s=1, p=0), arch.linear(16), "identity"),
    ),
    "image to tokens": (
        Fn(lambda m, x: m.layers["lin"](x.flatten(2).transpose(1, 2)), lin=nn.Linear(4, 16)),
        IMAGE,
        PAPER,
        arch.routing(op("im2col", k=1, s=1, p=0), arch.linear(16), "identity"),
    ),
    "permutes": (
        Fn(lambda m, x: x.permute(0, 2, 3, 1).softmax(-1).permute(0, 3, 1, 2)),
        IMAGE,
        PAPER,
        arch.routing(op("permute", order=(2, 3, 1)), arch.softmax(), op("permute", order=(3, 1, 2))),
    ),
    "one permute": (
        Fn(lambda m, x: m.layers["lin"](x.transpose(1, 2)), lin=nn.Linear(6, 16)),
        TOKENS,
        PAPER,
        arch.routing(op("permute", order=(2, 1)), arch.linear(16), "identity"),
    ),
}


@pytest.mark.parametrize("case", list(EXACT))
def test_exact_imports_compute_what_the_model_does(case):
    model, shape, grammar, backbone = EXACT[case]
    _randomise_statistics(model)
    imported = import_model(model, input_state(shape), grammar)
    assert imported.substitutions == ()
    assert sequence_form(imported.tree) == sequence_form(arch.network(backbone)), imported.tree
    _same(model, imported, grammar, shape, modes=(False,) if "left out" in case else (False, True))


#: name -> (model, input, grammar, the tree's backbone with substitutes, the substitution's text).
SUBSTITUTED = {
    "other slope": (
        Fn(lambda m, x: F.leaky_relu(x, 0.2)),
        TOKENS,
        PAPER,
        seq(arch.act(), arch.identity()),
        "leaky ReLU with slope 0.2 is not in grammar",
    ),
    "other slope module": (
        nn.Sequential(nn.LeakyReLU(0.1), nn.Identity()),
        TOKENS,
        PAPER,
        seq(arch.act(), arch.identity()),
        "leaky ReLU with slope 0.1 is not in grammar",
    ),
    "gelu in the paper": (
        nn.Sequential(nn.GELU(), nn.Identity()),
        TOKENS,
        PAPER,
        seq(arch.act(), arch.identity()),
        "closest expressible: leaky_relu (slope 0.01), the grammar's activation",
    ),
    "tanh gelu": (
        Fn(lambda m, x: F.gelu(x, approximate="tanh")),
        IMAGE,
        ZOO,
        seq(arch.act(), arch.identity()),
        "function gelu",
    ),
    "tanh gelu module": (
        nn.Sequential(nn.GELU(approximate="tanh"), nn.Identity()),
        IMAGE,
        ZOO,
        seq(arch.act(), arch.identity()),
        "GELU(approximate='tanh')",
    ),
    "batch norm eps": (
        nn.Sequential(bn(eps=1e-3), nn.Identity()),
        IMAGE,
        PAPER,
        seq(arch.norm(), arch.identity()),
        "closest expressible: norm (BatchNorm2d with eps 1e-5, momentum 0.1), same weights",
    ),
    "batch norm momentum": (
        nn.Sequential(bn(momentum=0.2), nn.Identity()),
        IMAGE,
        PAPER,
        seq(arch.norm(), arch.identity()),
        "BatchNorm2d(4, eps=1e-05, momentum=0.2",
    ),
    "layer norm eps": (
        nn.Sequential(nn.LayerNorm(16, eps=1e-6), nn.Identity()),
        TOKENS,
        PAPER,
        seq(arch.norm(), arch.identity()),
        "closest expressible: norm (LayerNorm with eps 1e-5 and a bias)",
    ),
    "layer norm without bias": (
        nn.Sequential(nn.LayerNorm(16, bias=False), nn.Identity()),
        TOKENS,
        PAPER,
        seq(arch.norm(), arch.identity()),
        "bias=False",
    ),
    "channel norm eps": (
        Fn(
            lambda m, x: m.layers["ln"](x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2),
            ln=nn.LayerNorm(4, eps=1e-5),
        ),
        IMAGE,
        ZOO,
        seq(c("channel_norm"), arch.identity()),
        "a layer norm over channels with eps 1e-05 is not in grammar",
    ),
    "width": (
        nn.Sequential(nn.Linear(16, 24), nn.Identity()),
        TOKENS,
        PAPER,
        seq(arch.linear(32), arch.identity()),
        "width 24 (the output features) is not in grammar",
    ),
    "width nearer below": (
        nn.Sequential(nn.Linear(16, 22), nn.Identity()),
        TOKENS,
        PAPER,
        seq(arch.linear(16), arch.identity()),
        "width 16, the grid's nearest (linear(d=16))",
    ),
    "conv width": (
        nn.Sequential(nn.Conv2d(4, 24, 3, 1, 1), nn.Identity()),
        IMAGE,
        PAPER,
        arch.conv(32, 3, 1),
        "width 24 (the output channels)",
    ),
    "dilated conv": (
        nn.Sequential(nn.Conv2d(4, 16, 3, 1, 2, dilation=2), nn.Identity()),
        IMAGE,
        PAPER,
        arch.conv(16, 3, 1),
        "a 3x3 stride-1 convolution, padding (2, 2), groups 1, dilation (2, 2), zeros padding",
    ),
    "reflect padding": (
        nn.Sequential(nn.Conv2d(4, 16, 3, 1, 1, padding_mode="reflect"), nn.Identity()),
        IMAGE,
        PAPER,
        arch.conv(16, 3, 1),
        "groups 1, dilation (1, 1), reflect padding",
    ),
    "kernel off the grid": (
        nn.Sequential(nn.Conv2d(4, 16, 5, 1, 2), nn.Identity()),
        IMAGE,
        PAPER,
        arch.conv(16, 3, 1),
        "closest expressible: a 3x3 stride-1 convolution to 16 channels (im2col(k=3, s=1, p=1)",
    ),
    "grouped in the paper": (
        nn.Sequential(nn.Conv2d(4, 4, 3, 1, 1, groups=2), nn.Identity()),
        IMAGE,
        PAPER,
        arch.conv(16, 3, 1),
        "groups 2",
    ),
    "max pool in the paper": (
        nn.Sequential(nn.MaxPool2d(3, 2, 1), nn.Identity()),
        IMAGE,
        PAPER,
        arch.conv(16, 3, 2),
        "MaxPool2d (kernel 3, stride 2, padding 1) is not in grammar",
    ),
    "ceil mode": (
        nn.Sequential(nn.MaxPool2d(2, 2, ceil_mode=True), nn.Identity()),
        (4, 8, 8),
        ZOO,
        None,
        "MaxPool2d (kernel 2, stride 2, padding 0)",
    ),
    "average without padding": (
        nn.Sequential(nn.AvgPool2d(3, 1, 1, count_include_pad=False), nn.Identity()),
        IMAGE,
        ZOO,
        arch.conv(16, 3, 1),
        "AvgPool2d (kernel 3, stride 1, padding 1)",
    ),
    "divisor": (
        nn.Sequential(nn.AvgPool2d(2, 2, divisor_override=3), nn.Identity()),
        (4, 8, 8),
        ZOO,
        None,
        "AvgPool2d (kernel 2, stride 2, padding 0)",
    ),
    "dilated pool": (
        Fn(lambda m, x: F.max_pool2d(x, 2, 2, 1, dilation=2)),
        (4, 8, 8),
        ZOO,
        None,
        "max_pool2d (kernel 2, stride 2, padding 1)",
    ),
    "pool off the grid": (
        Fn(lambda m, x: F.avg_pool2d(x, 3, 2)),
        (4, 7, 7),
        ZOO,
        None,
        "avg_pool2d (kernel 3, stride 2, padding 0)",
    ),
    "pool with five arguments": (
        Fn(lambda m, x: F.avg_pool2d(x, 2, 2, 0, True)),
        (4, 8, 8),
        ZOO,
        None,
        "avg_pool2d (kernel 2, stride 2, padding 0)",
    ),
    "unequal pool": (
        nn.Sequential(nn.MaxPool2d((3, 1), 1, (1, 0)), nn.Identity()),
        IMAGE,
        ZOO,
        None,
        "MaxPool2d (kernel 3, stride 1, padding 1)",
    ),
}


@pytest.mark.parametrize("case", list(SUBSTITUTED))
def test_substitutions_are_refused_unless_asked_for_and_then_listed(case):
    model, shape, grammar, backbone, text = SUBSTITUTED[case]
    x = input_state(shape)
    with pytest.raises(ModelImportError, match=r"cannot express \d kind") as caught:
        import_model(model, x, grammar)
    assert text in str(caught.value)
    imported = import_model(model, x, grammar, substitute=True)
    assert any(text in s for s in imported.substitutions), imported.substitutions
    if backbone is not None:
        assert sequence_form(imported.tree) == sequence_form(arch.network(backbone)), imported.tree


#: timm's Affine's learnt tensors on TOKENS, for the refusals of addcmul.
_AFFINE = {"a": torch.ones(1, 1, 16), "b": torch.zeros(1, 1, 16)}

#: name -> (model, input, grammar, the error's fragment).
REFUSED = {
    "softmax without a dim": (
        Fn(lambda m, x: F.softmax(x, dim=None)),
        TOKENS,
        PAPER,
        "softmax over axis None: the grammar's softmax is over the last axis",
    ),
    "softmax over the first axis": (Fn(lambda m, x: x.softmax(1)), TOKENS, PAPER, "softmax over axis 1"),
    "softmax module over the first axis": (
        nn.Sequential(nn.Softmax(dim=-2), nn.Identity()),
        TOKENS,
        PAPER,
        "softmax over axis -2",
    ),
    "unknown module": (
        nn.Sequential(nn.Tanhshrink(), nn.Identity()),
        TOKENS,
        PAPER,
        "Tanhshrink has no counterpart",
    ),
    "unknown function": (
        Fn(lambda m, x: torch.exp(x)),
        TOKENS,
        PAPER,
        "exp has no counterpart in the grammar",
    ),
    "dilated unfold": (
        Fn(lambda m, x: F.unfold(x, 3, dilation=2, padding=2).transpose(1, 2)),
        IMAGE,
        PAPER,
        "an unfold with dilation, or unequal sizes along height and width",
    ),
    "dilated unfold, positional": (
        Fn(lambda m, x: F.unfold(x, 3, 2, 2, 1).transpose(1, 2)),
        IMAGE,
        PAPER,
        "an unfold with dilation, or unequal sizes along height and width",
    ),
    "unequal unfold stride": (
        Fn(lambda m, x: F.unfold(x, 2, stride=(2, 1)).transpose(1, 2)),
        IMAGE,
        PAPER,
        "an unfold with dilation, or unequal sizes along height and width",
    ),
    "layer scale outside the grammar": (
        Fn(lambda m, x: x * m.tensors["g"], {"g": torch.randn(16)}),
        TOKENS,
        PAPER,
        "the grammar",
    ),
    "unequal unfold": (
        Fn(lambda m, x: F.unfold(x, (3, 1), padding=(1, 0)).transpose(1, 2)),
        IMAGE,
        PAPER,
        "an unfold with dilation, or unequal sizes",
    ),
    "product with a constant of another shape": (
        Fn(lambda m, x: x * m.tensors["g"], {"g": torch.randn(4, 6, 1)}),
        IMAGE,
        ZOO,
        "a product with a constant is in the grammar only as a learnt scale per feature",
    ),
    "token scale of the image shape": (
        Fn(lambda m, x: x * m.tensors["g"], {"g": torch.randn(6, 1)}),
        TOKENS,
        ZOO,
        "a product with a constant is in the grammar only",
    ),
    "constant of another shape": (
        Fn(lambda m, x: x + m.tensors["p"], {"p": torch.randn(16)}),
        TOKENS,
        PAPER,
        "adding a constant is in the grammar only as a learnt positional encoding of x's shape",
    ),
    "norm without affine": (
        nn.Sequential(bn(affine=False), nn.Identity()),
        IMAGE,
        PAPER,
        "the grammar's norm is a BatchNorm2d with affine parameters and running statistics",
    ),
    "norm without statistics": (
        nn.Sequential(bn(track_running_stats=False), nn.Identity()),
        IMAGE,
        PAPER,
        "the grammar's norm is a BatchNorm2d",
    ),
    "layer norm of two axes": (
        nn.Sequential(nn.LayerNorm((6, 16)), nn.Identity()),
        TOKENS,
        PAPER,
        "the grammar's norm in col mode is a LayerNorm over the last axis of [B, S, D]",
    ),
    "layer norm without weights": (
        nn.Sequential(nn.LayerNorm(16, elementwise_affine=False), nn.Identity()),
        TOKENS,
        PAPER,
        "the grammar's norm in col mode",
    ),
    "layer norm of an image": (
        nn.Sequential(nn.LayerNorm(6), nn.Identity()),
        IMAGE,
        PAPER,
        "the grammar's norm in col mode is a LayerNorm over the last axis of [B, S, D]",
    ),
    "channel norm without weights": (
        Fn(
            lambda m, x: m.layers["ln"](x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2),
            ln=nn.LayerNorm(4, elementwise_affine=False),
        ),
        IMAGE,
        ZOO,
        "the grammar's channel_norm is a LayerNorm with weights over the channels",
    ),
    "channel norm of two axes": (
        Fn(lambda m, x: m.layers["ln"](x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2), ln=nn.LayerNorm((6, 4))),
        IMAGE,
        ZOO,
        "the grammar's channel_norm is a LayerNorm with weights over the channels",
    ),
    "channel norm without the permutes": (
        Fn(
            lambda m, x: F.layer_norm(x, (6,), m.tensors["w"], m.tensors["b"], 1e-6),
            {"w": torch.randn(6), "b": torch.randn(6)},
        ),
        (4, 6, 6),
        ZOO,
        "a layer norm over the last axis of an image is the grammar's channel_norm only between "
        "x.permute(0, 2, 3, 1) and the permute back",
    ),
    "unequal stride": (
        nn.Sequential(nn.Conv2d(4, 16, 1, (2, 1)), nn.Identity()),
        (4, 8, 8),
        PAPER,
        "no convolution of the grammar's grid turns 8x8 into (4, 8)",
    ),
    "no conv fits": (
        nn.Sequential(nn.Conv2d(4, 16, 2, 3), nn.Identity()),
        (4, 8, 8),
        PAPER,
        "no convolution of the grammar's grid turns 8x8 into (3, 3)",
    ),
    "scaled positional sum": (
        Fn(lambda m, x: torch.add(x, m.tensors["pos"], alpha=2), {"pos": torch.randn(6, 16)}),
        TOKENS,
        PAPER,
        "a sum that scales its second term (alpha) is not in the grammar",
    ),
    "affine with a value": (
        Fn(lambda m, x: torch.addcmul(m.tensors["b"], m.tensors["a"], x, value=0.5), _AFFINE),
        TOKENS,
        ZOO,
        "addcmul with value=0.5: the grammar's affine is shift + scale · x",
    ),
    "affine added to x": (
        Fn(lambda m, x: torch.addcmul(x, m.tensors["a"], m.tensors["b"]), _AFFINE),
        TOKENS,
        ZOO,
        "addcmul adds a product to a computed tensor: the grammar's affine is "
        "torch.addcmul(shift, scale, x)",
    ),
    "affine of x squared": (
        Fn(lambda m, x: torch.addcmul(m.tensors["b"], x, x), _AFFINE),
        TOKENS,
        ZOO,
        "addcmul of the product of two computed tensors: the grammar's affine scales x by a learnt scale",
    ),
    "affine per token": (
        Fn(
            lambda m, x: torch.addcmul(m.tensors["b"], m.tensors["a"], x),
            {**_AFFINE, "a": torch.randn(6, 16)},
        ),
        TOKENS,
        ZOO,
        "addcmul with shift (1, 1, 16), scale (6, 16) on x (2, 6, 16): the grammar's affine has one "
        "learnt scale and shift per feature",
    ),
    "affine per row of an image": (
        Fn(
            lambda m, x: torch.addcmul(m.tensors["b"], m.tensors["a"], x),
            {"a": torch.randn(1, 1, 6), "b": torch.randn(4, 1, 1)},
        ),
        IMAGE,
        ZOO,
        "addcmul with shift (4, 1, 1), scale (1, 1, 6) on x (2, 4, 6, 6): the grammar's affine has one "
        "learnt scale and shift per feature, (D,) or (1, 1, D) on tokens [B, S, D], (C, 1, 1) or "
        "(1, C, 1, 1) on an image [B, C, H, W]",
    ),
    "linear of an image": (
        nn.Sequential(nn.Linear(6, 16), nn.Identity()),
        IMAGE,
        PAPER,
        "nn.Linear on a tensor of rank 4: the grammar's linear acts on tokens [B, S, D]",
    ),
    "no linear in the grammar": (
        nn.Sequential(nn.Linear(16, 16), nn.Identity()),
        TOKENS,
        "narrow",
        "the grammar",
    ),
}


@pytest.mark.parametrize("case", list(REFUSED))
def test_what_the_rules_cannot_express_is_refused(case, tmp_path):
    model, shape, grammar, fragment = REFUSED[case]
    if grammar == "narrow":
        path = tmp_path / "narrow.pcfg"
        path.write_text("extends einspace\nC -> identity | norm | leaky_relu\n")
        grammar = load_grammar(str(path))
    with pytest.raises(ModelImportError) as caught:
        import_model(model, input_state(shape), grammar, substitute=True)
    assert f"\n  {fragment}" in str(caught.value)  # the problem, on a line of its own after the place


def test_helpers_of_the_layer_rules():
    assert (square(3), square((5, 5)), square([2, 7])) == (3, 5, 2)
    assert exact_but_groups(nn.Conv2d(2, 2, 3, 1, 1))
    assert exact_but_groups(nn.Conv2d(2, 2, 3, 1, "same"))
    assert exact_but_groups(nn.Conv2d(2, 2, 2, 2, "valid"))
    for conv in (
        nn.Conv2d(2, 2, (3, 1), 1, 1),
        nn.Conv2d(2, 2, 3, (1, 2), 1),
        nn.Conv2d(2, 2, 3, 1, (1, 0)),
        nn.Conv2d(2, 2, 4, 1, "same"),  # padded unevenly by torch
        nn.Conv2d(2, 2, 3, 1, "same", dilation=2),
        nn.Conv2d(2, 2, 3, 1, 1, dilation=2),
        nn.Conv2d(2, 2, 3, 1, 1, padding_mode="circular"),
    ):
        assert not exact_but_groups(conv), conv
    grid = grammar_grid(ZOO)
    paper = (16, 32, 64, 128, 256, 512, 1024, 2048)
    zoo = (24, 40, 48, 49, 80, 96, 112, 144, 160, 192, 196, 240, 320, 384, 480, 576, 672, 768, 960, 1152)
    assert grid["linear"] == {(("d", d),) for d in (*paper, *zoo, 1280, 1536, 3072)}
    assert grammar_grid(PAPER)["linear"] == {(("d", d),) for d in paper}
    assert (
        (("k", 3), ("s", 2), ("p", 1)) in grid["max_pool"]
        and "relu" in grid
        and "gelu" not in grammar_grid(PAPER)
    )


def test_activation_names():
    import torch.fx as fx

    model = nn.Sequential(nn.ReLU(), nn.GELU(), nn.Tanh())
    graph = fx.symbolic_trace(model)
    modules = dict(graph.named_modules())
    names = [activation_name(n, modules) for n in graph.graph.nodes if n.op == "call_module"]
    assert names == ["relu", "gelu", None]
    traced = fx.symbolic_trace(Fn(lambda m, x: F.silu(x.relu())))
    calls = [n for n in traced.graph.nodes if n.op in ("call_function", "call_method")]
    assert [activation_name(n, {}) for n in calls] == ["relu", "silu"]

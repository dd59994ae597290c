"""Grouped convolution and squeeze-and-excitation in the `einspace_zoo` grammar (issue 25): each
against plain torch with hand-counted parameters and FLOPs, where it cannot apply, and imported
from blocks written after ResNeXt, SENet and EfficientNet (torchvision's SqueezeExcitation) in
plain torch: the grammar's terminal, the model's weights, the same outputs."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from test_import_zoo import assert_terminal_matches
from torch import nn

from einspace import load_grammar
from einspace.errors import Infeasible
from einspace.network.importer import ModelImportError, import_model
from einspace.ops import get_op
from einspace.state import input_state
from einspace.tree import pretty

ZOO = load_grammar("einspace_zoo")

pytestmark = pytest.mark.usefixtures("one_thread")


def _grouped(module: nn.Module, x: torch.Tensor, g: int, s: int, p: int) -> torch.Tensor:
    return F.conv2d(x, module.weight, module.bias, s, p, groups=g)


def _squeeze_excite(module: nn.Module, x: torch.Tensor, act) -> torch.Tensor:
    """SENet's formula with matrix products: no convolution, no torch module."""
    c, d = x.shape[1], module.fc1.out_channels
    w1, b1 = module.fc1.weight.reshape(d, c), module.fc1.bias
    w2, b2 = module.fc2.weight.reshape(c, d), module.fc2.bias
    s = x.mean((2, 3))
    gate = torch.sigmoid(act(s @ w1.T + b1) @ w2.T + b2)
    return x * gate[:, :, None, None]


#: (operation, arguments, input shape, the plain-torch computation, parameters, FLOPs per sample)
TERMINALS = [
    # C·(C/g)·k² + C parameters; (2·(C/g)·k² + 1) FLOPs per output element
    (
        "grouped_conv",
        {"g": 2, "k": 3, "s": 1, "p": 1},
        (4, 6, 6),
        lambda m, x: _grouped(m, x, 2, 1, 1),
        76,
        37 * 144,
    ),
    (
        "grouped_conv",
        {"g": 4, "k": 3, "s": 2, "p": 1},
        (8, 8, 8),
        lambda m, x: _grouped(m, x, 4, 2, 1),
        152,
        37 * 128,
    ),
    (
        "grouped_conv",
        {"g": 1, "k": 3, "s": 1, "p": 1},
        (2, 4, 4),
        lambda m, x: _grouped(m, x, 1, 1, 1),
        38,
        37 * 32,
    ),
    # 2·C·d + d + C parameters (d = C/r); 2·numel + (4·C·d + d + C) + act·d + 4·C FLOPs
    (
        "squeeze_excite",
        {"r": 4, "act": "relu"},
        (8, 5, 5),
        lambda m, x: _squeeze_excite(m, x, F.relu),
        42,
        508,
    ),
    (
        "squeeze_excite",
        {"r": 24, "act": "silu"},
        (24, 3, 3),
        lambda m, x: _squeeze_excite(m, x, F.silu),
        73,
        653,
    ),
]


@pytest.mark.parametrize(
    "name,args,shape,reference,params,flops", TERMINALS, ids=[f"{t[0]}-{i}" for i, t in enumerate(TERMINALS)]
)
def test_terminal_computes_what_plain_torch_does(name, args, shape, reference, params, flops):
    assert_terminal_matches(name, args, shape, reference, params, flops)


@pytest.mark.parametrize(
    "name,args,shape,why",
    [
        ("grouped_conv", {"g": 3, "k": 3, "s": 1, "p": 1}, (4, 6, 6), "3 groups do not divide 4 channels"),
        ("grouped_conv", {"g": 2, "k": 3, "s": 1, "p": 1}, (6, 8), "needs im mode"),
        ("grouped_conv", {"g": 2, "k": 3, "s": 1, "p": 2}, (4, 6, 6), "more than half"),
        ("squeeze_excite", {"r": 16, "act": "relu"}, (8, 4, 4), "r = 16 does not divide 8 channels"),
        ("squeeze_excite", {"r": 4, "act": "relu"}, (8, 16), "needs im mode"),
    ],
)
def test_where_they_cannot_apply(name, args, shape, why):
    with pytest.raises(Infeasible, match=why):
        get_op(name).transfer((input_state(shape),), args)


def test_squeeze_excite_takes_only_its_activations():
    from einspace.errors import EinspaceError
    from einspace.seeds.architectures import op

    assert op("squeeze_excite", r=4, act="silu").args == (("r", 4), ("act", "silu"))
    with pytest.raises(EinspaceError, match="must be one of relu, silu"):
        op("squeeze_excite", r=4, act="gelu")


# ----------------------------------------------------------------------------- import


class ResNeXtBlock(nn.Module):
    """ResNeXt's bottleneck: 1×1, 3×3 in 32 groups (bias-free, BatchNorm), a residual where the
    shape allows."""

    def __init__(self, c: int = 64, stride: int = 1):
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(c, c, 1, bias=False), nn.BatchNorm2d(c)
        self.conv2 = nn.Conv2d(c, c, 3, stride, 1, groups=32, bias=False)
        self.bn2 = nn.BatchNorm2d(c)
        self.relu = nn.ReLU(inplace=True)
        self.residual = stride == 1

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.bn2(self.conv2(self.relu(self.bn1(self.conv1(x)))))
        return self.relu(x + y if self.residual else y)


class SqueezeExcitation(nn.Module):
    """torchvision's SqueezeExcitation (ops/misc.py), by its structure: pool, fc1, act, fc2,
    sigmoid module, scale * input."""

    def __init__(self, channels: int, squeeze: int, activation=nn.ReLU, gate=nn.Sigmoid):
        super().__init__()
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc1, self.fc2 = nn.Conv2d(channels, squeeze, 1), nn.Conv2d(squeeze, channels, 1)
        self.activation, self.scale_activation = activation(), gate()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scale = self.scale_activation(self.fc2(self.activation(self.fc1(self.avgpool(x)))))
        return scale * x


class MBConv(nn.Module):
    """EfficientNet's block: 1×1 expansion by 4, 3×3 depthwise, SE with SiLU squeezing to the
    block's input / 4, 1×1 projection, a residual."""

    def __init__(self, c: int = 16):
        super().__init__()
        wide = 4 * c
        self.block = nn.Sequential(
            nn.Conv2d(c, wide, 1, bias=False),
            nn.BatchNorm2d(wide),
            nn.SiLU(),
            nn.Conv2d(wide, wide, 3, 1, 1, groups=wide, bias=False),
            nn.BatchNorm2d(wide),
            nn.SiLU(),
            SqueezeExcitation(wide, c // 4, nn.SiLU),
            nn.Conv2d(wide, c, 1, bias=False),
            nn.BatchNorm2d(c),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.block(x)


class SENetGate(nn.Module):
    """SENet's gate with linear layers on the pooled vector, reshaped back to [B, C, 1, 1]."""

    def __init__(self, c: int = 32, r: int = 16):
        super().__init__()
        self.fc = nn.Sequential(
            nn.Linear(c, c // r), nn.ReLU(inplace=True), nn.Linear(c // r, c), nn.Sigmoid()
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, c = x.shape[:2]
        y = self.fc(x.mean((2, 3))).view(b, c, 1, 1)
        return x * y.expand_as(x)


def _randomised(model: nn.Module) -> nn.Module:
    """Random weights and running statistics, so that no layer is an identity by its init."""
    generator = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for tensor in (*model.parameters(), *model.buffers()):
            if tensor.is_floating_point():
                tensor.copy_(torch.rand(tensor.shape, generator=generator) + 0.5)
    return model.eval()


@pytest.mark.parametrize(
    "model,shape,terminal",
    [
        (ResNeXtBlock(), (64, 8, 8), "grouped_conv(g=32, k=3, s=1, p=1)"),
        (ResNeXtBlock(stride=2), (64, 8, 8), "grouped_conv(g=32, k=3, s=2, p=1)"),
        (MBConv(), (16, 6, 6), "squeeze_excite(r=16, act=silu)"),
        (SENetGate(), (32, 4, 4), "squeeze_excite(r=16, act=relu)"),
        (SqueezeExcitation(48, 2), (48, 3, 3), "squeeze_excite(r=24, act=relu)"),
        (
            nn.Sequential(nn.Conv2d(8, 8, 5, padding="same", groups=8)),
            (8, 6, 6),
            "depthwise_conv(k=5, s=1, p=2)",
        ),
        (nn.Sequential(nn.Conv2d(4, 16, 3, padding="same")), (4, 6, 6), "im2col(k=3, s=1, p=1)"),
        (nn.Sequential(nn.Conv2d(4, 16, 2, stride=2, padding="valid")), (4, 6, 6), "im2col(k=2, s=2, p=0)"),
    ],
    ids=["resnext", "resnext-stride-2", "mbconv-se", "senet-linear", "se-r24", "same-5", "same-3", "valid"],
)
def test_blocks_import_exactly_with_their_weights(model, shape, terminal):
    model = _randomised(model)
    imported = import_model(model, input_state(shape), ZOO)
    assert imported.substitutions == ()
    assert terminal in pretty(imported.tree)
    network = imported.network(ZOO).double().eval()
    x = torch.randn(2, *shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    with torch.no_grad():
        torch.testing.assert_close(network(x), model.double()(x))


def test_padding_same_of_an_even_kernel_is_uneven_and_substituted():
    """torch pads an even kernel's "same" by one more on the right and bottom: no grid convolution."""
    with pytest.raises(ModelImportError, match=r"a 4x4 stride-1 convolution, padding same.*not in grammar"):
        model = nn.Sequential(nn.Conv2d(4, 16, 4, padding="same"))
        import_model(_randomised(model), input_state((4, 6, 6)), ZOO)


def test_without_the_zoo_grammar_a_grouped_convolution_is_substituted():
    with pytest.raises(ModelImportError, match="groups 32.*not in grammar"):
        import_model(_randomised(ResNeXtBlock()), input_state((64, 8, 8)))


@pytest.mark.parametrize(
    "model,shape,message",
    [
        (
            SqueezeExcitation(32, 3),
            (32, 4, 4),
            r"a squeeze of 32 channels to 3 is not C / r for the grammar's r in \[4, 16, 24\]",
        ),
        (SqueezeExcitation(32, 8, gate=nn.Hardsigmoid), (32, 4, 4), "only as squeeze-and-excitation"),
        (SqueezeExcitation(32, 8, activation=nn.GELU), (32, 4, 4), "only as squeeze-and-excitation"),
    ],
    ids=["width-off-grid", "hardsigmoid-gate", "gelu-inside"],
)
def test_gates_the_grammar_cannot_say_are_located(model, shape, message):
    with pytest.raises(ModelImportError, match=message) as raised:
        import_model(_randomised(model), input_state(shape), ZOO)
    assert f"{__file__}:" in str(raised.value)

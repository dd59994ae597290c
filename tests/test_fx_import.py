"""Import: a plain PyTorch model, traced with torch.fx, becomes the tree that computes it.

The yardstick is independent of the importer: the hand-written models of the bundled seeds
(`einspace.testing.reference_models`) must import to the bundled seed trees, and the compiled
tree with the imported weights must compute what the model computes (float64, train and eval).
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from einspace import check_tree, compile_network, load_grammar, parse_tree
from einspace.cli import main
from einspace.errors import EinspaceError
from einspace.network.export import load_weights
from einspace.network.importer import ImportedModel, ModelImportError, import_model, load_factory
from einspace.seeds import architectures as arch
from einspace.seeds import load_seed
from einspace.state import input_state
from einspace.testing.reference_models import MLPMixer, reference
from einspace.tree import Node, Nonterminal, Parallel, Repeat, load_tree

PAPER = load_grammar("einspace")
HERE = Path(__file__).name


pytestmark = pytest.mark.usefixtures("one_thread")


def sequence_form(node: Node) -> Node:
    """The tree with every sequence flattened and re-nested to the right: `M -> M M` is
    associative, so trees that differ only in how their sequences are grouped compute the same
    function and have the same form here. (The importer groups as the model nests its
    submodules, a seed as its builder nests `seq` calls.)"""

    def items(n: Node) -> list[Node]:
        if _is_sequence(n):
            return items(n.children[0]) + items(n.children[1])
        return [sequence_form(n)]

    if isinstance(node, Nonterminal):
        if _is_sequence(node):
            return Nonterminal(node.symbol, arch.seq(*items(node)).children)
        return Nonterminal(node.symbol, tuple(sequence_form(c) for c in node.children))
    if isinstance(node, Parallel):
        return Parallel(tuple(sequence_form(c) for c in node.children))
    if isinstance(node, Repeat):
        return Repeat(sequence_form(node.child), node.times)
    return node


def _is_sequence(node: Node) -> bool:
    return (
        isinstance(node, Nonterminal)
        and len(node.children) == 2
        and all(isinstance(c, Nonterminal) and c.symbol == "M" for c in node.children)
    )


def assert_same_function(model: nn.Module, imported: ImportedModel, batch: int = 2, added: int = 0) -> None:
    """The compiled tree with the imported weights computes what the model does, float64, eval
    then train mode (batch statistics; running statistics are updated alike); it has `added`
    parameters more (the zero biases of layers without one)."""
    network = imported.network(PAPER).double()
    model = model.double()
    x = torch.randn(
        batch, *imported.input.shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64
    )
    assert sum(p.numel() for p in network.parameters()) == sum(p.numel() for p in model.parameters()) + added
    for train in (False, True):
        network.train(train)
        model.train(train)
        with torch.no_grad():
            torch.testing.assert_close(network(x), model(x))


# ----------------------------------------------------------------------------- the seeds' models

#: Seed name -> an input its bundled tree fits (the MLP-Mixer's token MLP is sized for 256 patches).
SEED_INPUTS = {
    "resnet18": (3, 16, 16),
    "resnet_small": (3, 16, 16),
    "wide_resnet16_4": (3, 16, 16),
    "densenet": (3, 16, 16),
    "vit": (3, 16, 16),
    "mlp_mixer": (3, 64, 64),
}


@pytest.mark.parametrize("name", sorted(SEED_INPUTS))
def test_reference_model_imports_to_the_bundled_seed(name):
    """Equal up to the grouping of sequences; and the same function, except for the 8-layer
    MLP-Mixer at 64×64 (run in the slow test; a 2-layer one is checked below)."""
    x = input_state(SEED_INPUTS[name])
    model = reference(name, SEED_INPUTS[name])
    imported = import_model(model, x)
    assert imported.substitutions == ()
    assert imported.classes == 10
    assert sequence_form(imported.tree) == sequence_form(load_seed(name, PAPER, x))
    if name != "mlp_mixer":
        assert_same_function(model, imported)


def test_small_mixer_imports_and_computes_the_same():
    x = input_state((3, 16, 16))
    model = MLPMixer(3, tokens=16, layers=2, width=64)
    imported = import_model(model, x)
    assert sequence_form(imported.tree) == sequence_form(arch.mlp_mixer(layers=2, width=64, tokens=16))
    assert_same_function(model, imported)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(SEED_INPUTS))
def test_reference_model_at_full_size_computes_the_same(name):
    x = input_state((3, 64, 64))
    model = reference(name, (3, 64, 64))
    assert_same_function(model, import_model(model, x), batch=2)


# ----------------------------------------------------------------------------- a torchvision ResNet-18


class BasicBlock(nn.Module):
    """torchvision's basic block: convolutions without bias, ReLU, a 1×1 downsampling shortcut."""

    def __init__(self, c: int, d: int, stride: int = 1):
        super().__init__()
        self.conv1 = nn.Conv2d(c, d, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(d)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(d, d, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(d)
        self.downsample = None
        if stride != 1 or c != d:
            self.downsample = nn.Sequential(nn.Conv2d(c, d, 1, stride, bias=False), nn.BatchNorm2d(d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        if self.downsample is not None:
            identity = self.downsample(x)
        out += identity
        return self.relu(out)


class TorchvisionResNet18(nn.Module):
    """torchvision's ResNet-18 layout: 7×7 stride-2 stem, max-pool, four stages, average pool,
    flatten, fc; `cifar` gives the 3×3 stride-1 stem that the paper's seed starts with."""

    def __init__(self, classes: int = 10, cifar: bool = False):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 64, 3, 1, 1, bias=False) if cifar else nn.Conv2d(3, 64, 7, 2, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
        stages, c = [], 64
        for i, d in enumerate((64, 128, 256, 512)):
            stages.append(nn.Sequential(BasicBlock(c, d, 1 if i == 0 else 2), BasicBlock(d, d)))
            c = d
        self.layer1, self.layer2, self.layer3, self.layer4 = stages
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(512, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


def test_torchvision_resnet18_needs_the_max_pool_substituted():
    x = input_state((3, 64, 64))
    with pytest.raises(ModelImportError) as caught:
        import_model(TorchvisionResNet18(), x)
    message = str(caught.value)
    assert f"{HERE}:" in message and "module `maxpool` (MaxPool2d" in message
    assert "self.maxpool(" in message and "\n" + " " * 4 in message  # the source line, a caret below
    assert "closest expressible: a 3x3 stride-2 convolution to 64 channels" in message
    assert "ReLU is not in grammar" in message and "closest expressible: leaky_relu" in message
    assert "a 7x7 stride-2 convolution" in message
    assert "substitute=True" in message


def test_torchvision_resnet18_with_substitutes_reports_them_and_keeps_the_weights():
    model = TorchvisionResNet18()
    x = input_state((3, 64, 64))
    imported = import_model(model, x, substitute=True)
    report = "\n".join(imported.substitutions)
    assert "MaxPool2d (kernel 3, stride 2, padding 1)" in report and "module `maxpool`" in report
    check_tree(imported.tree, PAPER, x)
    network = imported.network(PAPER)
    weights = {tuple(t.shape): t for t in network.state_dict().values()}
    for conv in (model.layer1[0].conv1, model.layer4[1].conv2, model.layer3[0].downsample[0]):
        flat = conv.weight.reshape(conv.out_channels, -1)
        assert any(torch.equal(flat, t) for t in network.state_dict().values() if t.shape == flat.shape)
        assert tuple(flat.shape) in weights
    torch.testing.assert_close(network.head.linear.weight, model.fc.weight)


def test_torchvision_resnet18_with_the_cifar_stem_is_the_paper_seed():
    """The paper's seed replaces the max-pool by a stride-2 convolution (App. B.1), and leaky ReLU
    is the grammar's activation: with those two substitutions the model is the seed."""
    x = input_state((3, 32, 32))
    imported = import_model(TorchvisionResNet18(cifar=True), x, substitute=True)
    assert len(imported.substitutions) == 2
    assert sequence_form(imported.tree) == sequence_form(load_seed("resnet18", PAPER, x))


# ----------------------------------------------------------------------------- exact by construction


class ManualAttention(nn.Module):
    """Single-head attention written out: separate q, k, v, softmax(q kᵀ / √d) v."""

    def __init__(self, width: int, d: int):
        super().__init__()
        self.q, self.k, self.v = nn.Linear(width, d), nn.Linear(width, d), nn.Linear(width, d)
        self.d = d

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scores = (self.q(x) @ self.k(x).transpose(-2, -1)) * self.d**-0.5
        return scores.softmax(dim=-1) @ self.v(x)


class TimmStyleAttention(nn.Module):
    """Multi-head attention as timm writes it: one qkv projection reshaped and unbound into
    heads, identity q/k norms, dropouts of 0, an output projection."""

    def __init__(self, width: int, heads: int):
        super().__init__()
        self.heads, self.head_dim = heads, width // heads
        self.qkv = nn.Linear(width, 3 * width)
        self.q_norm, self.k_norm = nn.Identity(), nn.Identity()
        self.attn_drop = nn.Dropout(0.0)
        self.proj = nn.Linear(width, width)
        self.proj_drop = nn.Dropout(0.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, c = x.shape
        qkv = self.qkv(x).reshape(b, n, 3, self.heads, self.head_dim).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)
        q, k = self.q_norm(q), self.k_norm(k)
        x = F.scaled_dot_product_attention(q, k, v, dropout_p=self.attn_drop.p if self.training else 0.0)
        return self.proj_drop(self.proj(x.transpose(1, 2).reshape(b, n, c)))


class Tokens(nn.Module):
    """Patch embedding (conv, flatten, transpose), an attention, a residual MLP; mean-pooled head."""

    def __init__(self, attention: nn.Module, width: int):
        super().__init__()
        self.embed = nn.Conv2d(3, width, 4, 4)
        self.attention = attention
        self.mlp = nn.Sequential(nn.Linear(width, 2 * width), nn.LeakyReLU(), nn.Linear(2 * width, width))
        self.head = nn.Linear(width, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.embed(x).flatten(2).transpose(1, 2)
        x = self.attention(x)
        x = x + self.mlp(x)
        return self.head(x.mean(dim=1))


ATTENTIONS = [
    (ManualAttention(32, 32), 32, arch.attention_head(32)),
    (TimmStyleAttention(64, 4), 64, arch.multi_head_attention(4, 16, 64)),
]


@pytest.mark.parametrize("attention,width,expected", ATTENTIONS, ids=["written_out", "timm_style"])
def test_attention_imports_to_the_grammar_attention(attention, width, expected):
    model = Tokens(attention, width)
    x = input_state((3, 16, 16))
    imported = import_model(model, x)
    tree = arch.network(
        arch.seq(arch.patch_embed(width, 4), expected, arch.residual(arch.mlp(2 * width, width)))
    )
    assert sequence_form(imported.tree) == sequence_form(tree)
    assert_same_function(model, imported)


class ConvNet(nn.Module):
    """Convolutions without bias (a zero bias in the tree), a pre-activation residual, a
    concatenation, and a head of adaptive pooling and flatten."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(2, 16, 3, 1, 1, bias=False)
        self.norm = nn.BatchNorm2d(16)
        self.branch = nn.Conv2d(16, 16, 1, bias=False)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(32, 3, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.leaky_relu(self.norm(self.conv(x)), 0.01)
        x = torch.cat([self.branch(x) + x, x], dim=1)
        return self.fc(self.pool(x).flatten(1))


def test_conv_net_without_biases_computes_the_same():
    model = ConvNet()
    x = input_state((2, 8, 8))
    imported = import_model(model, x)
    assert imported.classes == 3
    assert_same_function(model, imported, added=16 + 16 + 3)


def test_a_model_without_the_paper_head_imports_as_a_backbone():
    model = nn.Sequential(nn.Conv2d(3, 16, 3, 1, 1), nn.BatchNorm2d(16), nn.LeakyReLU(0.01))
    x = input_state((3, 8, 8))
    imported = import_model(model, x)
    assert imported.classes is None
    assert_same_function(model, imported)


# ----------------------------------------------------------------------------- what cannot be imported


class Lambda(nn.Module):
    """A model from a function (and its layers), so each bad input below is one line."""

    def __init__(self, forward, **layers: nn.Module):
        super().__init__()
        self.layers = nn.ModuleDict(layers)
        self.function = forward

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.function(self.layers, x)


TOKENS, IMAGE = (16, 32), (16, 8, 8)

#: (model, input shape, substitute, message fragments): every kind of problem has a tested message.
BAD_MODELS = [
    (Lambda(lambda m, x: F.gelu(x)), TOKENS, False, ["function gelu", "closest expressible: leaky_relu"]),
    (
        Lambda(lambda m, x: m["lin"](x), lin=nn.Linear(8, 8)),
        IMAGE,
        False,
        ["nn.Linear on a tensor of rank 4"],
    ),
    (Lambda(lambda m, x: x.softmax(dim=1)), TOKENS, False, ["softmax over axis 1"]),
    (
        Lambda(lambda m, x: m["lin"](m["lin"](x)), lin=nn.Linear(32, 32)),
        TOKENS,
        False,
        ["module `layers.lin`", "called twice", "weights would be shared"],
    ),
    (
        Lambda(lambda m, x: torch.cat([x, x, x], dim=2)),
        TOKENS,
        False,
        ["concat(dim=2, b=3) is not in the grammar's grid"],
    ),
    (Lambda(lambda m, x: x.reshape(x.shape[0], -1, 8)), TOKENS, False, ["is not a routing of the grammar"]),
    (Lambda(lambda m, x: x * 2.0), TOKENS, False, ["mul has no counterpart in the grammar"]),
    (
        Lambda(lambda m, x: m["conv"](x), conv=nn.Conv2d(16, 16, 5, 1, 2)),
        IMAGE,
        False,
        ["a 5x5 stride-1 convolution", "closest expressible: a 3x3 stride-1 convolution to 16 channels"],
    ),
    (
        Lambda(lambda m, x: m["lin"](x), lin=nn.Linear(32, 100)),
        TOKENS,
        False,
        ["width 100 (the output features)", "width 128"],
    ),
    (Lambda(lambda m, x: (x, x)), TOKENS, False, ["the model must return one tensor"]),
    (
        Lambda(lambda m, x: F.scaled_dot_product_attention(x, x, x, is_causal=True)),
        TOKENS,
        False,
        ["causal"],
    ),
    (Lambda(lambda m, x: x[:, 0]), TOKENS, False, ["is not a routing of the grammar"]),
]


@pytest.mark.parametrize("model,shape,substitute,fragments", BAD_MODELS, ids=range(len(BAD_MODELS)))
def test_what_the_grammar_cannot_express_is_located(model, shape, substitute, fragments):
    with pytest.raises(ModelImportError) as caught:
        import_model(model, input_state(shape), substitute=substitute)
    message = str(caught.value)
    for fragment in fragments:
        assert fragment in message, message
    if "must return" not in message:
        assert f"{HERE}:" in message, message  # at this file's line, where the model does it


def test_substitutes_are_used_when_asked_for_and_listed():
    model = Lambda(lambda m, x: F.gelu(m["lin"](x)), lin=nn.Linear(32, 100))
    imported = import_model(model, input_state(TOKENS), substitute=True)
    assert len(imported.substitutions) == 2
    assert imported.tree == arch.network(arch.seq(arch.linear(128), arch.act()))


def test_a_given_grammar_is_the_one_obeyed(tmp_path):
    """A grammar with narrower linear widths and no norm: widths are fitted to its grid, and an
    operation it lacks is named."""
    path = tmp_path / "narrow.pcfg"
    path.write_text("extends einspace\nC -> identity | linear(d = 16 | 32) | leaky_relu\n")
    narrow = load_grammar(str(path))
    x = input_state(TOKENS)
    model = nn.Sequential(nn.Linear(32, 64), nn.LeakyReLU(0.01))
    imported = import_model(model, x, narrow, substitute=True)
    assert "width 64 (the output features) is not in grammar" in imported.substitutions[0]
    assert imported.tree == arch.network(arch.seq(arch.linear(32), arch.act()))
    check_tree(imported.tree, narrow, x)
    with pytest.raises(ModelImportError, match="has no operation norm"):
        import_model(nn.Sequential(nn.Linear(32, 32), nn.LayerNorm(32)), x, narrow)


def test_untraceable_model_is_an_error():
    class Branchy(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x if x.sum() > 0 else -x

    with pytest.raises(ModelImportError, match="cannot trace Branchy with torch.fx"):
        import_model(Branchy(), input_state(TOKENS))


# ----------------------------------------------------------------------------- the command


def _factory_file(folder: Path) -> Path:
    path = folder / "models.py"
    path.write_text(
        "import torch\n"
        "from einspace.testing.reference_models import reference\n"
        "from test_fx_import import TorchvisionResNet18\n\n\n"
        "def small():\n    torch.manual_seed(0)\n    return reference('resnet_small', (1, 8, 8))\n\n\n"
        "def torchvision():\n    return TorchvisionResNet18()\n\n\n"
        "def not_a_model():\n    return 3\n\n\n"
        "def needs_arguments(width):\n    return None\n"
    )
    return path


def test_import_model_command_writes_the_tree_and_weights(tmp_path, capsys):
    models = _factory_file(tmp_path)
    tree_file, weights = tmp_path / "small.tree", tmp_path / "small.pt"
    argv = [
        "import-model",
        f"{models}:small",
        "--input",
        "1,8,8",
        "--out",
        str(tree_file),
        "--weights",
        str(weights),
    ]
    assert main(argv) == 0
    x = input_state((1, 8, 8))
    tree = load_tree(tree_file)
    assert tree_file.read_text().startswith("# Imported by `einspace import-model")
    assert sequence_form(tree) == sequence_form(load_seed("resnet_small", PAPER, x))
    network = compile_network(tree, x, 10, PAPER)
    load_weights(network, weights)
    model = load_factory(f"{models}:small")  # the same weights: the factory seeds torch
    inputs = torch.randn(2, 1, 8, 8)
    for train in (False, True):
        network.train(train)
        model.train(train)
        with torch.no_grad():
            torch.testing.assert_close(network(inputs), model(inputs), rtol=1e-4, atol=1e-5)
    assert "wrote" in capsys.readouterr().out


def test_import_model_command_errors_exit_2_without_a_traceback(tmp_path, capsys):
    models = _factory_file(tmp_path)
    out = str(tmp_path / "t.tree")
    assert main(["import-model", f"{models}:torchvision", "--input", "3,32,32", "--out", out]) == 2
    err = capsys.readouterr().err
    assert "MaxPool2d" in err and "--substitute" in err and "Traceback" not in err
    assert (
        main(["import-model", f"{models}:torchvision", "--input", "3,32,32", "--out", out, "--substitute"])
        == 0
    )
    assert "substituted:" in capsys.readouterr().out
    for spec, fragment in [
        (f"{models}:not_a_model", "returned a int, not an nn.Module"),
        (f"{models}:needs_arguments", "needs_arguments() failed: TypeError"),
        (f"{models}:missing", "has no callable 'missing'"),
        ("no_colon", "give the model as MODULE:FACTORY"),
        (f"{tmp_path / 'absent.py'}:x", "no file"),
    ]:
        assert main(["import-model", spec, "--input", "3,32,32", "--out", out]) == 2
        assert fragment in capsys.readouterr().err


def test_load_factory_errors_are_einspace_errors():
    with pytest.raises(EinspaceError, match="cannot import"):
        load_factory("einspace.no_such_module:f")


def test_imported_trees_parse_back(tmp_path):
    imported = import_model(reference("resnet_small", (1, 8, 8)), input_state((1, 8, 8)))
    text = imported.tree_file("test")
    body = "\n".join(line for line in text.splitlines() if not line.startswith("#"))
    assert parse_tree(body) == imported.tree
    assert math.isfinite(imported.network()(torch.zeros(1, 1, 8, 8)).sum().item())

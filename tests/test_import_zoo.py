"""Import of the models people use (issue 25): the bugs found importing torchvision- and timm-style
models, inference-time identities, forwards with optional arguments, and the `einspace_zoo`
grammar's terminals. The models are written here in plain torch, after the structure of the
published ones (no torchvision, timm or downloads)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from einspace import compile_network, load_grammar, parse_tree
from einspace.cli import main
from einspace.network.export import export_tree, load_weights
from einspace.network.importer import ModelImportError, graph, import_model
from einspace.seeds import architectures as arch
from einspace.state import input_state
from einspace.tree import load_tree, to_text

PAPER = load_grammar("einspace")
HERE = Path(__file__).name

pytestmark = pytest.mark.usefixtures("one_thread")


def same_outputs(model: nn.Module, imported, grammar=PAPER, train: tuple[bool, ...] = (False,)) -> None:
    network = imported.network(grammar).double()
    model = model.double()
    x = torch.randn(2, *imported.input.shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    for mode in train:
        network.train(mode)
        model.train(mode)
        with torch.no_grad():
            torch.testing.assert_close(network(x), model(x))


class Tokens(nn.Module):
    """A token MLP with a mean head; `before_head` stands between the mean and the classifier."""

    def __init__(self, before_head: nn.Module, width: int = 32):
        super().__init__()
        self.linear = nn.Linear(16, width)
        self.before_head = before_head
        self.fc = nn.Linear(width, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.before_head(self.linear(x).mean(1)))


# ----------------------------------------------------------------------------- bug 1: the head's weights


def test_a_substituted_last_width_gives_a_weights_file_that_loads(tmp_path, capsys):
    """Width 100 is off the grid (128 is used): the head cannot keep its weights, the weights
    file loads into the tree's network, and the report says the head's were not transferred."""
    models = tmp_path / "wide.py"
    models.write_text(
        "from torch import nn\n"
        "from test_import_zoo import Tokens\n\n\n"
        "def wide():\n    return Tokens(nn.Identity(), width=100)\n"
    )
    tree_file, weights = tmp_path / "wide.tree", tmp_path / "wide.pt"
    argv = ["import-model", f"{models}:wide", "--input", "8,16", "--out", str(tree_file)]
    assert main([*argv, "--weights", str(weights), "--substitute"]) == 0
    out = capsys.readouterr().out
    assert "weights of head.linear not transferred" in out
    network = compile_network(load_tree(tree_file), input_state((8, 16)), 10, PAPER)
    load_weights(network, weights)
    imported = import_model(Tokens(nn.Identity(), width=100), input_state((8, 16)), substitute=True)
    imported.network(PAPER)  # loads its own state_dict


# ----------------------------------------------------------------------------- bug 2: locations


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.act = nn.GELU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(x)


def test_locations_are_in_model_code_beside_torchs_folder(tmp_path, monkeypatch):
    """A package whose folder starts with torch's folder's name (as torchvision's does) is the
    user's code: only torch's own folder is skipped. The package has a name no installed one has
    (a real torchvision, imported first, would hide one called so)."""
    torch_dir = tmp_path / "torch"  # a second torch folder, beside which the model's package lies
    monkeypatch.setattr(graph, "_TORCH_DIRS", (*graph._TORCH_DIRS, str(torch_dir) + "/"))
    package = tmp_path / "torchzoo_made_here"
    package.mkdir()
    (package / "blocks.py").write_text(
        "from torch import nn\n\n\nclass Act(nn.Module):\n"
        "    def __init__(self):\n        super().__init__()\n        self.act = nn.GELU()\n\n"
        "    def forward(self, x):\n        return self.act(x)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    from torchzoo_made_here.blocks import Act  # noqa: PLC0415 - the package made above

    with pytest.raises(ModelImportError) as caught:
        import_model(Act(), input_state((8, 16)))
    assert f"{package / 'blocks.py'}:10:" in str(caught.value), str(caught.value)


def test_a_bare_sequential_is_never_located_in_einspace():
    with pytest.raises(ModelImportError) as caught:
        import_model(nn.Sequential(nn.Linear(16, 16), nn.GELU()), input_state((8, 16)))
    message = str(caught.value)
    assert "module `1` (GELU" in message
    assert "einspace/network" not in message and "super().__init__" not in message, message


def test_a_sequential_of_blocks_is_located_at_the_blocks_code():
    with pytest.raises(ModelImportError) as caught:
        import_model(nn.Sequential(nn.Linear(16, 16), Block()), input_state((8, 16)))
    assert f"{HERE}:" in str(caught.value) and "self.act(x)" in str(caught.value)


# ----------------------------------------------------------------------------- bug 3: unfold and fold


class UnfoldFold(nn.Module):
    """What export writes for an im2col whose linear is not lowered into a convolution."""

    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(27, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.unfold(x, 3, padding=1, stride=1).transpose(1, 2)
        x = x.softmax(dim=-1)
        x = self.linear(x)
        return x.transpose(1, 2).unflatten(2, (8, 8))


def test_unfold_then_fold_imports_as_im2col_and_col2im():
    model = UnfoldFold()
    imported = import_model(model, input_state((3, 8, 8)))
    expected = arch.routing(
        arch.op("im2col", k=3, s=1, p=1), arch.seq(arch.softmax(), arch.linear(16)), "col2im"
    )
    assert imported.tree == arch.network(expected)
    same_outputs(model, imported)


def test_unfold_read_raw_is_im2col_then_a_swap():
    imported = import_model(_Raw(), input_state((3, 8, 8)))
    assert "im2col(k=4, s=4, p=0)" in to_text(imported.tree) and "permute(order=(2,1))" in to_text(
        imported.tree
    )
    same_outputs(_Raw(), imported)


class _Raw(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.unfold(x, 4, stride=4).softmax(dim=-1)


SEARCHED = [
    "(S (M (R1 im2col(k=3, s=1, p=1)) (M (C identity)) (R2 col2im)) (M (C linear(d=16))))",
    "(S (M (R1 im2col(k=3, s=2, p=1)) (M (C softmax)) (R2 col2im)) (M (C linear(d=16))))",
    "(S (M (R1 im2col(k=3, s=1, p=1)) (M (C norm)) (R2 col2im)) (M (C linear(d=16))))",
    "(S (M (R1 im2col(k=4, s=4, p=0)) (M (C pos_enc)) (R2 col2im)) (M (C leaky_relu)))",
]


@pytest.mark.parametrize("text", SEARCHED, ids=range(len(SEARCHED)))
def test_export_then_import_of_searched_trees_computes_the_same(text, tmp_path):
    x = input_state((3, 8, 8))
    exported = export_tree(parse_tree(text), x, 10, PAPER, name="Net")
    model = run_exported(exported, tmp_path / "net.py")
    imported = import_model(model, x)
    assert imported.substitutions == ()
    same_outputs(model, imported, train=(False, True))


# ----------------------------------------------------------------------------- bug 4 and identities


@pytest.mark.parametrize(
    "before_head", [nn.Dropout(0.0), nn.Dropout(0.3), nn.Identity()], ids=["dropout0", "dropout", "identity"]
)
def test_inference_identities_before_the_head_are_left_out(before_head):
    model = Tokens(before_head)
    imported = import_model(model, input_state((8, 16)))
    assert imported.substitutions == () and imported.classes == 10
    assert imported.tree == arch.network(arch.seq(arch.linear(32), arch.identity()))
    same_outputs(model, imported)


class ClassToken(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(16, 32)
        self.fc = nn.Linear(32, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.linear(x)[:, 0])


def test_a_slice_before_the_head_is_named_as_the_cause():
    with pytest.raises(ModelImportError) as caught:
        import_model(ClassToken(), input_state((8, 16)))
    message = str(caught.value)
    assert "class-token pooling (the classifier reads the first token, x[:, 0])" in message, message
    assert "closest expressible: the mean over the tokens" in message and "rank 2" not in message
    assert f"{HERE}:" in message


class DropPath(nn.Module):
    """Stochastic depth as timm writes it: the identity unless training."""

    def __init__(self, p: float):
        super().__init__()
        self.p = p

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.p == 0.0 or not self.training:
            return x
        keep = x.new_empty(x.shape[0], 1, 1).bernoulli_(1 - self.p)
        return x * keep / (1 - self.p)


class Residual(nn.Module):
    def __init__(self, attn_mask_default: bool = True):
        super().__init__()
        self.linear = nn.Linear(16, 16)
        self.drop_path = DropPath(0.2)
        self.drop = nn.Dropout(0.1)

    def forward(self, x: torch.Tensor, attn_mask: torch.Tensor | None = None, scale: float = 1.0):
        if attn_mask is not None:
            x = x + attn_mask
        return x + self.drop_path(self.drop(self.linear(x))) * scale


def test_stochastic_depth_dropout_and_optional_arguments():
    """A model in training mode: traced as at inference, where stochastic depth and dropout are
    identities; `attn_mask=None` and `scale=1.0` take their defaults."""
    model = Residual().train()
    imported = import_model(model, input_state((8, 16)))
    assert imported.substitutions == ()
    assert imported.tree == arch.network(arch.residual(arch.linear(16)))
    assert model.training
    same_outputs(model, imported)


def test_a_forward_needing_a_second_tensor_is_refused():
    class TwoInputs(nn.Module):
        def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            return x + y

    with pytest.raises(ModelImportError, match="must take one tensor, not 2"):
        import_model(TwoInputs(), input_state((8, 16)))


# ----------------------------------------------------------------------------- the zoo grammar's terminals

ZOO = load_grammar("einspace_zoo")


def _reference_depthwise(module: nn.Module, x: torch.Tensor, s: int, p: int) -> torch.Tensor:
    return F.conv2d(x, module.weight, module.bias, s, p, groups=x.shape[1])


#: (operation, arguments, input shape, the plain-torch computation given the module and x,
#: parameters, FLOPs per sample).
TERMINALS = [
    ("relu", {}, (4, 6, 6), lambda m, x: torch.clamp(x, min=0), 0, 144),
    ("relu6", {}, (4, 6, 6), lambda m, x: torch.clamp(x, 0, 6), 0, 288),
    ("gelu", {}, (8, 12), lambda m, x: 0.5 * x * (1 + torch.erf(x / 2**0.5)), 0, 768),
    ("silu", {}, (8, 12), lambda m, x: x * torch.sigmoid(x), 0, 384),
    ("hardswish", {}, (4, 6, 6), lambda m, x: x * torch.clamp(x + 3, 0, 6) / 6, 0, 576),
    ("dropout", {"p": 0.5}, (8, 12), lambda m, x: x, 0, 96),
    ("layer_scale", {}, (8, 12), lambda m, x: torch.einsum("bsd,d->bsd", x, m.weight.flatten()), 12, 96),
    (
        "channel_norm",
        {},
        (4, 3, 5),
        lambda m, x: F.layer_norm(x.movedim(1, -1), (4,), m.weight, m.bias, 1e-6).movedim(-1, 1),
        8,
        240,
    ),
    ("layer_scale", {}, (4, 6, 6), lambda m, x: torch.einsum("bchw,c->bchw", x, m.weight.flatten()), 4, 144),
    ("max_pool", {"k": 3, "s": 2, "p": 1}, (4, 9, 9), lambda m, x: F.max_pool2d(x, 3, 2, 1), 0, 8 * 4 * 25),
    ("max_pool", {"k": 2, "s": 2, "p": 0}, (4, 8, 8), lambda m, x: F.max_pool2d(x, 2), 0, 3 * 4 * 16),
    ("avg_pool", {"k": 3, "s": 1, "p": 1}, (4, 5, 7), lambda m, x: F.avg_pool2d(x, 3, 1, 1), 0, 9 * 4 * 35),
    (
        "depthwise_conv",
        {"k": 3, "s": 2, "p": 1},
        (4, 8, 8),
        lambda m, x: _reference_depthwise(m, x, 2, 1),
        4 * 10,
        19 * 4 * 16,
    ),
    (
        "depthwise_conv",
        {"k": 7, "s": 1, "p": 3},
        (3, 8, 8),
        lambda m, x: _reference_depthwise(m, x, 1, 3),
        3 * 50,
        99 * 3 * 64,
    ),
]


@pytest.mark.parametrize(
    "name,args,shape,reference,params,flops", TERMINALS, ids=[f"{t[0]}-{i}" for i, t in enumerate(TERMINALS)]
)
def test_zoo_terminal_computes_what_plain_torch_does(name, args, shape, reference, params, flops):
    assert_terminal_matches(name, args, shape, reference, params, flops)


def assert_terminal_matches(name, args, shape, reference, params, flops) -> None:
    """A terminal's module against its plain-torch `reference` (random parameters: no zero bias or
    unit scale hides a missing term), its output shape against the shape rule, and its analytic
    parameter and FLOP counts against the hand counts (`tests/test_import_zoo_blocks.py` too)."""
    from einspace.ops import get_op

    op, state = get_op(name), input_state(shape)
    (out,) = op.transfer((state,), args)
    module = op.build((state,), args).double().eval()
    for parameter in module.parameters():
        torch.nn.init.normal_(parameter, generator=torch.Generator().manual_seed(2))
    x = torch.randn(2, *shape, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    with torch.no_grad():
        y = module(x)
        torch.testing.assert_close(y, reference(module, x))
    assert tuple(y.shape[1:]) == out.shape
    assert sum(p.numel() for p in module.parameters()) == op.param_count((state,), args) == params
    assert op.flops((state,), args) == flops


def run_exported(exported, path):
    """The exported file, written to `path` and executed: its network with the exported weights."""
    path.write_text(exported.source)
    namespace: dict = {}
    exec(compile(exported.source, str(path), "exec"), namespace)
    model = namespace["Net"]()
    model.load_state_dict(exported.state_dicts["Net"])
    return model


@pytest.mark.parametrize("shape", [(8, 12), (4, 6, 6)])
def test_layer_scale_starts_at_a_tenth(shape):
    from einspace.ops import get_op

    module = get_op("layer_scale").build((input_state(shape),), {})
    x = torch.randn(2, *shape)
    torch.testing.assert_close(module(x), x * 0.1)


def test_dropout_acts_in_training():
    from einspace.ops import get_op

    module = get_op("dropout").build((input_state((8, 12)),), {"p": 0.5}).train()
    x = torch.ones(4, 8, 12)
    y = module(x)
    assert set(y.unique().tolist()) <= {0.0, 2.0} and 0 < (y == 0).sum() < y.numel()


@pytest.mark.parametrize(
    "name,shape", [("max_pool", (8, 12)), ("depthwise_conv", (8, 12)), ("avg_pool", (4, 2, 2))]
)
def test_windows_need_an_image_that_fits(name, shape):
    from einspace.errors import Infeasible
    from einspace.ops import get_op

    with pytest.raises(Infeasible):
        get_op(name).transfer((input_state(shape),), {"k": 3, "s": 2, "p": 0})
    with pytest.raises(Infeasible, match="more than half"):
        get_op(name).transfer((input_state((4, 8, 8)),), {"k": 3, "s": 1, "p": 2})


CONV16 = "(M (R1 im2col(k=3, s=1, p=1)) (M (C linear(d=16))) (R2 col2im))"
ZOO_TREES = [
    f"(S {CONV16} (M (M (C relu)) (M (M (C max_pool(k=3, s=2, p=1))) (M (C dropout(p=0.5))))))",
    f"(S {CONV16} (M (M (C relu6)) (M (M (C depthwise_conv(k=5, s=2, p=2))) (M (C hardswish)))))",
    f"(S {CONV16} (M (M (C silu)) (M (C avg_pool(k=2, s=2, p=0)))))",
    "(S (M (R1 im2col(k=4, s=4, p=0)) (M (C linear(d=32))) (R2 identity)) (M (C gelu)))",
    "(S (M (R1 im2col(k=7, s=2, p=3)) (M (C linear(d=16))) (R2 col2im)) (M (C relu)))",
    f"(S {CONV16} (M (C channel_norm)))",
    f"(S {CONV16} (M (M (C grouped_conv(g=4, k=3, s=2, p=1))) (M (C squeeze_excite(r=4, act=silu)))))",
    f"(S {CONV16} (M (M (C squeeze_excite(r=16, act=relu))) (M (C grouped_conv(g=2, k=3, s=1, p=1)))))",
    f"(S {CONV16} (M (M (C layer_scale)) (M (R1 im2col(k=1, s=1, p=0)) (M (C layer_scale)) (R2 identity))))",
    f"(S {CONV16} (M (M (C affine)) (M (R1 im2col(k=1, s=1, p=0)) (M (C affine)) (R2 identity))))",
]


@pytest.mark.parametrize("text", ZOO_TREES, ids=range(len(ZOO_TREES)))
def test_zoo_trees_export_and_import_back(text, tmp_path):
    """Exported: runs with torch alone, computes what the compiled network does (eval); imported
    back with the zoo grammar: the same tree (up to sequence grouping), the same outputs."""
    from test_fx_import import sequence_form

    x = input_state((3, 16, 16))
    tree = parse_tree(text)
    network = compile_network(tree, x, 10, ZOO).eval()
    exported = export_tree(tree, x, 10, ZOO, name="Net", network=network)
    assert "einspace" not in exported.source.replace("einspace (`einspace export`)", "").replace(
        "einspace is not needed", ""
    )
    model = run_exported(exported, tmp_path / "net.py")
    inputs = torch.randn(2, 3, 16, 16)
    with torch.no_grad():
        torch.testing.assert_close(model.eval()(inputs), network(inputs))
    imported = import_model(model, x, ZOO)
    assert imported.substitutions == ()
    assert to_text(sequence_form(imported.tree)) == to_text(sequence_form(tree))
    same_outputs(model, imported, ZOO)


# ----------------------------------------------------------------------------- models of the zoo's structure


class VGGLike(nn.Module):
    """VGG's pattern: 3×3 convolutions with ReLU, 2×2 max-pools; a dropout before the classifier."""

    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 16, 3, padding=1),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(2, 2),
            nn.Conv2d(16, 32, 3, padding=1),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(kernel_size=2, stride=2),
        )
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.classifier = nn.Sequential(nn.Dropout(0.5), nn.Linear(32, 10))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(torch.flatten(self.avgpool(self.features(x)), 1))


class InvertedResidual(nn.Module):
    """MobileNetV2's block: 1×1 expansion, 3×3 depthwise, 1×1 projection, BatchNorm and ReLU6,
    convolutions without bias; a residual where the shape allows."""

    def __init__(self, c: int, expand: int, stride: int):
        super().__init__()
        hidden = c * expand
        self.use_res_connect = stride == 1
        self.conv = nn.Sequential(
            nn.Conv2d(c, hidden, 1, bias=False),
            nn.BatchNorm2d(hidden),
            nn.ReLU6(inplace=True),
            nn.Conv2d(hidden, hidden, 3, stride, 1, groups=hidden, bias=False),
            nn.BatchNorm2d(hidden),
            nn.ReLU6(inplace=True),
            nn.Conv2d(hidden, c, 1, bias=False),
            nn.BatchNorm2d(c),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.conv(x) if self.use_res_connect else self.conv(x)


class MobileNetLike(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, 2, 1, bias=False), nn.BatchNorm2d(16), nn.ReLU6())
        self.blocks = nn.Sequential(InvertedResidual(16, 4, 1), InvertedResidual(16, 2, 2))
        self.classifier = nn.Sequential(nn.Dropout(0.2), nn.Linear(16, 10))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.blocks(self.stem(x))
        return self.classifier(nn.functional.adaptive_avg_pool2d(x, 1).flatten(1))


class MixerBlock(nn.Module):
    """timm's Mixer block: token and channel MLPs with GELU and Dropout(0.0), pre-norm residuals."""

    def __init__(self, tokens: int, width: int):
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.tokens = nn.Sequential(nn.Linear(tokens, 32), nn.GELU(), nn.Dropout(0.0), nn.Linear(32, tokens))
        self.channels = nn.Sequential(nn.Linear(width, 64), nn.GELU(), nn.Dropout(0.0), nn.Linear(64, width))
        self.drop_path = nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.drop_path(self.tokens(self.norm1(x).transpose(1, 2)).transpose(1, 2))
        return x + self.drop_path(self.channels(self.norm2(x)))


class MixerLike(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 32, 4, 4)
        self.blocks = nn.Sequential(MixerBlock(16, 32), MixerBlock(16, 32))
        self.norm = nn.LayerNorm(32)
        self.head_drop = nn.Dropout(0.0)
        self.head = nn.Linear(32, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.blocks(self.stem(x).flatten(2).transpose(1, 2))
        return self.head(self.head_drop(self.norm(x).mean(dim=1)))


ZOO_MODELS = [
    (VGGLike, (3, 16, 16), 0),
    (MobileNetLike, (3, 16, 16), 16 + (64 + 64 + 16) + (32 + 32 + 16)),
    (MixerLike, (3, 16, 16), 0),
]


@pytest.mark.parametrize("factory,shape,added", ZOO_MODELS, ids=[m[0].__name__ for m in ZOO_MODELS])
def test_zoo_models_import_exactly_with_their_weights(factory, shape, added):
    """No substitution with the zoo grammar, the same outputs with the model's weights; the
    paper's grammar needs substitutions. (`added`: zero biases of convolutions without one.)"""
    torch.manual_seed(0)
    model = factory()
    x = input_state(shape)
    imported = import_model(model, x, ZOO)
    assert imported.substitutions == ()
    assert imported.classes == 10
    network = imported.network(ZOO)
    own = sum(p.numel() for p in model.parameters())
    assert sum(p.numel() for p in network.parameters()) == own + added
    same_outputs(model, imported, ZOO)
    with pytest.raises(ModelImportError, match="substitute=True"):
        import_model(model.float(), x, PAPER)


# ----------------------------------------------------------------------------- export, then import
# (sampled and mutated trees of every grammar: tests/test_round_trip.py)


def _computations(tree) -> list[str]:
    """The terminals that compute (not routing, not identity, not clones and sums: a sum of four
    branches is written, and imported back, as three sums of two), in the tree's order."""
    from einspace.tree import Terminal, walk

    routing = {"identity", "permute", "im2col", "col2im", "clone", "add"}
    return [to_text(n) for _, n in walk(tree) if isinstance(n, Terminal) and n.op not in routing]


class Function(nn.Module):
    def __init__(self, function):
        super().__init__()
        self.function = function

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.function(x)


@pytest.mark.parametrize(
    "function,shape,expected",
    [
        (lambda x: F.relu6(x.softmax(dim=-1)), (8, 12), ["softmax", "relu6"]),  # unchanged values, kept
        (lambda x: F.max_pool2d(x, 3, 2, 1), (4, 8, 8), ["max_pool(k=3, s=2, p=1)"]),
        (lambda x: F.avg_pool2d(x, kernel_size=2, stride=2), (4, 8, 8), ["avg_pool(k=2, s=2, p=0)"]),
        (lambda x: F.gelu(F.dropout(x, 0.3, training=False)), (8, 12), ["gelu"]),
    ],
    ids=["relu6_after_softmax", "max_pool2d", "avg_pool2d", "dropout_off_grid"],
)
def test_functions_import_to_zoo_terminals(function, shape, expected):
    model = Function(function)
    imported = import_model(model, input_state(shape), ZOO)
    assert imported.substitutions == ()
    assert _computations(imported.tree) == expected
    same_outputs(model, imported, ZOO)


def test_a_pool_torch_computes_otherwise_is_substituted():
    model = Function(lambda x: F.avg_pool2d(x, 3, 2, 1, count_include_pad=False))
    with pytest.raises(
        ModelImportError, match="avg_pool2d .kernel 3, stride 2, padding 1. is not in grammar"
    ):
        import_model(model, input_state((4, 8, 8)), ZOO)


class ConvNeXtLikeBlock(nn.Module):
    """ConvNeXt's block in the torchvision form, with BatchNorm for its LayerNorm2d: a 7×7
    depthwise convolution, an inverted MLP with GELU, a layer scale [C, 1, 1] in front of the
    residual branch; then timm's LayerScale over tokens (`x * gamma`)."""

    def __init__(self, c: int = 16):
        super().__init__()
        self.block = nn.Sequential(
            nn.Conv2d(c, c, 7, padding=3, groups=c),
            nn.BatchNorm2d(c),
            nn.Conv2d(c, 4 * c, 1),
            nn.GELU(),
            nn.Conv2d(4 * c, c, 1),
        )
        self.layer_scale = nn.Parameter(torch.rand(c, 1, 1))
        self.gamma = nn.Parameter(torch.rand(c))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.layer_scale * self.block(x)
        return x.flatten(2).transpose(1, 2).mul(self.gamma)


def test_layer_scales_import_with_their_weights():
    torch.manual_seed(0)
    model = ConvNeXtLikeBlock()
    imported = import_model(model, input_state((16, 8, 8)), ZOO)
    assert imported.substitutions == ()
    assert _computations(imported.tree).count("layer_scale") == 2
    same_outputs(model, imported, ZOO)
    with pytest.raises(ModelImportError, match="layer scale"):
        import_model(Function(lambda x: x * torch.ones(8, 12)), input_state((8, 12)), ZOO)


class LayerNorm2d(nn.LayerNorm):
    """timm's LayerNorm2d: a layer norm over the channels, written with permutes."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.permute(0, 2, 3, 1)
        x = F.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)
        return x.permute(0, 3, 1, 2)


class ConvNeXtLikeStem(nn.Module):
    """ConvNeXt's stem (4×4 patches) and downsampling (norm, 2×2 stride 2) in timm's form, and
    a norm in torchvision's form (permute, nn.LayerNorm, permute)."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 16, 4, 4), LayerNorm2d(16, eps=1e-6))
        self.down = nn.Sequential(LayerNorm2d(16, eps=1e-6), nn.Conv2d(16, 32, 2, 2))
        self.norm = nn.LayerNorm(32, eps=1e-6)
        self.head = nn.Linear(32, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.down(self.stem(x))
        x = self.norm(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)
        return self.head(x.mean((-2, -1)))


def test_channel_layer_norms_import_exactly():
    torch.manual_seed(0)
    model = ConvNeXtLikeStem()
    for norm in (model.stem[1], model.down[0], model.norm):
        nn.init.normal_(norm.weight)
        nn.init.normal_(norm.bias)
    imported = import_model(model, input_state((3, 32, 32)), ZOO)
    assert imported.substitutions == ()
    assert _computations(imported.tree).count("channel_norm") == 3
    same_outputs(model, imported, ZOO)


def test_a_channels_last_norm_without_the_permute_back_is_located():
    model = Function(lambda x: F.layer_norm(x.permute(0, 2, 3, 1), (4,)))
    with pytest.raises(ModelImportError):
        import_model(model, input_state((4, 8, 8)), ZOO)
    with pytest.raises(ModelImportError, match="channel_norm only between"):
        import_model(nn.Sequential(nn.LayerNorm(8)), input_state((4, 8, 8)), ZOO)


@pytest.mark.parametrize("mode", ["im", "col"])
def test_the_zoo_grammar_is_consistent_and_offers_its_terminals(mode):
    """ρ < 1 in both modes (`einspace check`), and every new terminal somewhere in the grammar,
    with the paper's terminals keeping most of C's mass."""
    from einspace.grammar.analysis import analyse
    from einspace.network.importer.converter import grammar_grid

    assert analyse(ZOO, mode).consistent and analyse(ZOO, mode).spectral_radius < 1
    new = {"relu", "relu6", "gelu", "silu", "hardswish", "dropout", "max_pool", "avg_pool"}
    new |= {"depthwise_conv", "layer_scale", "affine", "channel_norm", "grouped_conv", "squeeze_excite"}
    assert new <= set(grammar_grid(ZOO))
    (rule,) = [r for r in ZOO.rules if r.symbol == "C"]
    added = sum(a.probability for a in rule.alternatives if a.items[0].name in new)
    assert 0.1 < added < 0.25

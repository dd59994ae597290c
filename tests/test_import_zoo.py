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
    """A package whose folder starts with torch's folder's name (torchvision) is the user's
    code: only torch's own folder is skipped."""
    torch_dir = tmp_path / "torch"  # a second torch folder, beside which the model's package lies
    monkeypatch.setattr(graph, "_TORCH_DIRS", (*graph._TORCH_DIRS, str(torch_dir) + "/"))
    package = tmp_path / "torchvision"
    package.mkdir()
    (package / "blocks.py").write_text(
        "from torch import nn\n\n\nclass Act(nn.Module):\n"
        "    def __init__(self):\n        super().__init__()\n        self.act = nn.GELU()\n\n"
        "    def forward(self, x):\n        return self.act(x)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    from torchvision.blocks import Act  # noqa: PLC0415 - the package made above

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
    path = tmp_path / "net.py"
    path.write_text(exported.source)
    namespace: dict = {}
    exec(compile(exported.source, str(path), "exec"), namespace)
    model = namespace["Net"]()
    model.load_state_dict(exported.state_dicts["Net"])
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
    assert "the classifier `fc` reads [B, 32]" in message and "class token" in message, message
    assert "not that mean" in message and "rank 2" not in message
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

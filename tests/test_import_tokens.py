"""Import of token models (issue 25): attention with a head count that is not a power of two (3,
6, 12 heads: DeiT-tiny, ViT-S, ViT-B) and token counts that are not (49, 196 patches), and ViT's
class token and class-token pooling, in the `einspace_zoo` grammar (substituted in the paper's);
the models written here in plain torch after timm's code, with the same weights giving the same
logits."""

from __future__ import annotations

import inspect

import pytest
import torch
from test_fx_import import sequence_form
from test_import_zoo import assert_terminal_matches
from torch import nn

from einspace import check_tree, load_grammar
from einspace.errors import Infeasible, TreeError
from einspace.network.export import export_tree
from einspace.network.importer import ModelImportError, import_model
from einspace.ops import get_op
from einspace.seeds import architectures as arch
from einspace.state import input_state
from einspace.testing.reference_models import Attention  # timm's
from einspace.tree import Terminal, parse_tree, to_text, walk

ZOO = load_grammar("einspace_zoo")

pytestmark = pytest.mark.usefixtures("one_thread")


class SmallViT(nn.Module):
    """Patchify (4×4), a position embedding, one pre-norm block (attention, GELU MLP), mean head."""

    def __init__(self, width: int, heads: int, size: int):
        super().__init__()
        self.patch_embed = nn.Conv2d(3, width, 4, 4)
        self.pos_embed = nn.Parameter(torch.randn(1, (size // 4) ** 2, width))
        self.norm1, self.attn = nn.LayerNorm(width), Attention(width, heads)
        self.norm2 = nn.LayerNorm(width)
        self.mlp = nn.Sequential(nn.Linear(width, 2 * width), nn.GELU(), nn.Linear(2 * width, width))
        self.head = nn.Linear(width, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.patch_embed(x).flatten(2).transpose(1, 2) + self.pos_embed
        x = x + self.attn(self.norm1(x))
        x = x + self.mlp(self.norm2(x))
        return self.head(x.mean(1))


class TokenMixer(nn.Module):
    """A Mixer block: an MLP across the tokens, whose widths are the token count."""

    def __init__(self, size: int):
        super().__init__()
        tokens = (size // 4) ** 2
        self.stem, self.norm = nn.Conv2d(3, 32, 4, 4), nn.LayerNorm(32)
        self.mix = nn.Sequential(nn.Linear(tokens, 64), nn.GELU(), nn.Linear(64, tokens))
        self.head = nn.Linear(32, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x).flatten(2).transpose(1, 2)
        x = x + self.mix(self.norm(x).transpose(1, 2)).transpose(1, 2)
        return self.head(x.mean(1))


def assert_same_logits(model: nn.Module, imported) -> None:
    """The imported network with the model's weights gives the model's logits (float32, 1e-5)."""
    network = imported.network(ZOO).eval()
    x = torch.randn(2, *imported.input.shape, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        torch.testing.assert_close(network(x), model.eval()(x), rtol=1e-5, atol=1e-5)


def _ops(tree) -> list[Terminal]:
    return [n for _, n in walk(tree) if isinstance(n, Terminal)]


@pytest.mark.parametrize(
    "width,heads,size",
    [(48, 3, 28), (96, 6, 28), (192, 12, 8), (48, 3, 56)],
    ids=["3_heads_49_tokens", "6_heads_49_tokens", "12_heads_4_tokens", "3_heads_196_tokens"],
)
def test_heads_and_tokens_off_the_powers_of_two_import_exactly(width, heads, size):
    torch.manual_seed(0)
    model = SmallViT(width, heads, size)
    imported = import_model(model, input_state((3, size, size)), ZOO)
    assert imported.substitutions == ()
    ops = _ops(imported.tree)
    assert arch.op("clone", b=heads) in ops and arch.op("concat", dim=2, b=heads) in ops
    head = [op for op in ops if op == arch.op("linear", d=width // heads)]
    assert len(head) == 3  # q, k and v of one head, the derivation repeated for each
    assert_same_logits(model, imported)


@pytest.mark.parametrize("size", [28, 56], ids=["49_tokens", "196_tokens"])
def test_a_token_mixing_mlp_of_49_or_196_tokens_imports_exactly(size):
    torch.manual_seed(0)
    model = TokenMixer(size)
    imported = import_model(model, input_state((3, size, size)), ZOO)
    assert imported.substitutions == ()
    tokens = (size // 4) ** 2
    assert arch.op("linear", d=tokens) in _ops(imported.tree)
    assert_same_logits(model, imported)


def test_a_head_count_off_the_grid_is_located():
    """5 heads: neither grammar has clone(b=5); the paper's has no 3 heads either."""
    with pytest.raises(ModelImportError) as caught:
        import_model(SmallViT(80, 5, 16), input_state((3, 16, 16)), ZOO)
    message = str(caught.value)
    lines, first = inspect.getsourcelines(Attention.forward)
    call = first + next(i for i, line in enumerate(lines) if "scaled_dot_product_attention" in line)
    assert f"reference_models.py:{call}:" in message and "scaled_dot_product_attention" in message
    assert "clone(b=5) is not in the grammar's grid" in message and "clone(b=3)" in message
    with pytest.raises(ModelImportError, match=r"clone\(b=3\) is not in the grammar's grid"):
        import_model(SmallViT(48, 3, 16), input_state((3, 16, 16)), "einspace")


def test_a_token_count_off_the_grid_is_a_substituted_width():
    """36 tokens (24×24 in 4×4 patches) are not a width of the grid: the token MLP's last layer is
    substituted by the nearest (32), and refused without `substitute`."""
    with pytest.raises(ModelImportError, match=r"width 36 \(the output features\)"):
        import_model(TokenMixer(24), input_state((3, 24, 24)), ZOO)


@pytest.mark.parametrize("merge", [arch.op("add"), arch.op("concat", dim=2, b=3)], ids=["add", "concat"])
def test_the_zoo_grammar_derives_three_repeated_branches_and_the_papers_does_not(merge):
    tree = arch.network(arch.branching(arch.op("clone", b=3), arch.linear(16), merge))
    x = input_state((8, 16))
    check_tree(tree, ZOO, x)
    with pytest.raises(TreeError):
        check_tree(tree, load_grammar("einspace"), x)


# ----------------------------------------------------------------------------- the class token


class DeiT(nn.Module):
    """timm's ViT with a class token: put in front of the patch tokens, the position embedding
    over both, one block, a final norm, and the classifier reading the first token (through
    timm's identity fc_norm and a dropout)."""

    def __init__(self, width: int = 48, heads: int = 3, size: int = 16):
        super().__init__()
        self.patch_embed = nn.Conv2d(3, width, 4, 4)
        self.cls_token = nn.Parameter(torch.randn(1, 1, width))
        self.pos_embed = nn.Parameter(torch.randn(1, (size // 4) ** 2 + 1, width))
        self.norm1, self.attn = nn.LayerNorm(width), Attention(width, heads)
        self.norm, self.fc_norm, self.head_drop = nn.LayerNorm(width), nn.Identity(), nn.Dropout(0.1)
        self.head = nn.Linear(width, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.patch_embed(x).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1) + self.pos_embed
        x = self.norm(x + self.attn(self.norm1(x)))
        return self.head(self.head_drop(self.fc_norm(x[:, 0])))


def _class_token_reference(module: nn.Module, x: torch.Tensor) -> torch.Tensor:
    out = torch.empty(x.shape[0], x.shape[1] + 1, x.shape[2], dtype=x.dtype)
    out[:, 0], out[:, 1:] = module.token.flatten(), x
    return out


@pytest.mark.parametrize(
    "name,reference,params,out",
    [
        ("class_token", _class_token_reference, 16, (6, 16)),
        ("first_token", lambda module, x: x.narrow(1, 0, 1), 0, (1, 16)),
    ],
)
def test_token_terminals_compute_what_plain_torch_does(name, reference, params, out):
    assert_terminal_matches(name, {}, (5, 16), reference, params, 0)
    (state,) = get_op(name).transfer((input_state((5, 16)),), {})
    assert state.shape == out
    with pytest.raises(Infeasible, match="needs tokens"):
        get_op(name).transfer((input_state((16, 4, 4)),), {})


def test_a_class_token_and_its_pooling_import_exactly():
    torch.manual_seed(0)
    model = DeiT()
    imported = import_model(model, input_state((3, 16, 16)), ZOO)
    assert imported.substitutions == ()
    ops = _ops(imported.tree)
    assert arch.op("class_token") in ops and ops[-1] == arch.op("first_token")
    token = next(v for k, v in imported.state_dict.items() if k.endswith(".token"))
    torch.testing.assert_close(token, model.cls_token.detach())
    assert_same_logits(model, imported)


def test_without_the_token_terminals_both_are_located_and_substituted():
    """The paper's grammar (4 heads, width 64): one located message for each, naming the closest
    expressible; with `substitute` the tokens without the class token and the mean head, every
    weight that fits kept (not the position embedding's, one token longer)."""
    model = DeiT(64, 4)
    x = input_state((3, 16, 16))
    with pytest.raises(ModelImportError) as caught:
        import_model(model, x, "einspace")
    message = str(caught.value)
    assert "cannot express 2 kind(s)" in message
    assert "test_import_tokens.py:" in message and "torch.cat([self.cls_token" in message
    assert "a class token (a learnt token put in front of the tokens) is not in grammar" in message
    assert "class-token pooling (the classifier reads the first token, x[:, 0])" in message
    assert "closest expressible: the mean over the tokens" in message
    imported = import_model(model, x, "einspace", substitute=True)
    assert any("weights of" in s and "not transferred" in s for s in imported.substitutions)
    ops = _ops(imported.tree)
    assert arch.op("class_token") not in ops and arch.op("first_token") not in ops
    queries = model.attn.qkv.weight[:16].detach()  # the first head's
    assert any(v.shape == queries.shape and torch.equal(v, queries) for v in imported.state_dict.values())
    network = imported.network(load_grammar("einspace")).eval()
    with torch.no_grad():
        assert network(torch.randn(2, 3, 16, 16)).shape == (2, 10)


class NotAClassToken(nn.Module):
    """A token computed from the input (its mean), put in front: a join, not a learnt token."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([x.mean(1, keepdim=True), x], dim=1)


class SecondToken(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear, self.head = nn.Linear(16, 32), nn.Linear(32, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.linear(x)[:, 1])


def test_what_is_not_a_class_token_is_not_read_as_one():
    with pytest.raises(ModelImportError, match="mean has no counterpart"):
        import_model(NotAClassToken(), input_state((8, 16)), ZOO)
    with pytest.raises(ModelImportError, match="a slice, such as a class token"):
        import_model(SecondToken(), input_state((8, 16)), ZOO)


@pytest.mark.parametrize(
    "text",
    [
        "(S (M (C class_token)) (M (M (C linear(d=32))) (M (C first_token))))",
        "(S (M (C class_token)) (M (M (C first_token)) (M (R1 permute(order=(2,1))) (M (C linear(d=16)))"
        " (R2 permute(order=(2,1))))))",
    ],
    ids=["pooled", "then_permuted"],
)
def test_token_trees_export_and_import_back(text):
    tree, x = parse_tree(text), input_state((8, 16))
    exported = export_tree(tree, x, 10, ZOO, name="Net")
    namespace: dict = {}
    exec(compile(exported.source, "net.py", "exec"), namespace)
    model = namespace["Net"]()
    model.load_state_dict(exported.state_dicts["Net"])
    imported = import_model(model.eval(), x, ZOO)
    assert to_text(sequence_form(imported.tree)) == to_text(sequence_form(tree))
    assert_same_logits(model, imported)

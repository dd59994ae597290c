"""Import of token models (issue 25): attention with a head count that is not a power of two (3,
6, 12 heads: DeiT-tiny, ViT-S, ViT-B) and token counts that are not (49, 196 patches), in the
`einspace_zoo` grammar; the models written here in plain torch after timm's code, with the same
weights giving the same logits."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from einspace import check_tree, load_grammar
from einspace.errors import TreeError
from einspace.network.importer import ModelImportError, import_model
from einspace.seeds import architectures as arch
from einspace.state import input_state
from einspace.tree import Terminal, walk

ZOO = load_grammar("einspace_zoo")

pytestmark = pytest.mark.usefixtures("one_thread")


class Attention(nn.Module):
    """timm's Attention: one qkv projection reshaped into heads, F.scaled_dot_product_attention."""

    def __init__(self, width: int, heads: int):
        super().__init__()
        self.heads, self.head_dim = heads, width // heads
        self.qkv, self.proj = nn.Linear(width, 3 * width), nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, c = x.shape
        qkv = self.qkv(x).reshape(b, n, 3, self.heads, self.head_dim).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)
        return self.proj(F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, n, c))


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
    assert "test_import_tokens.py:" in message and "scaled_dot_product_attention" in message
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

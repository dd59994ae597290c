"""ResMLP's affine norm in the `einspace_zoo` grammar (issue 25): the `affine` terminal against
plain torch in both modes with hand-counted parameters and FLOPs, its start as the identity, its
export, and a ResMLP written in plain torch after Touvron et al. (2022) and timm's code, imported
exactly and then seeding a search whose mutations stay valid. Each form of `torch.addcmul` the
importer reads, and each it refuses, is a row of tests/test_mutation_import.py."""

from __future__ import annotations

import random

import pytest
import torch
from search_helpers import experiment
from test_import_zoo import assert_terminal_matches, run_exported, same_outputs
from torch import nn

from einspace import Limits, Variation, check_tree, compile_network, load_grammar, parse_tree, pretty
from einspace.network.export import export_tree
from einspace.network.importer import ModelImportError, import_model
from einspace.ops import get_op
from einspace.search.loop import open_store, run_search
from einspace.state import input_state
from einspace.tree import Terminal, walk

ZOO = load_grammar("einspace_zoo")

pytestmark = pytest.mark.usefixtures("one_thread")


def _tokens(m: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """x · a + b over the last axis, by einsum (the scale and shift read as flat vectors)."""
    return torch.einsum("bsd,d->bsd", x, m.weight.flatten()) + m.bias.flatten()


def _image(m: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """x · a + b over the channels, by einsum."""
    return torch.einsum("bchw,c->bchw", x, m.weight.flatten()) + m.bias.flatten()[:, None, None]


#: (input shape, the plain-torch computation, parameters: 2 per feature, FLOPs: 2 per element).
TERMINALS = [
    ((8, 12), _tokens, 2 * 12, 2 * 8 * 12),
    ((4, 6, 6), _image, 2 * 4, 2 * 4 * 6 * 6),
    ((5, 3, 7), _image, 2 * 5, 2 * 5 * 3 * 7),
]


@pytest.mark.parametrize("shape,reference,params,flops", TERMINALS, ids=["tokens", "image", "uneven image"])
def test_affine_computes_what_plain_torch_does(shape, reference, params, flops):
    assert_terminal_matches("affine", {}, shape, reference, params, flops)


@pytest.mark.parametrize("shape", [(8, 12), (4, 6, 6)])
def test_affine_starts_as_the_identity_and_is_timms_addcmul(shape):
    """Scale 1 and shift 0 at first; with any weights, bit for bit timm's `torch.addcmul(beta,
    alpha, x)` with its (1, 1, D) (or (1, C, 1, 1)) parameters."""
    module = get_op("affine").build((input_state(shape),), {})
    x = torch.randn(2, *shape)
    assert torch.equal(module(x), x)
    with torch.no_grad():
        module.weight.normal_()
        module.bias.normal_()
        view = (1, 1, shape[-1]) if len(shape) == 2 else (1, shape[0], 1, 1)
        alpha, beta = module.weight.reshape(view), module.bias.reshape(view)
        assert torch.equal(module(x), torch.addcmul(beta, alpha, x))
        assert not torch.equal(module(x), x)


#: An affine after a linear layer (tokens) or a convolution (image), by input shape.
EXPORTED = {
    (8, 12): "(S (M (C linear(d=16))) (M (C affine)))",
    (4, 6, 6): "(S (M (R1 im2col(k=3, s=1, p=1)) (M (C linear(d=16))) (R2 col2im)) (M (C affine)))",
}


@pytest.mark.parametrize("shape", list(EXPORTED))
def test_an_exported_affine_is_an_addcmul_that_imports_back(shape, tmp_path):
    """The file has `torch.addcmul(shift, scale, x)`, runs with torch alone, computes what the
    compiled network does, and imports back to the same tree and weights."""
    x = input_state(shape)
    tree = check_tree(parse_tree(EXPORTED[shape]), ZOO, x).tree
    network = compile_network(tree, x, 10, ZOO)
    with torch.no_grad():  # not the identity, and scale and shift unlike: a swap would show
        for parameter in network.parameters():
            parameter.normal_(generator=torch.Generator().manual_seed(parameter.numel()))
    exported = export_tree(tree, x, 10, ZOO, name="Net", network=network)
    assert "torch.addcmul(self.shift1, self.scale1, x)" in exported.source
    model = run_exported(exported, tmp_path / "net.py").double().eval()
    imported = import_model(model, x, ZOO)
    assert imported.substitutions == () and imported.tree == tree
    same_outputs(model, imported, ZOO)


def test_a_grammar_without_affine_refuses_addcmul_at_its_line():
    model = Affine(16)
    with pytest.raises(ModelImportError) as caught:
        import_model(model, input_state((6, 16)), load_grammar("einspace"), substitute=True)
    message = str(caught.value)
    assert "torch.addcmul(self.beta, self.alpha, x)" in message
    assert message.endswith("einspace.pcfg has no operation affine"), message


# ----------------------------------------------------------------------------- ResMLP


class Affine(nn.Module):
    """timm's Affine, ResMLP's norm: alpha · x + beta per channel, (1, 1, D) each."""

    def __init__(self, width: int):
        super().__init__()
        self.alpha = nn.Parameter(1 + 0.1 * torch.randn(1, 1, width))
        self.beta = nn.Parameter(0.1 * torch.randn(1, 1, width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.addcmul(self.beta, self.alpha, x)


class ResBlock(nn.Module):
    """timm's ResBlock: Affine, a linear layer across the tokens, a layer scale, the residual;
    Affine, an MLP across the channels (GELU, 4×), a layer scale, the residual."""

    def __init__(self, tokens: int, width: int):
        super().__init__()
        self.norm1, self.linear_tokens = Affine(width), nn.Linear(tokens, tokens)
        self.norm2 = Affine(width)
        self.mlp_channels = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))
        self.ls1, self.ls2 = nn.Parameter(torch.rand(width)), nn.Parameter(torch.rand(width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.ls1 * self.linear_tokens(self.norm1(x).transpose(1, 2)).transpose(1, 2)
        return x + self.ls2 * self.mlp_channels(self.norm2(x))


class ResMLPLike(nn.Module):
    """A small ResMLP: 4×4 patches of a 16×16 image (16 tokens), width 32, two blocks, a final
    Affine, the mean over the tokens and a classifier."""

    def __init__(self, width: int = 32, depth: int = 2, classes: int = 10):
        super().__init__()
        self.stem = nn.Conv2d(3, width, 4, 4)
        self.blocks = nn.Sequential(*(ResBlock(16, width) for _ in range(depth)))
        self.norm, self.head = Affine(width), nn.Linear(width, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.norm(self.blocks(self.stem(x).flatten(2).transpose(1, 2))).mean(1))


def _computations(tree) -> list[str]:
    return [n.op for _, n in walk(tree) if isinstance(n, Terminal)]


def test_a_resmlp_imports_exactly_with_its_weights():
    """Every Affine an affine, every layer scale a layer_scale, the token linear a linear over the
    16 tokens; no substitution, the model's parameter count, its outputs."""
    torch.manual_seed(0)
    model = ResMLPLike()
    imported = import_model(model, input_state((3, 16, 16)), ZOO)
    assert imported.substitutions == ()
    terminals = _computations(imported.tree)
    assert terminals.count("affine") == 5 and terminals.count("layer_scale") == 4
    network = imported.network(ZOO)
    assert sum(p.numel() for p in network.parameters()) == sum(p.numel() for p in model.parameters())
    same_outputs(model, imported, ZOO)


def test_mutations_of_an_imported_resmlp_stay_valid():
    """Twenty mutations in a row from the imported tree: each checks in the zoo grammar, compiles
    and runs."""
    torch.manual_seed(0)
    x = input_state((3, 16, 16))
    tree = import_model(ResMLPLike(), x, ZOO).tree
    limits = Limits(max_depth=40, max_nodes=400, max_params=2_000_000)
    variation = Variation(ZOO, x, limits, rng=random.Random(0))
    for _ in range(20):
        child = variation.mutate(tree)
        assert child != tree
        checked = check_tree(child, ZOO, x)
        assert checked.params <= 2_000_000
        tree = child
    network = compile_network(checked, classes=10)
    assert network(torch.randn(2, 3, 16, 16)).shape == (2, 10)


def test_a_search_seeded_with_an_imported_resmlp_runs(tmp_path):
    """The imported tree as a seed file of a short evolution over the zoo grammar: the seed fills
    the population (evaluated once, then cached), and every later result is a mutation of its
    descendants, valid and evaluated."""
    torch.manual_seed(0)
    imported = import_model(ResMLPLike(), input_state((3, 16, 16)), ZOO)
    seed = tmp_path / "resmlp.tree"
    seed.write_text(pretty(imported.tree) + "\n")
    e = experiment(
        tmp_path / "run",
        grammar="einspace_zoo",
        seeds=[str(seed)],
        limits={"max_depth": 40, "max_nodes": 400},
        strategy={"settings": {"evaluations": 12, "population": 4, "tournament": 2}},
    )
    store = open_store(e)
    try:
        summary = run_search(e, e.make_executor(), store)
        history = store.history()
    finally:
        store.close()
    assert summary.finished and len(history) == 12
    assert [r.origin for r in history[:4]] == ["seed:resmlp"] * 4
    assert [r.status for r in history[:4]] == ["ok", "cached", "cached", "cached"]
    assert all(r.origin == "mutation" and r.status == "ok" for r in history[4:])
    for record in history[4:]:
        check_tree(parse_tree(record.tree), ZOO, input_state((3, 16, 16)))

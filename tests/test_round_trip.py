"""`einspace export` then `import-model` gives back the tree (issue 25): the same normal form
(`einspace.network.importer.normal_form`: what the exported code cannot tell apart made one),
no substitution, the same outputs; and import, export, import gives the imported tree itself
(a hand-written model's up to how sequences are grouped, as its submodules nest them). Sampled
and mutated trees of every bundled grammar (500 each when `slow`), every seed, hand-written
models, and the importer's rules for what export writes (chunks, sums of several, runs of
reshapes, tokens folded after branches)."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from test_fx_import import SEED_INPUTS, Lambda, sequence_form
from torch import nn

from einspace import Limits, Variation, load_grammar, parse_tree
from einspace.errors import EinspaceError, SamplingError, VariationError
from einspace.network.export import export_tree
from einspace.network.importer import ImportedModel, ModelImportError, import_model
from einspace.network.importer.normal_form import normal_form, normal_hash
from einspace.sampling import make_sampler
from einspace.seeds import architectures as arch
from einspace.seeds import list_seeds, load_seed
from einspace.state import input_state
from einspace.tree import Node, Terminal, to_text, walk

pytestmark = pytest.mark.usefixtures("one_thread")

#: Each bundled grammar with a small input of its mode (16×16: on smaller images splits leave
#: more axes of size 1, where tokens folded back to an image and then permuted are read, folded
#: to the shape the importer sees, without the permute: the same elements, another tree).
GRAMMARS = {
    "einspace": (3, 16, 16),
    "einspace_zoo": (3, 16, 16),
    "einspace_plus": (3, 16, 16),
    "einspace_1d": (16, 12),
}
LIMITS = Limits(max_nodes=40, max_params=100_000)


#: einspace_plus's own terminals: DNArch's export refuses by name; the NOS calibrations and XD
#: export as helper code (a gate `x * ...`, XD's butterflies) that the importer does not read back
#: (not done: issue 25 asks the zoo's terminals).
NOT_IMPORTED = ("dnarch", "xd", "channel_", "spatial_", "dynamic_")


def sampled_and_mutated(grammar_name: str, count: int, seed: int) -> list[Node]:
    """`count` trees, sampled and mutants of the last sample by turns (trees with a terminal of
    NOT_IMPORTED passed over)."""
    grammar, x = load_grammar(grammar_name), input_state(GRAMMARS[grammar_name])
    sampler = make_sampler(grammar, x, LIMITS, "paper", random_seed=seed)
    variation = Variation(grammar, x, LIMITS, rng=random.Random(seed))
    trees: list[Node] = []
    while len(trees) < count:
        try:
            tree = variation.mutate(trees[-1]) if len(trees) % 2 else sampler.sample()
        except (SamplingError, VariationError):
            continue
        if not any(isinstance(n, Terminal) and n.op.startswith(NOT_IMPORTED) for _, n in walk(tree)):
            trees.append(tree)
    return trees


def exported_model(tree: Node, grammar, x) -> nn.Module:
    """The exported file, executed: its network with the exported weights."""
    exported = export_tree(tree, x, 10, grammar, name="Net")
    namespace: dict = {}
    exec(compile(exported.source, "net.py", "exec"), namespace)
    model = namespace["Net"]()
    model.load_state_dict(exported.state_dicts["Net"])
    return model.eval()


def assert_round_trip(tree: Node, grammar_name: str, shape: tuple[int, ...], outputs: bool = True) -> None:
    grammar, x = load_grammar(grammar_name), input_state(shape)
    model = exported_model(tree, grammar, x)
    imported = import_model(model, x, grammar)
    assert imported.substitutions == ()
    image = len(shape) == 3
    assert normal_hash(imported.tree, image, x) == normal_hash(tree, image, x), (
        f"{to_text(tree)}\n{normal_form(tree, image, x)}\nimported:\n{normal_form(imported.tree, image, x)}"
    )
    again = import_model(exported_model(imported.tree, grammar, x), x, grammar)
    assert to_text(again.tree) == to_text(imported.tree)
    if outputs:
        same_outputs(model, imported, grammar)


def same_outputs(model: nn.Module, imported: ImportedModel, grammar) -> None:
    network = imported.network(grammar).double().eval()
    generator = torch.Generator().manual_seed(1)
    inputs = torch.randn(2, *imported.input.shape, generator=generator, dtype=torch.float64)
    with torch.no_grad():
        torch.testing.assert_close(network(inputs), model.double()(inputs))


@pytest.mark.parametrize("grammar_name", sorted(GRAMMARS))
def test_sampled_and_mutated_trees_come_back(grammar_name):
    for tree in sampled_and_mutated(grammar_name, 8, seed=3):
        assert_round_trip(tree, grammar_name, GRAMMARS[grammar_name])


#: Trees of 500 that do not come back yet; more is a regression. Measured 2026-11-27 with the
#: fold rule (a run of reshapes is read with a col2im to a size an im2col makes) and folds at a
#: branch's start: the failures of einspace (2) and einspace_plus (2), tokens permuted on an axis
#: of size 1 and then folded, and of einspace_zoo (1, an im2col before a clone and a col2im in
#: each branch) come back now.
KNOWN_FAILURES = {"einspace": 0, "einspace_zoo": 0, "einspace_plus": 0, "einspace_1d": 0}


@pytest.mark.parametrize(
    "text,shape",
    [
        (
            "(S (R1 im2col(k=16, s=16, p=0)) (M (R1 permute(order=(2,1))) (M (B clone(b=8)) "
            "(Branches (M (C identity))*8) (A concat(dim=1, b=8))) (R2 permute(order=(2,1)))) (R2 col2im))",
            (3, 16, 16),
        ),
        (
            "(S (R1 im2col(k=1, s=1, p=0)) (M (R1 permute(order=(2,1))) (M (B clone(b=2)) "
            "(Branches [(M (C identity)) (M (C identity))]) (A concat(dim=1, b=2))) "
            "(R2 permute(order=(2,1)))) (R2 col2im))",
            (3, 1, 1),
        ),
    ],
    ids=["one_patch", "one_pixel"],
)
def test_tokens_permuted_on_an_axis_of_size_one_fold_back_to_their_im2col(text, shape):
    """One token ([1, D]) swapped to [D, 1], lengthened, swapped back and folded: the swap and the
    fold are one run of reshapes, which a col2im then a permute of the image also matches on
    these axes of size 1; only the col2im to the im2col's 1×1 fits the tree."""
    assert_round_trip(parse_tree(text), "einspace", shape)


def test_tokens_made_before_branches_are_folded_in_each():
    """An im2col before a clone, a col2im in each branch: each branch's fold is a routing module
    of its own (identity, then col2im), closing the im2col outside."""
    text = (
        "(S (R1 im2col(k=1, s=2, p=0)) (M (B clone(b=2)) (Branches [(M (R1 identity) (M (C identity)) "
        "(R2 col2im)) (M (R1 identity) (M (C leaky_relu)) (R2 col2im))]) (A concat(dim=1, b=2))) "
        "(R2 identity))"
    )
    assert_round_trip(parse_tree(text), "einspace", (3, 16, 16))


def test_tokens_folded_without_an_im2col_are_located():
    """Outside branches, a fold with no im2col before it is the model's, not the grammar's."""
    model = Lambda(lambda layers, x: x.transpose(1, 2).reshape(x.shape[0], 8, 4, 4))
    with pytest.raises(ModelImportError, match="tokens folded back to an image without an im2col"):
        import_model(model, input_state((16, 8)), "einspace")


@pytest.mark.slow
@pytest.mark.parametrize("grammar_name", sorted(GRAMMARS))
def test_five_hundred_trees_of_each_grammar_come_back(grammar_name):
    failures = []
    for tree in sampled_and_mutated(grammar_name, 500, seed=11):
        try:
            assert_round_trip(tree, grammar_name, GRAMMARS[grammar_name], outputs=False)
        except (AssertionError, EinspaceError, RuntimeError) as exc:
            failures.append(f"{to_text(tree)}\n  {str(exc).splitlines()[0][:200]}")
    assert len(failures) <= KNOWN_FAILURES[grammar_name], "\n".join(failures)


@pytest.mark.parametrize("name", sorted(SEED_INPUTS))
def test_every_seed_comes_back(name):
    assert set(SEED_INPUTS) == set(list_seeds())
    shape = SEED_INPUTS[name]
    assert_round_trip(load_seed(name, "einspace", input_state(shape)), "einspace", shape, outputs=False)


def _hand_written() -> list[tuple[str, object, tuple[int, ...], str]]:
    """Hand-written models that import exactly: three of the seeds' and the zoo tests' own."""
    from test_import_affine import ResMLPLike  # noqa: PLC0415 - a test module
    from test_import_zoo import ZOO_MODELS, ConvNeXtLikeStem  # noqa: PLC0415 - a test module

    from einspace.testing.reference_models import reference

    models = [(n, lambda n=n, s=s: reference(n, s), s, "einspace") for n, s in SEED_INPUTS.items()]
    models = [m for m in models if m[0] in ("resnet_small", "densenet", "vit")]
    models += [(f.__name__, f, s, "einspace_zoo") for f, s, _ in ZOO_MODELS]
    models.append(("ResMLPLike", ResMLPLike, (3, 16, 16), "einspace_zoo"))
    return [*models, ("ConvNeXtLikeStem", ConvNeXtLikeStem, (3, 32, 32), "einspace_zoo")]


@pytest.mark.parametrize(
    "name,factory,shape,grammar_name", _hand_written(), ids=[m[0] for m in _hand_written()]
)
def test_import_export_import_of_hand_written_models_is_the_identity(name, factory, shape, grammar_name):
    grammar, x = load_grammar(grammar_name), input_state(shape)
    torch.manual_seed(0)
    imported = import_model(factory(), x, grammar)
    again = import_model(exported_model(imported.tree, grammar, x), x, grammar)
    assert to_text(sequence_form(again.tree)) == to_text(sequence_form(imported.tree))
    third = import_model(exported_model(again.tree, grammar, x), x, grammar)
    assert to_text(third.tree) == to_text(again.tree)


# ----------------------------------------------------------------------------- the normal form


@pytest.mark.parametrize(
    "first,second",
    [
        ("(S (M (C norm)) (M (M (C relu)) (M (C gelu))))", "(S (M (M (C norm)) (M (C relu))) (M (C gelu)))"),
        ("(S (R1 identity) (M (C norm)) (R2 identity))", "(S (M (C norm)) (M (C identity)))"),
        (  # where routing modules begin and end; a permute and its inverse in a row: nothing
            "(S (M (R1 permute(order=(1,3,2))) (M (C norm)) (R2 permute(order=(1,3,2))))"
            " (M (R1 permute(order=(1,3,2))) (M (C relu)) (R2 identity)))",
            "(S (M (R1 permute(order=(1,3,2))) (M (C norm)) (R2 identity)) (M (C relu)))",
        ),
        (
            "(S (M (C norm)) (M (R1 im2col(k=1, s=1, p=0)) (M (M (C linear(d=16))) (M (C linear(d=32))))"
            " (R2 col2im)))",
            "(S (M (C norm)) (M (M (C linear(d=16))) (M (C linear(d=32)))))",
        ),
        (  # a layer on the channels, then tokens: the layer on the tokens
            "(S (M (C linear(d=16))) (M (R1 im2col(k=1, s=1, p=0)) (M (C softmax)) (R2 identity)))",
            "(S (R1 im2col(k=1, s=1, p=0)) (M (M (C linear(d=16))) (M (C softmax))) (R2 identity))",
        ),
        ("(S (B clone(b=4)) (Branches (M (C relu))*4) (A add))", None),
    ],
    ids=["grouping", "identities", "permute_runs", "channel_layers", "layer_then_tokens", "repeat"],
)
def test_normal_form_makes_one_what_export_writes_alike(first, second):
    if second is None:  # a repeat is its branches written out
        tree = parse_tree(first)
        assert normal_form(tree, True) == "clone(b=4)([relu], [relu], [relu], [relu])add"
        return
    assert normal_form(parse_tree(first), True) == normal_form(parse_tree(second), True)


def test_permutes_on_axes_of_size_one_are_what_they_do():
    """On [3, 1, 1] (a 1×1 image), (3,2,1) and (2,3,1) both give [1, 1, 3] with the elements where
    they were: one reshape; (1,3,2) changes nothing. Without the input they stay apart."""
    x, one = input_state((3, 1, 1)), "(S (R1 permute(order=({}))) (M (C relu)) (R2 identity))"
    first, second, nothing = (parse_tree(one.format(o)) for o in ("3,2,1", "2,3,1", "1,3,2"))
    assert normal_form(first, True, x) == normal_form(second, True, x) == "reshape(shape=(1, 1, 3)) relu"
    assert normal_form(nothing, True, x) == "relu"
    assert normal_form(first, True) != normal_form(second, True)
    wide = input_state((3, 2, 1))  # (3,2,1) and (2,3,1) now move the elements otherwise
    assert normal_form(first, True, wide) != normal_form(second, True, wide)


@pytest.mark.parametrize(
    "first,second",
    [
        ("(S (M (C norm)) (M (C relu)))", "(S (M (C relu)) (M (C norm)))"),  # order
        (  # a permute and another: one run, but not nothing
            "(S (R1 permute(order=(2,3,1))) (M (C norm)) (R2 permute(order=(2,3,1))))",
            "(S (M (C norm)) (M (C identity)))",
        ),
        (  # im2col 1×1 around a norm: a layer norm over the channels of tokens, not a batch norm
            "(S (R1 im2col(k=1, s=1, p=0)) (M (C norm)) (R2 col2im))",
            "(S (M (C norm)) (M (C identity)))",
        ),
        (
            "(S (B clone(b=2)) (Branches [(M (C relu)) (M (C gelu))]) (A concat(dim=1, b=2)))",
            "(S (B clone(b=2)) (Branches [(M (C gelu)) (M (C relu))]) (A concat(dim=1, b=2)))",
        ),
        (
            "(S (B clone(b=2)) (Branches [(M (C relu)) (M (C gelu))]) (A add))",
            "(S (B group_dim(dim=1, b=2)) (Branches [(M (C relu)) (M (C gelu))]) (A add))",
        ),
    ],
    ids=["order", "two_permutes", "tokens_norm", "branch_order", "split"],
)
def test_normal_form_keeps_apart_what_computes_otherwise(first, second):
    assert normal_form(parse_tree(first), True) != normal_form(parse_tree(second), True)


# ----------------------------------------------------------------------------- the importer's rules

ZOO = load_grammar("einspace_zoo")


def _imported(model: nn.Module, shape: tuple[int, ...]) -> ImportedModel:
    torch.manual_seed(0)
    imported = import_model(model, input_state(shape), ZOO)
    assert imported.substitutions == ()
    same_outputs(model, imported, ZOO)
    return imported


CONV16 = arch.routing(arch.op("im2col", k=3, s=1, p=1), arch.linear(16), "col2im")


def test_chunks_joined_in_order_are_group_dim():
    def forward(layers, x):
        a, b = x.chunk(2, dim=1)
        return torch.cat([layers.conv(a), F.relu(b)], dim=1)

    imported = _imported(Lambda(forward, conv=nn.Conv2d(2, 16, 3, padding=1)), (4, 8, 8))
    split, merge = arch.op("group_dim", dim=1, b=2), arch.op("concat", dim=1, b=2)
    expected = arch.branching(split, [CONV16, arch.computation("relu")], merge)
    assert normal_form(imported.tree, True) == normal_form(arch.network(arch.seq(expected)), True)


def test_parts_added_in_any_order_are_branches_in_the_parts_order():
    def forward(layers, x):
        a, b = torch.chunk(x, 2, dim=3)
        return F.gelu(b) + a

    imported = _imported(Lambda(forward), (4, 8, 8))
    branches = "(Branches [(M (C identity)) (M (C gelu))])"
    assert f"(B group_dim(dim=3, b=2)) {branches} (A add)" in to_text(imported.tree)


@pytest.mark.parametrize(
    "forward,message",
    [
        (lambda layers, x: torch.cat(x.chunk(2, dim=1)[::-1], dim=1), "joined in their order"),
        (lambda layers, x: torch.cat(x.split([1, 3], dim=1), dim=1), "equal parts"),
        (lambda layers, x: x.chunk(4, dim=1)[0] + x.chunk(4, dim=1)[1], "equal parts, one per branch"),
    ],
    ids=["reversed", "unequal", "unused_parts"],
)
def test_splits_the_grammar_has_not_are_located(forward, message):
    with pytest.raises(ModelImportError, match=message) as caught:
        import_model(Lambda(forward), input_state((4, 8, 8)), ZOO)
    assert f"{Path(__file__).name}:" in str(caught.value)


def test_a_sum_of_four_alike_in_one_line_is_one_add_of_four_branches():
    def forward(layers, x):
        return layers.a(x) + layers.b(x) + layers.c(x) + layers.d(x)

    layers = {name: nn.Linear(16, 16) for name in "abcd"}
    imported = _imported(Lambda(forward, **layers), (8, 16))
    four = arch.branching(arch.op("clone", b=4), arch.linear(16), arch.op("add"))
    assert imported.tree == arch.network(four)


@pytest.mark.parametrize(
    "forward",
    [lambda layers, x: x + F.relu(x) + F.gelu(x), lambda layers, x: x + F.relu(x) + F.gelu(x) + F.silu(x)],
    ids=["three", "four_unlike"],
)
def test_other_sums_are_sums_of_two(forward):
    """clone(3) is not in the grammar, and its clone(4) repeats one branch: sums of two, as written."""
    imported = _imported(Lambda(forward), (8, 16))
    terms = 3 if "silu" not in to_text(imported.tree) else 4
    assert to_text(imported.tree).count("clone(b=2)") == terms - 1
    assert "clone(b=4)" not in to_text(imported.tree)


def test_tokens_then_a_swap_in_one_run_of_reshapes():
    """`conv(x).flatten(2)`: image to tokens, then tokens and features swapped."""
    model = Lambda(lambda layers, x: layers.conv(x).flatten(2), conv=nn.Conv2d(3, 16, 4, 4))
    imported = _imported(model, (3, 8, 8))
    wanted = "im2col(k=4, s=4, p=0) linear(d=16) permute(order=(2,1))"
    assert normal_form(imported.tree, True) == wanted, to_text(imported.tree)


def test_a_permute_beside_a_channel_norm_written_as_one():
    """What export writes for a permute routing next to a channel_norm: the permutes in one run."""
    norm = nn.LayerNorm(4, eps=1e-6)
    nn.init.normal_(norm.weight)

    def forward(layers, x):
        return layers.norm(x.transpose(2, 3).permute(0, 2, 3, 1)).permute(0, 3, 1, 2).transpose(1, 3)

    imported = _imported(Lambda(forward, norm=norm), (4, 6, 8))
    tree = parse_tree(
        "(S (M (R1 permute(order=(1,3,2))) (M (C channel_norm)) (R2 identity))"
        " (M (R1 identity) (M (C identity)) (R2 permute(order=(3,2,1)))))"
    )
    assert normal_form(imported.tree, True) == normal_form(tree, True)


def test_tokens_made_in_branches_are_folded_after_them():
    """Each branch turns the image into tokens (a convolution, flattened); their concatenation is
    folded back: the col2im closes the branching module, with no im2col of its own."""

    def forward(layers, x):
        a = layers.a(x).flatten(2).transpose(1, 2)
        b = layers.b(x).flatten(2).transpose(1, 2)
        return torch.cat([a, b], dim=2).transpose(1, 2).unflatten(2, (8, 8))

    layers = {name: nn.Conv2d(3, 16, 3, padding=1) for name in "ab"}
    imported = _imported(Lambda(forward, **layers), (3, 8, 8))
    tokens = arch.routing(arch.op("im2col", k=3, s=1, p=1), arch.linear(16), "identity")
    pair = arch.branching(arch.op("clone", b=2), [tokens, tokens], arch.op("concat", dim=2, b=2))
    assert imported.tree == arch.network(arch.routing("identity", pair, "col2im"))


CONCATENATED = [  # the tree, its input, the layer of the summed width that export must not write
    (
        "(S (M (B clone(b=2)) (Branches [(M (C linear(d=2048))) (M (C linear(d=512)))])"
        " (A concat(dim=1, b=2))) (M (C norm)))",
        (3, 8, 8),
        "nn.Conv2d(3, 2560",
    ),
    (
        "(S (B clone(b=2)) (Branches [(M (C linear(d=64))) (M (C linear(d=32)))]) (A concat(dim=2, b=2)))",
        (8, 16),
        "nn.Linear(16, 96)",
    ),
    (
        "(S (B clone(b=4)) (Branches (M (C linear(d=64)))*4) (A concat(dim=2, b=4)))",
        (8, 16),
        "nn.Linear(16, 256)",
    ),
]


@pytest.mark.parametrize(
    "text,shape,fused", CONCATENATED, ids=["image_off_grid_sum", "tokens_unequal", "tokens_equal"]
)
def test_concatenated_linears_are_written_as_their_layers(text, shape, fused):
    """Lowering computes them as one product; the file has each layer (one of the summed width,
    2560 in the first, would import as a linear off the grid)."""
    source = export_tree(parse_tree(text), input_state(shape), 10, ZOO, name="Net").source
    assert "torch.cat([" in source and fused not in source
    assert_round_trip(parse_tree(text), "einspace_zoo", shape)


def test_a_stacked_sum_is_one_add():
    """`torch.stack([...]).sum(0)`: one sum of its terms, as export writes linear branches added."""
    layers = {name: nn.Linear(16, 16) for name in "abcd"}

    def forward(layers, x):
        return torch.stack([layers[n](x) for n in "abcd"]).sum(0)

    imported = _imported(Lambda(forward, **layers), (8, 16))
    four = arch.branching(arch.op("clone", b=4), arch.linear(16), arch.op("add"))
    assert imported.tree == arch.network(four)


def test_sums_of_linear_branches_inside_a_sum_stay_apart():
    """Written in one forward, on one input: the inner sums (stacked) are not terms of the outer."""
    inner = "(M (B clone(b=4)) (Branches (M (C linear(d=16)))*4) (A add))"
    text = f"(S (B clone(b=8)) (Branches {inner}*8) (A add))"
    source = export_tree(parse_tree(text), input_state((3, 8, 8)), 10, ZOO, name="Net").source
    assert ".sum(0)" in source
    assert_round_trip(parse_tree(text), "einspace_zoo", (3, 8, 8))

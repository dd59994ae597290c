"""Import, the converter's part (einspace.network.importer.converter), fast enough to run once per
mutant: the paper's head however its mean is written, what is not that head, the report of
substitutions, modules used twice, the grammar's grid in a refusal, and reshapes read as the
grammar's routings. The layer rules are in test_mutation_import.py, whose helpers this uses."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from test_fx_import import sequence_form
from test_mutation_import import IMAGE, PAPER, TOKENS, ZOO, Fn, _same, bn, c, op, seq
from torch import nn

from einspace.network.importer import ModelImportError, import_model
from einspace.seeds import architectures as arch
from einspace.state import input_state

pytestmark = pytest.mark.usefixtures("one_thread")


class Classifier(nn.Module):
    """A body, a pooling written one of several ways, what stands between, and a linear head."""

    def __init__(self, body: nn.Module, pool, between: nn.Module | None = None, width: int = 16):
        super().__init__()
        self.body, self.pool = body, pool
        self.between = between or nn.Identity()
        self.fc = nn.Linear(width, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.between(self.pool(self.body(x))))


CONV = nn.Sequential(nn.Conv2d(4, 16, 3, 1, 1), nn.LeakyReLU())
HEADS = {
    "adaptive pool and flatten": (
        Classifier(CONV, nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten())),
        IMAGE,
    ),
    "functional pool and view": (
        Classifier(CONV, lambda x: F.adaptive_avg_pool2d(x, 1).view(x.shape[0], -1)),
        IMAGE,
    ),
    "mean, reshape, dropout": (
        Classifier(CONV, lambda x: x.mean((2, 3), keepdim=True).reshape(x.shape[0], 16), nn.Dropout(0.5)),
        IMAGE,
    ),
    "squeeze": (Classifier(CONV, lambda x: F.adaptive_avg_pool2d(x, 1).squeeze(-1).squeeze(-1)), IMAGE),
    "token mean": (
        Classifier(nn.Sequential(nn.Linear(16, 16), nn.LayerNorm(16)), lambda x: x.mean(1)),
        TOKENS,
    ),
}


@pytest.mark.parametrize("case", list(HEADS))
def test_the_papers_head_is_found_however_the_mean_is_written(case):
    model, shape = HEADS[case]
    imported = import_model(model, input_state(shape))
    assert imported.classes == 5 and imported.substitutions == () and imported.pooling == "mean"
    body = seq(arch.conv(16, 3, 1), arch.act()) if len(shape) == 3 else seq(arch.linear(16), arch.norm())
    assert sequence_form(imported.tree) == sequence_form(arch.network(body))
    _same(model, imported, PAPER, shape, modes=(False,))


HEADLESS = {
    "a linear of tokens": (nn.Sequential(nn.Linear(16, 16), nn.Linear(16, 32)), TOKENS),
    "a linear of a sum, not a mean": (Classifier(CONV, lambda x: x.sum((2, 3))), IMAGE),
    "a linear of one token": (Classifier(nn.Linear(16, 16), lambda x: x[:, 0]), TOKENS),
    "a kept dropout in the backbone": (
        Classifier(nn.Sequential(nn.ReLU(), nn.Dropout(0.2)), lambda x: x.mean(1)),
        TOKENS,
    ),
}


@pytest.mark.parametrize(
    "case, fragments",
    [
        (
            "a linear of a sum, not a mean",
            (
                "the classifier `fc` reads [B, 16] computed by",
                "over space (or tokens) of the backbone's output, and this is neither",
            ),
        ),
        (  # class-token pooling: einspace_zoo's first_token, the mean in the paper's grammar
            "a linear of one token",
            (
                "class-token pooling (the classifier reads the first token, x[:, 0]) is not in grammar",
                "closest expressible: the mean over the tokens",
            ),
        ),
    ],
)
def test_a_classifier_of_something_else_than_the_mean_is_refused(case, fragments):
    with pytest.raises(ModelImportError) as caught:
        import_model(HEADLESS[case][0], input_state(HEADLESS[case][1]))
    message = str(caught.value)
    assert all(fragment in message for fragment in fragments), message


def test_a_final_linear_of_tokens_is_part_of_the_backbone():
    model, shape = HEADLESS["a linear of tokens"]
    imported = import_model(model, input_state(shape))
    assert imported.classes is None
    assert sequence_form(imported.tree) == sequence_form(arch.network(seq(arch.linear(16), arch.linear(32))))
    _same(model, imported, PAPER, shape)


def test_a_dropout_the_grammar_keeps_stays_in_the_backbone_before_the_mean():
    model, shape = HEADLESS["a kept dropout in the backbone"]
    imported = import_model(model, input_state(shape), ZOO)
    assert imported.classes == 5
    assert sequence_form(imported.tree) == sequence_form(arch.network(seq(c("relu"), c("dropout", p=0.2))))


def test_the_model_must_return_one_tensor():
    for model in (Fn(lambda m, x: (x, x)), Fn(lambda m, x: 3)):
        with pytest.raises(ModelImportError, match="the model must return one tensor"):
            import_model(model, input_state(TOKENS))


def test_each_kind_of_substitution_is_reported_once_with_its_other_places():
    model = nn.Sequential(nn.GELU(), nn.Linear(16, 16), nn.GELU(), nn.Linear(16, 24), nn.GELU())
    imported = import_model(model, input_state(TOKENS), substitute=True)
    gelu, width = imported.substitutions
    first, also = gelu.split("\n  (also at ")
    assert first.startswith("module `0` (GELU(approximate='none'))") and "is not in grammar" in first
    assert also.count("module `") == 2 and also.endswith(")"), also
    assert width.startswith("module `3` (Linear(") and "(also at" not in width


def test_a_module_called_twice_or_needed_twice_is_refused():
    twice = Fn(lambda m, x: m.layers["lin"](m.layers["lin"](x)), lin=nn.Linear(16, 16))
    with pytest.raises(ModelImportError, match="module `layers.lin` is called twice"):
        import_model(twice, input_state(TOKENS))
    shared = Fn(lambda m, x: m.layers["lin"](x) @ m.layers["lin"](x).transpose(1, 2), lin=nn.Linear(16, 16))
    with pytest.raises(ModelImportError, match="weights would be shared"):
        import_model(shared, input_state(TOKENS))


def test_an_operation_outside_the_grid_names_the_grid():
    model = Fn(lambda m, x: torch.cat([x, x, x], dim=3))
    with pytest.raises(ModelImportError) as caught:
        import_model(model, input_state(IMAGE))
    message = str(caught.value)
    assert "concat(dim=3, b=3) is not in the grammar's grid, which has concat(dim=1, b=2) | " in message
    assert message.count(" | concat(") == 9 - 1  # dim 1, 2, 3 and b 2, 4, 8


LAYOUTS = {
    "reshape to itself": (
        Fn(lambda m, x: m.layers["n"](x.reshape(x.shape)), n=bn()),
        IMAGE,
        seq(arch.norm(), arch.identity()),
    ),
    "three axes permuted": (
        Fn(lambda m, x: x.permute(0, 3, 1, 2).softmax(-1).permute(0, 2, 3, 1)),
        IMAGE,
        arch.routing(op("permute", order=(3, 1, 2)), arch.softmax(), op("permute", order=(2, 3, 1))),
    ),
    "a permute after a layer": (
        Fn(lambda m, x: m.layers["lin"](x).transpose(1, 2), lin=nn.Linear(16, 16)),
        TOKENS,
        arch.routing("identity", arch.linear(16), op("permute", order=(2, 1))),
    ),
    "tokens to an image, permuted": (
        Fn(
            lambda m, x: (
                m.layers["lin"](x.flatten(2).transpose(1, 2))
                .transpose(1, 2)
                .unflatten(2, (6, 6))
                .transpose(2, 3)
            ),
            lin=nn.Linear(4, 16),
        ),
        IMAGE,
        arch.routing(
            "identity",
            arch.routing(op("im2col", k=1, s=1, p=0), arch.linear(16), op("col2im")),
            op("permute", order=(1, 3, 2)),
        ),
    ),
}


@pytest.mark.parametrize("case", list(LAYOUTS))
def test_reshapes_are_read_as_the_grammars_routings(case):
    model, shape, backbone = LAYOUTS[case]
    imported = import_model(model, input_state(shape))
    assert sequence_form(imported.tree) == sequence_form(arch.network(backbone)), imported.tree
    _same(model, imported, PAPER, shape)


@pytest.mark.parametrize(
    "model, shape, fragment",
    [
        (
            Fn(lambda m, x: x.reshape(x.shape[0], 16, 9)),
            IMAGE,
            "this reshape ((2, 4, 6, 6) to (2, 16, 9)) is not a routing",
        ),
        (
            Fn(lambda m, x: x.transpose(1, 2).unflatten(2, (2, 3))),
            TOKENS,
            "tokens folded back to an image without an im2col",
        ),
        (Fn(lambda m, x: x.unflatten(2, (4, 4)).flatten(2)), TOKENS, None),
    ],
)
def test_what_is_no_routing_is_refused(model, shape, fragment):
    if fragment is None:  # a reshape and its inverse: nothing at all
        imported = import_model(model, input_state(shape))
        assert imported.tree == arch.network(seq(arch.identity(), arch.identity()))
        return
    with pytest.raises(ModelImportError) as caught:
        import_model(model, input_state(shape))
    assert fragment in str(caught.value)

"""Import a PyTorch model, traced with torch.fx, as a derivation tree that computes the same function.

The importer by concern: `loading` imports the user's model file and calls its factory; `graph`
reads the traced model (values, dominators, source lines); `converter` builds the tree from the
outputs back to the input, with `layers` (one-input operations and layers with weights) and
`joins` (branching modules, attention); `pieces` holds what the tree is built from, and `weights`
the model's weights in the compiled tree. How the import works is told in `converter`'s docstring.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from einspace.checker import check_tree
from einspace.errors import TreeError
from einspace.grammar.model import Grammar
from einspace.grammar.parser import load_grammar
from einspace.network.compiler import compile_backbone, compile_network
from einspace.network.importer.converter import Converter
from einspace.network.importer.graph import ModelImportError
from einspace.network.importer.loading import ModelLoadError, load_factory
from einspace.network.importer.weights import transferred_state
from einspace.state import FeatureState
from einspace.tree import Node, pretty

__all__ = ["ImportedModel", "ModelImportError", "ModelLoadError", "import_model", "load_factory"]


@dataclass(frozen=True)
class ImportedModel:
    """The derivation tree of a model's backbone, its head's classes (None when it has no head of
    the paper's form), a state_dict with its weights for `compile_network(tree, input, classes,
    pooling=pooling)` (or `compile_backbone` without a head), the substitutions made, each
    located, and the head's pooling (mean, or max: the training setting `head_pooling`)."""

    tree: Node
    input: FeatureState
    classes: int | None
    state_dict: dict[str, torch.Tensor]
    substitutions: tuple[str, ...]
    pooling: str = "mean"

    def tree_file(self, origin: str) -> str:
        """The tree in a file's bracket form, after a `#` header: where it came from, its size and
        what was substituted."""
        checked = check_tree(self.tree, None, self.input)
        head = f"+ a head for {self.classes} classes" if self.classes else "no head"
        if self.classes and self.pooling != "mean":
            head += f", head_pooling {self.pooling}"
        lines = [
            f"Imported by `{origin}`.",
            f"At {self.input}: {checked.params:,} backbone parameters ({head}).",
            *(f"substituted: {line}" for s in self.substitutions for line in s.splitlines()),
        ]
        return "".join(f"# {line}\n" for line in lines) + pretty(self.tree) + "\n"

    def network(self, grammar: Grammar | None = None) -> nn.Module:
        """The compiled network with the model's weights."""
        if self.classes is None:
            built = compile_backbone(self.tree, self.input, grammar)
        else:
            built = compile_network(self.tree, self.input, self.classes, grammar, pooling=self.pooling)
        built.load_state_dict(self.state_dict)
        return built


def import_model(
    model: nn.Module,
    input: FeatureState,
    grammar: Grammar | str = "einspace",
    *,
    substitute: bool = False,
) -> ImportedModel:
    """The tree of `grammar` (built with the paper's grammar symbols, then checked against it
    for `input`) that computes what `model` computes, with the model's weights.

    Raises ModelImportError for anything the grammar cannot express; with `substitute` the
    closest expressible operations are used instead and listed in `substitutions`.
    """
    grammar = load_grammar(grammar) if isinstance(grammar, str) else grammar
    converter = Converter(model, input, grammar)
    tree, entries, head, pooling = converter.convert()
    made = converter.report()
    if made and not substitute:
        raise ModelImportError(
            f"grammar {grammar.path} cannot express {len(made)} kind(s) of operation of the model:\n"
            + "\n".join(made)
            + "\nimport with substitute=True (`einspace import-model --substitute`) to use these substitutes"
        )
    try:
        check_tree(tree, grammar, input)
    except TreeError as exc:
        raise ModelImportError(
            f"the imported tree does not fit grammar {grammar.path} at input {input}: {exc}"
        ) from None
    classes = None if head is None else head.out_features
    state, mismatched = transferred_state(tree, input, classes, entries, head)
    notes = [
        f"weights of {name} not transferred: their shape changed with a substitution" for name in mismatched
    ]
    return ImportedModel(tree, input, classes, state, (*made, *notes), pooling)

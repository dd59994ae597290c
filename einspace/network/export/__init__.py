"""Export: a compiled network as one readable PyTorch file that needs torch only, and its weights.

Why from the compiled, lowered network rather than from the tree: lowering has already found
what a person would write as one layer (im2col·linear·col2im is `nn.Conv2d`, the attention
branches are `F.scaled_dot_product_attention`), and the modules carry every size a constructor
needs. Linear branches joined by a concatenation stay the tree's layers (`torch.cat` of each),
so that the file imports back to the tree (tests/test_round_trip.py). Whatever lowering did not
recognise is written literally (`F.unfold`, `permute`, `@`).

The file reads like hand-written code: every branching module (clone or split → branches →
aggregation) and every attention is a small class whose `forward` keeps the branches as local
variables joined by their aggregation; uses of one structure share one class, whose constructor
takes the sizes that differ between the uses (a ResNet's blocks become one class per block shape,
`Residual(channels)` and `Residual2(in_channels, out_channels)`). The head is the paper's: the
mean over the spatial axes (or the tokens), then `nn.Linear`.

The export by concern: `writer` turns modules into layers and forward lines (`parts`: what is
written, and the helpers some layers need), `classes` groups uses of one structure into a class
and renders the source.

Exported tensors are the compiled network's own, reshaped where a layer stores them differently
(a conv weight [d, C·k·k] as [d, C, k, k]), so the exported module computes what the compiled one
does with the same weights. NOS calibrations and XD-operations are written as small helper classes
(`XD` computes Real(K diag(C (L w + b)) M x) with its butterflies multiplied out as dense complex
matrices, from the same parameters). What may be exported each operation declares
(`Operation.exportable`): DNArch terminals (masks learnt while training), and plugin operations
that do not declare it, are refused with the operation named.
"""

from __future__ import annotations

import keyword
import re
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from einspace.checker import CheckedTree, check_tree
from einspace.errors import EinspaceError
from einspace.grammar.model import Grammar
from einspace.network.compiler import Network, compile_network
from einspace.network.export.classes import classes_of, render_class, state_of
from einspace.network.export.parts import HELPERS
from einspace.network.export.writer import Writer
from einspace.ops.registry import Operation, defined_at, get_op
from einspace.outputs import write_output
from einspace.state import FeatureState, Signal
from einspace.tree import Node, Terminal, content_hash, describe_path, walk

__all__ = [
    "Export",
    "check_exportable",
    "class_name",
    "export_networks",
    "export_tree",
    "load_weights",
    "save_weights",
]


@dataclass(frozen=True)
class Export:
    """A Python source file and, per network class in it, the `state_dict` that loads into it."""

    source: str
    state_dicts: dict[str, dict[str, torch.Tensor]]


def check_exportable(tree: CheckedTree) -> None:
    """Raise EinspaceError naming the first operation that does not declare itself exportable
    (`Operation.exportable`), with the reason it gives (`export_refusal`)."""
    for path, node in walk(tree.tree):
        if not isinstance(node, Terminal):
            continue
        op = get_op(node.op)
        if op.exportable:
            continue
        reason = op.export_refusal or _undeclared(op)
        where = describe_path(tree.tree, path)
        raise EinspaceError(f"export of {node.op} is not supported: {reason} (node {where})")


def _undeclared(op: Operation) -> str:
    _, defined = defined_at(type(op))
    return (
        f"its class {type(op).__name__} (defined at {defined}) does not declare `exportable = True`, "
        "which an operation may when its `build` returns modules export knows (those of einspace's "
        "own operations, and torch's nn.Linear, nn.BatchNorm2d, nn.LayerNorm, nn.LeakyReLU, nn.Softmax "
        "and nn.Identity)"
    )


def export_tree(
    tree: Node | CheckedTree,
    input: FeatureState | Signal | None = None,
    classes: int = 10,
    grammar: Grammar | None = None,
    *,
    name: str = "Network",
    network: Network | None = None,
) -> Export:
    """The file for a tree's network (`compile_network(tree, input, classes)`, or `network` when
    given, e.g. a trained one), its class called `name`."""
    checked = tree if isinstance(tree, CheckedTree) else check_tree(tree, grammar, _need(input))
    check_exportable(checked)
    if network is None:
        network = compile_network(checked, classes=classes)
    what = f"input [B, {', '.join(map(str, checked.input[0].shape))}] ({checked.input[0].mode} mode)"
    doc = f"{name}: {what}, {network.head.linear.out_features} classes; tree {content_hash(checked.tree)}."
    return export_networks({name: network}, {name: doc})


def export_networks(networks: Mapping[str, Network], docs: Mapping[str, str] | None = None) -> Export:
    """One file holding a class per network (named by the keys), sharing the classes of the
    structures they have in common; `docs` are the classes' docstrings."""
    writer = Writer()
    roots = []
    reserved = {"torch", "nn", "F"} | {h.name for h in HELPERS}
    for name, network in networks.items():
        if not name.isidentifier() or keyword.iskeyword(name) or name in reserved:
            raise EinspaceError(
                f"{name!r} cannot name the exported class (a Python keyword or name the file uses)"
            )
        doc = (docs or {}).get(name) or f"{name}: exported by einspace."
        roots.append(writer.network(name, doc, network))
    classes = classes_of(roots, set(networks) | reserved)
    body = "\n\n\n".join([*(h.source for h in HELPERS if h in writer.helpers), *map(render_class, classes)])
    imports = ["import torch"]
    if re.search(r"\bF\.", body):
        imports.append("import torch.nn.functional as F")
    header = (
        '"""Exported by einspace (`einspace export`): plain PyTorch, einspace is not needed.\n\n'
        "Weights written beside it load with\n"
        '    model.load_state_dict(torch.load("weights.pt", weights_only=True))\n"""'
    )
    source = "\n".join([header, "", *imports, "from torch import nn", "", "", body, ""])
    return Export(source, {name: state_of(root) for name, root in zip(networks, roots, strict=True)})


def save_weights(state_dict: Mapping[str, torch.Tensor], path: str | Path) -> None:
    """Write a state_dict in torch's format, tensors only: `torch.load(path, weights_only=True)`."""
    tensors = {k: v.detach().cpu().contiguous() for k, v in state_dict.items()}
    write_output(path, lambda target: torch.save(tensors, target))


def load_weights(module: nn.Module, path: str | Path) -> None:
    """Load a state_dict file (tensors only, never pickled objects) into `module`; a file that is
    not one, or does not fit, is an EinspaceError naming it."""
    try:
        with warnings.catch_warnings():  # torch warns about pickle protocols: not the user's concern
            warnings.simplefilter("ignore")
            state = torch.load(Path(path), weights_only=True, map_location="cpu")
    except OSError as exc:
        raise EinspaceError(f"cannot read weights {path}: {exc.strerror or exc}") from None
    except Exception:  # noqa: BLE001 - whatever a foreign file makes the unpickler raise
        # torch's own message advises weights_only=False, which would run code from the file: never relay it
        raise EinspaceError(
            f"cannot read weights {path}: not a file of tensors saved with torch.save (einspace loads "
            "tensors only, never other pickled objects)"
        ) from None
    if not isinstance(state, Mapping):
        raise EinspaceError(f"weights {path} hold a {type(state).__name__}, not a state_dict")
    try:
        module.load_state_dict(state)
    except RuntimeError as exc:
        raise EinspaceError(
            f"weights {path} do not fit the network: {str(exc).splitlines()[-1].strip()}"
        ) from None


def class_name(stem: str) -> str:
    """A class name from a file or seed name: `wide_resnet16_4` -> `WideResnet16_4`."""
    name = ""
    for part in (p for p in re.split(r"[^0-9A-Za-z]+", stem) if p):
        name += ("_" if name and part[0].isdigit() else "") + part[0].upper() + part[1:]
    return name if name[:1].isalpha() else f"Network{name}"


def _need(input: FeatureState | Signal | None) -> FeatureState | Signal:
    if input is None:
        raise EinspaceError("exporting a tree needs the input state (shape and mode)")
    return input

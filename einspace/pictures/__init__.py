"""Looking at architectures: folded views of large trees, the derivation tree and the data-flow
graph drawn with matplotlib, Graphviz DOT text (`dot`), and files (PNG, SVG, HTML) of them.

The figures and files are imported on first use (PEP 562), so that `einspace.pictures.dot` and
the folded text views do not pull in matplotlib.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

# Imported here, not on first use: the function `dataflow` must shadow its module of that name.
from einspace.pictures.dataflow import dataflow
from einspace.pictures.folding import Folding, View, fold, folded_text

#: Public name -> the module that defines it, for the names that need matplotlib.
_EXPORTS = {
    "graph_figure": "einspace.pictures.figures",
    "tree_figure": "einspace.pictures.figures",
    "render": "einspace.pictures.files",
}

__all__ = ["Folding", "View", "dataflow", "fold", "folded_text", "graph_figure", "render", "tree_figure"]

if TYPE_CHECKING:
    from einspace.pictures.figures import graph_figure, tree_figure
    from einspace.pictures.files import render


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'einspace.pictures' has no attribute {name!r}")
    value = getattr(importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))

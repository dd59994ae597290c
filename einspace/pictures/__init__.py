"""Looking at architectures: folded views of large trees, the derivation tree and the data-flow
graph drawn with matplotlib, and files (PNG, SVG, HTML) of them."""

from einspace.pictures.dataflow import dataflow
from einspace.pictures.figures import graph_figure, tree_figure
from einspace.pictures.files import render
from einspace.pictures.folding import Folding, View, fold, folded_text

__all__ = ["Folding", "View", "dataflow", "fold", "folded_text", "graph_figure", "render", "tree_figure"]

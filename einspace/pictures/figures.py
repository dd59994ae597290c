"""Matplotlib figures of a checked tree: the derivation tree (paper Fig. 1 colours) and the data-flow graph.

Both are drawn from a view (`folding.fold`) that fits a size budget, with a legend of the
operation groups' colours and a footer saying what was folded. Figures are made without pyplot
(no global state, no display needed); in a notebook they show inline.
"""

from __future__ import annotations

import textwrap
from collections.abc import Iterable

from matplotlib.figure import Figure
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch, Patch

from einspace.checker import CheckedTree
from einspace.ops.registry import Group
from einspace.pictures.dataflow import dataflow
from einspace.pictures.dot import GROUP_COLOURS, NONTERMINAL_COLOUR
from einspace.pictures.folding import Folding, Kind, View, count_leaves, fold

__all__ = ["FOLDED_COLOUR", "graph_figure", "tree_figure"]

#: Fill of a folded subtree's box (also drawn dashed).
FOLDED_COLOUR = "#eeeeee"
_FONT = 7  # points; layout units below are sized for it
_LINE = 1.25 * _FONT / 72  # inches per text line


def _colour(view: View) -> str:
    if view.kind is Kind.OP:
        return GROUP_COLOURS.get(view.group, "white")
    if view.kind is Kind.SYMBOL:
        return NONTERMINAL_COLOUR
    return FOLDED_COLOUR if view.kind is Kind.FOLDED else "white"


def _wrap(text: str, width: int) -> str:
    return "\n".join(textwrap.wrap(text, width, break_on_hyphens=False)) or text


def _op_lines(label: str, width: int) -> str:
    """`name(args)` as the name over its wrapped arguments."""
    name, paren, args = label.partition("(")
    return name if not paren else name + "\n" + _wrap(args[:-1], width)


def _box(ax, x: float, y: float, text: str, colour: str, dashed: bool, thick: bool, rounded: bool) -> None:
    ax.text(
        x,
        y,
        text,
        ha="center",
        va="center",
        fontsize=_FONT,
        zorder=3,
        bbox=dict(
            boxstyle="round,pad=0.3" if rounded else "square,pad=0.3",
            facecolor=colour,
            edgecolor="#333333",
            linestyle="--" if dashed else "-",
            linewidth=2.2 if thick else 0.8,
        ),
    )


def _canvas(width: float, height: float, inches: tuple[float, float], title: str, footer: list[str], extra):
    """A figure whose axes map one layout unit to `inches`: the title above; below, a legend of
    the groups' colours and `extra` (name, colour) pairs, then the footer lines, wrapped."""
    wide = max(7.0, width * inches[0] + 0.4)
    chars = int(wide * 72 / (0.6 * _FONT))
    notes = [line for text in footer for line in textwrap.wrap(text, chars)]
    head, foot = 0.45, 0.45 + len(notes) * _LINE + 0.1
    body = height * inches[1]
    tall = head + body + foot
    fig = Figure(figsize=(wide, tall), dpi=100)
    left = (wide - width * inches[0]) / 2 / wide
    ax = fig.add_axes((left, foot / tall, width * inches[0] / wide, body / tall))
    ax.set_axis_off()
    fig.text(0.5, 1 - 0.25 / tall, title, ha="center", va="center", fontsize=_FONT + 2)
    handles = [Patch(facecolor=GROUP_COLOURS[g], edgecolor="#333333", label=g.value) for g in Group]
    handles += [Patch(facecolor=colour, edgecolor="#333333", label=name) for name, colour in extra]
    fig.legend(
        handles=handles,
        loc="upper center",
        bbox_to_anchor=(0.5, foot / tall),
        ncol=len(handles),
        fontsize=_FONT,
        frameon=False,
    )
    for i, line in enumerate(notes):
        fig.text(0.01, (foot - 0.4 - i * _LINE) / tall, line, fontsize=_FONT, va="top", color="#444444")
    return fig, ax


def _title(checked: CheckedTree, name: str) -> str:
    return f"{name}   {checked.stats.summary('   ')}"


# ----------------------------------------------------------------------------- derivation tree


def _tree_label(view: View) -> str:
    times = f" ×{view.times}" if view.times > 1 else ""
    if view.kind is Kind.OP:
        return _wrap(view.label, 24) + times
    if view.kind is Kind.SYMBOL and view.flattened:
        return f"{view.label}{times}\nsequence of {len(view.children)}"
    if view.kind is Kind.REPEAT:
        return f"repeat ×{view.times}\nseparate weights"
    if view.kind is Kind.GROUP:
        return f"{{{view.label}}}{times}"
    if view.kind is Kind.PARALLEL:
        return f"[{view.label}]{times}"
    return _wrap(view.label + times, 26)


def tree_figure(checked: CheckedTree, name: str = "derivation tree", max_leaves: int = 64) -> Figure:
    """The derivation tree from the root on the left to the leaves on the right: non-terminals
    grey, terminals coloured by their group; at most `max_leaves` leaves (deeper subtrees are
    folded into boxes)."""
    folding = fold(checked, lambda v: count_leaves(v) <= max_leaves)
    places: dict[int, tuple[int, float]] = {}
    edges: list[tuple[int, int]] = []
    views: dict[int, View] = {}
    rows = 0

    def place(view: View, depth: int) -> float:  # leaves top to bottom, parents beside their children
        nonlocal rows
        me = len(views)
        views[me] = view
        if not view.children:
            row = float(rows)
            rows += 1
        else:
            children = []
            for child in view.children:
                edges.append((me, len(views)))
                children.append(place(child, depth + 1))
            row = (children[0] + children[-1]) / 2
        places[me] = (depth, row)
        return row

    place(folding.view, 0)
    depth = max(d for d, _ in places.values())
    extra = [("non-terminal", NONTERMINAL_COLOUR), ("folded", FOLDED_COLOUR)]
    fig, ax = _canvas(depth + 1, rows, (1.45, 0.36), _title(checked, name), _footer(folding), extra)
    ax.set_xlim(-0.5, depth + 0.5)
    ax.set_ylim(-rows + 0.5, 0.5)
    for parent, child in edges:
        (x0, y0), (x1, y1) = places[parent], places[child]
        ax.plot([x0, x0 + 0.5, x1], [-y0, -y1, -y1], color="#777777", linewidth=0.8, zorder=1)
    for i, view in views.items():
        x, y = places[i]
        dashed = view.kind in (Kind.FOLDED, Kind.PARALLEL, Kind.REPEAT, Kind.GROUP)
        rounded = view.kind is not Kind.OP
        _box(ax, x, -y, _tree_label(view), _colour(view), dashed, view.times > 1, rounded)
    return fig


def _footer(folding: Folding, more: Iterable[str] = ()) -> list[str]:
    notes = folding.notes() + list(more)
    return ["folded: " + "; ".join(notes) + "."] if notes else []


# ----------------------------------------------------------------------------- data-flow graph


def graph_figure(checked: CheckedTree, name: str = "data-flow graph", max_ops: int = 60) -> Figure:
    """The network as a data-flow graph, input at the top: each operation with the signal it
    produces, parallel branches side by side, aggregations joining them; at most `max_ops`
    operations (deeper subtrees are folded)."""
    folding = fold(checked, lambda v: count_leaves(v) <= max_ops)
    graph = dataflow(folding)
    layers = max(d["layer"] for _, d in graph.nodes(data=True))
    width = graph.graph["width"]
    hidden = graph.graph["hidden"]
    more = [f"{hidden} operations that change nothing (identity) not drawn"] if hidden else []
    footer = _footer(folding, more)
    extra = [("folded", FOLDED_COLOUR)]
    fig, ax = _canvas(width, layers + 1, (2.1, 0.62), _title(checked, name), footer, extra)
    ax.set_xlim(0, width)
    ax.set_ylim(-layers - 0.5, 0.5)
    at = {n: (d["x"], -d["layer"]) for n, d in graph.nodes(data=True)}
    boxes = graph.graph["boxes"]
    for box in boxes:
        xs = [at[n][0] for n in box.nodes]
        ys = [at[n][1] for n in box.nodes]
        pad = 0.06 * sum(other.nodes < box.nodes for other in boxes)  # nested frames stay apart
        x0, x1 = min(xs) - 0.47 - pad, max(xs) + 0.47 + pad
        y0, y1 = min(ys) - 0.4 - pad, max(ys) + 0.4 + pad
        frame = FancyBboxPatch(
            (x0, y0), x1 - x0, y1 - y0, boxstyle="round,pad=0.02", fill=False, linestyle="--", zorder=0
        )
        ax.add_patch(frame)
        ax.text(x1, y1, box.label + " ", ha="right", va="bottom", fontsize=_FONT, style="italic")
    for u, v, data in graph.edges(data=True):
        (x0, y0), (x1, y1) = at[u], at[v]
        between = [at[n][0] for n in graph.nodes if y1 < at[n][1] < y0 and abs(at[n][0] - x0) < 0.6]
        rad = 0.0 if not between else (-0.25 if sum(between) / len(between) <= x0 else 0.25)
        arrow = FancyArrowPatch(
            (x0, y0),
            (x1, y1),
            arrowstyle="-|>",
            mutation_scale=8,
            shrinkA=13,
            shrinkB=13,
            connectionstyle=f"arc3,rad={rad}",
            color="#555555",
            linewidth=0.8,
            zorder=1,
        )
        ax.add_patch(arrow)
        if data["count"] > 1:
            ax.text((x0 + x1) / 2, (y0 + y1) / 2, f"×{data['count']}", fontsize=_FONT, ha="left")
    for n, d in graph.nodes(data=True):
        kind = d["kind"]
        label = d["label"] if kind != "folded" else _wrap(d["label"], 30)
        colour = GROUP_COLOURS.get(d["group"], "white") if kind == "op" else FOLDED_COLOUR
        if kind in ("input", "output"):
            colour = "white"
        _box(ax, *at[n], f"{label}\n{d['output']}", colour, kind == "folded", False, kind != "op")
    return fig

"""Pictures of derivation trees: Graphviz DOT text, coloured like the paper's figures."""

from __future__ import annotations

from einspace.ops.registry import Group, get_op, has_op
from einspace.tree import Node, Nonterminal, Parallel, Repeat, Terminal, format_terminal, walk

#: Fill colours of the paper's visualisations (Sec. 3.1): branching yellow, aggregation purple,
#: routing green, computation blue; non-terminals grey.
GROUP_COLOURS = {
    Group.BRANCHING: "#f6d55c",
    Group.AGGREGATION: "#b39ddb",
    Group.ROUTING: "#8bc34a",
    Group.COMPUTATION: "#64b5f6",
}
NONTERMINAL_COLOUR = "#d0d0d0"


def to_dot(tree: Node, name: str = "derivation") -> str:
    """The tree as a Graphviz digraph (render with `dot -Tpng tree.dot -o tree.png`)."""
    lines = [f'digraph "{name}" {{', "  node [style=filled, fontname=Helvetica, fontsize=10];"]
    ids: dict[tuple[int, ...], str] = {}
    for path, node in walk(tree):
        ident = "n" + "_".join(map(str, path)) if path else "root"
        ids[path] = ident
        label, shape, colour = _look(node)
        lines.append(f'  {ident} [label="{label}", shape={shape}, fillcolor="{colour}"];')
        if path:
            lines.append(f"  {ids[path[:-1]]} -> {ident};")
    lines.append("}")
    return "\n".join(lines)


def _look(node: Node) -> tuple[str, str, str]:
    if isinstance(node, Terminal):
        group = get_op(node.op).group if has_op(node.op) else None
        return format_terminal(node).replace('"', "'"), "box", GROUP_COLOURS.get(group, "white")
    if isinstance(node, Nonterminal):
        return node.symbol, "ellipse", NONTERMINAL_COLOUR
    if isinstance(node, Parallel):
        return f"{len(node.children)} branches", "diamond", "white"
    assert isinstance(node, Repeat)
    return f"x{node.times} (separate weights)", "diamond", "white"

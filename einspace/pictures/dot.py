"""Pictures of derivation trees: Graphviz DOT text, coloured like the paper's figures."""

from __future__ import annotations

from einspace.ops.registry import Group, get_op, has_op
from einspace.tree import Node, Nonterminal, Parallel, Repeat, Terminal, TreeVisitor, format_terminal, walk

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
    look = _Look()
    for path, node in walk(tree):
        ident = "n" + "_".join(map(str, path)) if path else "root"
        ids[path] = ident
        label, shape, colour = look.visit(node)
        lines.append(f'  {ident} [label="{label}", shape={shape}, fillcolor="{colour}"];')
        if path:
            lines.append(f"  {ids[path[:-1]]} -> {ident};")
    lines.append("}")
    return "\n".join(lines)


class _Look(TreeVisitor[tuple[str, str, str]]):
    """A node's DOT label, shape and fill colour."""

    def terminal(self, node: Terminal) -> tuple[str, str, str]:
        group = get_op(node.op).group if has_op(node.op) else None
        return format_terminal(node).replace('"', "'"), "box", GROUP_COLOURS.get(group, "white")

    def nonterminal(self, node: Nonterminal) -> tuple[str, str, str]:
        return node.symbol, "ellipse", NONTERMINAL_COLOUR

    def parallel(self, node: Parallel) -> tuple[str, str, str]:
        return f"{len(node.children)} branches", "diamond", "white"

    def repeat(self, node: Repeat) -> tuple[str, str, str]:
        return f"x{node.times} (separate weights)", "diamond", "white"

"""Tree pictures: one DOT node per tree node, coloured by the operation's group."""

from __future__ import annotations

import re

from einspace import parse_tree
from einspace.ops.registry import Group
from einspace.render import GROUP_COLOURS, NONTERMINAL_COLOUR, to_dot
from einspace.tree import walk


def test_dot_has_every_node_and_edge_coloured_by_group():
    tree = parse_tree(
        "(S (B clone(b=2)) (Branches [(M (C norm)) (M (R1 identity) (M (C softmax)) (R2 identity))]) (A add))"
    )
    dot = to_dot(tree, "fig")
    nodes = re.findall(r'^\s+(\w+) \[label="([^"]*)", shape=\w+, fillcolor="([^"]*)"\];$', dot, re.M)
    edges = re.findall(r"^\s+\w+ -> \w+;$", dot, re.M)
    assert len(nodes) == len(list(walk(tree)))
    assert len(edges) == len(nodes) - 1
    colours = {label: colour for _, label, colour in nodes}
    assert colours["clone(b=2)"] == GROUP_COLOURS[Group.BRANCHING]
    assert colours["add"] == GROUP_COLOURS[Group.AGGREGATION]
    assert colours["identity"] == GROUP_COLOURS[Group.ROUTING]
    assert colours["softmax"] == GROUP_COLOURS[Group.COMPUTATION]
    assert colours["Branches"] == NONTERMINAL_COLOUR
    assert dot.startswith('digraph "fig" {') and dot.endswith("}")

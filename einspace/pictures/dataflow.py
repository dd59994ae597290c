"""The architecture as a data-flow graph: operations as nodes, tensors as edges, branches side by side.

Built from a view (`folding.fold`), so repetition is drawn once and large subtrees are boxes.
The rule is the same for every operation, whatever its group: a node consumes every tensor in
flight and produces as many as its output signal has. A branching operation therefore fans out
and an aggregation joins, with no case for either, and new operations need none. Operations that
change nothing (no parameters, no FLOPs, the same signal out as in, e.g. `identity`) are not drawn:
the tensor passes straight on, which is how a residual's skip connection appears.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from einspace.checker import NodeFacts
from einspace.pictures.folding import Folding, Kind, View
from einspace.state import Signal, describe

if TYPE_CHECKING:  # networkx is imported where a graph is built: every command line imports this module
    import networkx as nx

__all__ = ["Box", "dataflow"]


@dataclass(frozen=True)
class Box:
    """A dashed frame around the nodes of something drawn once but present `label` times."""

    nodes: frozenset[int]
    label: str


def _does_nothing(facts: NodeFacts) -> bool:
    return facts.params == 0 and facts.flops == 0 and facts.output == facts.input


def _width(view: View, facts: dict) -> float:
    """Columns a view needs: parallel branches side by side, everything else stacked."""
    if view.kind is Kind.OP:
        return 0.0 if _does_nothing(facts[view.path]) else 1.0
    if view.kind is Kind.FOLDED:
        return 1.0
    widths = [_width(c, facts) for c in view.children]
    if view.kind is Kind.PARALLEL:
        return sum(max(w, 0.5) for w in widths)  # a branch that draws nothing still gets a lane
    return max(widths, default=0.0)


class _Builder:
    def __init__(self, folding: Folding):
        import networkx as nx

        self.facts = folding.facts
        self.graph = nx.DiGraph()
        self.boxes: list[Box] = []
        self.hidden = 0

    def node(
        self, kind: str, label: str, output: Signal, view: View | None, x: float, inputs: list[int]
    ) -> int:
        n = self.graph.number_of_nodes()
        facts = self.facts[view.path] if view is not None else None
        self.graph.add_node(
            n,
            kind=kind,
            label=label,
            output=describe(output),
            group=view.group if view is not None else None,
            params=facts.params if facts is not None else 0,
            path=view.path if view is not None else None,
            x=x,
        )
        for source in inputs:
            if self.graph.has_edge(source, n):
                self.graph.edges[source, n]["count"] += 1
            else:
                self.graph.add_edge(source, n, count=1)
        return n

    def run(self, view: View, streams: list[int], x0: float, x1: float) -> list[int]:
        """Add `view` fed by `streams` (the producers of the tensors in flight, in branch order)
        within columns [x0, x1); return the producers after it."""
        if view.kind in (Kind.OP, Kind.FOLDED):
            facts = self.facts[view.path]
            if view.kind is Kind.OP and _does_nothing(facts):
                self.hidden += 1
                return streams
            n = self.node(view.kind.value, view.label, facts.output, view, (x0 + x1) / 2, streams)
            return [n] * len(facts.output)
        if view.kind is Kind.REPEAT:
            out = self.once(view.children[0], streams[:1], x0, x1, f"×{view.times} branches")
            return out * view.times
        if view.kind is Kind.PARALLEL:
            return self.parallel(view, streams, x0, x1)
        for child in view.children:  # a symbol or a group: its children in sequence
            if child.times > 1:
                streams = self.once(child, streams, x0, x1, f"×{child.times} in sequence")
            else:
                streams = self.run(child, streams, x0, x1)
        return streams

    def once(self, view: View, streams: list[int], x0: float, x1: float, label: str) -> list[int]:
        """`view` drawn once, framed with `label` (how many times it is really there)."""
        first = self.graph.number_of_nodes()
        out = self.run(view, streams, x0, x1)
        nodes = frozenset(range(first, self.graph.number_of_nodes()))
        if nodes:
            self.boxes.append(Box(nodes, label))
        return out

    def parallel(self, view: View, streams: list[int], x0: float, x1: float) -> list[int]:
        widths = [max(_width(c, self.facts), 0.5) for c in view.children]
        scale = (x1 - x0) / sum(widths)
        out: list[int] = []
        branch, left = 0, x0
        for child, width in zip(view.children, widths, strict=True):
            right = left + width * scale
            mine = streams[branch : branch + 1]
            if child.times > 1:
                out += self.once(child, mine, left, right, f"×{child.times} identical branches") * child.times
            else:
                out += self.run(child, mine, left, right)
            branch += child.times
            left = right
        return out


def dataflow(folding: Folding) -> nx.DiGraph:
    """The data-flow graph of a folded tree, laid out for drawing top to bottom.

    Node attributes: kind (`input`, `op`, `folded`, `output`), label, output (the signal it
    produces, as text), group (an operation's `Group`, else None), params, path (of the tree node
    it shows; None for input and output), and the layout: x
    (column centre) and layer (the longest path from the input). Edge attribute `count`: how
    many tensors go that way. Graph attributes: `boxes` (what is drawn once but there k times)
    and `hidden` (operations that change nothing, not drawn).
    """
    import networkx as nx

    builder = _Builder(folding)
    checked = folding.checked
    width = max(1.0, _width(folding.view, folding.facts))
    source = builder.node("input", "input", checked.input, None, width / 2, [])
    streams = builder.run(folding.view, [source] * len(checked.input), 0.0, width)
    builder.node("output", "output", checked.output, None, width / 2, streams)
    graph = builder.graph
    for n in nx.topological_sort(graph):
        graph.nodes[n]["layer"] = max((graph.nodes[p]["layer"] + 1 for p in graph.predecessors(n)), default=0)
    graph.graph.update(boxes=builder.boxes, hidden=builder.hidden, width=width)
    return graph

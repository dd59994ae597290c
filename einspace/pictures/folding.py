"""Readable views of large derivation trees: flattened sequences, ×k for repetition, folded depths.

A real network's tree has hundreds of nodes, most of them the binary `M -> M M` spine of one
long sequence. A view keeps the tree's meaning and drops the repetition: nested sequences are
flattened into one node, identical consecutive modules and identical parallel branches are
shown once with ×k, and beyond a size budget every subtree below some depth is folded into one
box. `Folding.notes` says what was done, so nothing is hidden silently. Pictures, the data-flow
graph and the console's folded text are all drawn from a view.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from enum import Enum

from einspace.checker import CheckedTree, NodeFacts
from einspace.ops.registry import Group, get_op, has_op
from einspace.tree import (
    Node,
    Nonterminal,
    Parallel,
    Path_,
    Repeat,
    Terminal,
    TreeVisitor,
    format_terminal,
    to_text,
    walk,
)

__all__ = ["Folding", "Kind", "View", "count_leaves", "count_nodes", "fold", "folded_text"]


class Kind(str, Enum):
    """What a view node shows."""

    SYMBOL = "symbol"  # a non-terminal; its children run in sequence
    OP = "op"  # a terminal operation
    PARALLEL = "parallel"  # child i transforms branch i
    REPEAT = "repeat"  # one derivation applied to every branch, separate weights
    FOLDED = "folded"  # a whole subtree shown as one box
    GROUP = "group"  # neighbours in a sequence that repeat as a group, shown once (with times > 1)


@dataclass(frozen=True)
class View:
    """One node of a view. `path` addresses the tree node it shows (the first of a ×k run);
    `times` > 1 means that many identical copies in a row (or side by side) are shown once."""

    kind: Kind
    label: str
    path: Path_
    node: Node = field(repr=False, compare=False)
    children: tuple[View, ...] = ()
    times: int = 1
    group: Group | None = None
    flattened: int = 0  # nested sequences merged into this node

    def walk(self, depth: int = 0) -> Iterator[tuple[int, View]]:
        """(depth, view) pairs in pre-order."""
        yield depth, self
        for child in self.children:
            yield from child.walk(depth + 1)


@dataclass(frozen=True)
class Folding:
    """A view of a checked tree and a tally of what it leaves out."""

    view: View
    checked: CheckedTree = field(repr=False)
    flattened: int = 0  # nested sequences merged into their parent sequence
    runs: int = 0  # runs of identical consecutive modules shown once
    run_nodes: int = 0  # tree nodes in the copies those runs do not show
    branches: int = 0  # sets of identical parallel branches shown once
    branch_nodes: int = 0
    folded: int = 0  # subtrees shown as one box
    folded_nodes: int = 0  # tree nodes inside those boxes
    depth: int | None = None  # the depth below which subtrees were folded, if any

    @property
    def facts(self) -> dict[Path_, NodeFacts]:
        return self.checked.facts

    def notes(self) -> list[str]:
        """What was folded, one phrase each (empty when the view shows every node)."""
        notes = []
        if self.flattened:
            notes.append(f"{_n(self.flattened, 'nested sequence')} flattened into their parents")
        if self.runs:
            notes.append(
                f"{_n(self.runs, 'run')} of identical consecutive modules or groups {{…}} shown once "
                f"with ×k ({_n(self.run_nodes, 'node')} not drawn)"
            )
        if self.branches:
            notes.append(
                f"{_n(self.branches, 'set')} of identical parallel branches shown once with ×k "
                f"({_n(self.branch_nodes, 'node')} not drawn)"
            )
        if self.folded:
            notes.append(
                f"{_n(self.folded, 'subtree')} below depth {self.depth} folded into one box each "
                f"({_n(self.folded_nodes, 'node')})"
            )
        return notes


def _n(count: int, noun: str) -> str:
    return f"{count} {noun}{'' if count == 1 else 's'}"


def _group(op: str) -> Group | None:
    return get_op(op).group if has_op(op) else None


def _sequence_symbol(node: Node) -> str | None:
    """Y when `node` is a non-terminal whose two or more children are all non-terminals Y."""
    if not isinstance(node, Nonterminal) or len(node.children) < 2:
        return None
    symbols = {c.symbol if isinstance(c, Nonterminal) else None for c in node.children}
    return symbols.pop() if len(symbols) == 1 else None


class _Builder(TreeVisitor[View]):
    """Builds the unfolded view of a checked tree, one handler per node kind, counting what it merges."""

    def __init__(self, checked: CheckedTree):
        self.facts = checked.facts
        self.flattened = self.runs = self.run_nodes = self.branches = self.branch_nodes = 0

    def terminal(self, node: Terminal, path: Path_) -> View:
        return View(Kind.OP, format_terminal(node), path, node, group=_group(node.op))

    def repeat(self, node: Repeat, path: Path_) -> View:
        child = self.visit(node.child, (*path, 0))
        return View(Kind.REPEAT, f"×{node.times}", path, node, (child,), node.times)

    def parallel(self, node: Parallel, path: Path_) -> View:
        items = [(c, (*path, i)) for i, c in enumerate(node.children)]
        kids, merged, hidden = self.collapse(items)
        self.branches += merged
        self.branch_nodes += hidden
        return View(Kind.PARALLEL, f"{len(node.children)} branches", path, node, kids)

    def nonterminal(self, node: Nonterminal, path: Path_) -> View:
        items: list[tuple[Node, Path_]] = []
        symbol = _sequence_symbol(node)
        flattened = 0
        pending = [(c, (*path, i)) for i, c in enumerate(node.children)][::-1]
        while pending:  # depth-first, in order: nested sequences of the same symbol are inlined
            child, child_path = pending.pop()
            if symbol is not None and _sequence_symbol(child) == symbol:
                flattened += 1
                pending.extend([(c, (*child_path, i)) for i, c in enumerate(child.children)][::-1])
            else:
                items.append((child, child_path))
        self.flattened += flattened
        kids, merged, hidden = self.collapse(items)
        self.runs += merged
        self.run_nodes += hidden
        return View(Kind.SYMBOL, node.symbol, path, node, kids, flattened=flattened)

    def collapse(self, items: list[tuple[Node, Path_]]) -> tuple[tuple[View, ...], int, int]:
        """Views of `items` in which each run of identical neighbours, or of an identical group of
        up to `MAX_PERIOD` neighbours, is one view with `times`; also the number of runs and the
        tree nodes of the copies not shown. Identical means the same derivation and the same input
        signal, so every copy maps that signal to itself and all copies look alike."""
        keys = [(to_text(node), self.facts[path].input) for node, path in items]
        kids: list[View] = []
        merged = hidden = 0
        i = 0
        while i < len(items):
            period, reps = _best_run(keys, i)
            if reps == 1:
                kids.append(self.visit(*items[i]))
                i += 1
                continue
            group = items[i : i + period]
            if period == 1:
                view = self.visit(*group[0])
            else:
                node = Nonterminal("group", tuple(n for n, _ in group))
                label = f"{period} modules"
                view = View(Kind.GROUP, label, group[0][1], node, tuple(self.visit(*g) for g in group))
            kids.append(replace(view, times=reps))
            merged += 1
            hidden += (reps - 1) * sum(1 for n, _ in group for _ in walk(n))
            i += period * reps
        return tuple(kids), merged, hidden


#: The longest group of neighbours whose repetition `collapse` recognises, e.g. (block, act) x 2.
MAX_PERIOD = 4


def _best_run(keys: list, start: int) -> tuple[int, int]:
    """(period, repetitions) of the run at `start` that covers the most items (the shortest period
    on a tie); (1, 1) when nothing repeats."""
    best = (1, 1)
    for period in range(1, MAX_PERIOD + 1):
        reps = 1
        while keys[start + reps * period : start + (reps + 1) * period] == keys[start : start + period]:
            reps += 1
        if reps > 1 and period * reps > best[0] * best[1]:
            best = (period, reps)
    return best


def _folded_label(view: View) -> str:
    """A box's label: its symbol, its size and the operations it starts and ends with."""
    ops = [n.op for _, n in walk(view.node) if isinstance(n, Terminal)]
    size = sum(1 for _ in walk(view.node))
    sketch = "·".join(ops) if len(ops) <= 3 else f"{ops[0]}·{ops[1]} … {ops[-1]}"
    return f"{view.label} … {size} nodes: {sketch}"


def _chain(view: View) -> bool:
    """True when no node below `view` has more than one child: folding it would save nothing."""
    return all(len(v.children) <= 1 for _, v in view.walk())


def _cut(view: View, depth: int) -> tuple[View, int, int]:
    """The view with every node at `depth` that has children folded into a box; also how many
    boxes and the tree nodes they hold."""
    if not view.children:
        return view, 0, 0
    if depth == 0 and not _chain(view):
        size = sum(1 for _ in walk(view.node))
        times = 1 if view.kind is Kind.REPEAT else view.times  # a repeat's box holds all its copies
        return replace(view, kind=Kind.FOLDED, label=_folded_label(view), children=(), times=times), 1, size
    kids, boxes, nodes = [], 0, 0
    for child in view.children:
        kid, b, n = _cut(child, depth - 1)
        kids.append(kid)
        boxes, nodes = boxes + b, nodes + n
    return replace(view, children=tuple(kids)), boxes, nodes


def fold(checked: CheckedTree, fits: Callable[[View], bool] | None = None) -> Folding:
    """The view of `checked`; when `fits(view)` is false, subtrees below the deepest depth at
    which it becomes true are folded into boxes (the root alone always fits)."""
    builder = _Builder(checked)
    full = builder.visit(checked.tree, ())
    tally = dict(
        flattened=builder.flattened,
        runs=builder.runs,
        run_nodes=builder.run_nodes,
        branches=builder.branches,
        branch_nodes=builder.branch_nodes,
    )
    if fits is None or fits(full):
        return Folding(full, checked, **tally)
    deepest = max(d for d, _ in full.walk())
    for depth in range(deepest - 1, -1, -1):
        view, boxes, nodes = _cut(full, depth)
        if fits(view) or depth == 0:
            return Folding(view, checked, **tally, folded=boxes, folded_nodes=nodes, depth=depth)
    raise AssertionError("unreachable: depth 0 always fits")


def count_nodes(view: View) -> int:
    return sum(1 for _ in view.walk())


def count_leaves(view: View) -> int:
    return sum(1 for _, v in view.walk() if not v.children)


# ----------------------------------------------------------------------------- console text


def _one_line(view: View) -> str:
    times = f" ×{view.times}" if view.times > 1 else ""
    if view.kind is Kind.OP:
        return view.label + times
    if view.kind is Kind.FOLDED:
        return f"({view.label})" + times
    if view.kind is Kind.REPEAT:
        return _one_line(view.children[0]) + f"*{view.times}"
    opener, closer = _BRACKETS.get(view.kind, (f"({view.label} ", ")"))
    return opener + " ".join(_one_line(c) for c in view.children) + closer + times


#: How the console text opens and closes a node with children (a symbol: `(X ...)`).
_BRACKETS = {Kind.PARALLEL: ("[", "]"), Kind.GROUP: ("{", "}")}


def _lines(view: View, width: int, indent: str = "  ") -> list[str]:
    """Like `pretty`: a subtree that fits in `width` stays on one line."""
    lines: list[str] = []

    def emit(v: View, depth: int, suffix: str = "") -> None:
        pad = indent * depth
        if v.kind is Kind.REPEAT:
            emit(v.children[0], depth, f"*{v.times}{suffix}")
            return
        text = _one_line(v)
        if not v.children or len(pad) + len(text) + len(suffix) <= width:
            lines.append(pad + text + suffix)
            return
        times = f" ×{v.times}" if v.times > 1 else ""
        opener, closer = _BRACKETS.get(v.kind, (f"({v.label}", ")"))
        lines.append(pad + opener.rstrip())
        for child in v.children:
            emit(child, depth + 1)
        lines[-1] += closer + times + suffix

    emit(view, 0)
    return lines


def folded_text(checked: CheckedTree, width: int = 100, max_lines: int = 30) -> str:
    """The tree as indented bracket text of at most `max_lines` lines (beyond that deeper parts
    are folded into `(M … n nodes: ops)`), then a `# folded:` line saying what was left out.
    ×k marks k identical modules (or groups `{...}` of them) in a row, or k identical branches;
    `*k` is the tree's own repeat."""
    folding = fold(checked, lambda v: len(_lines(v, width)) <= max_lines)
    lines = _lines(folding.view, width)
    notes = folding.notes()
    if notes:
        lines.append("# folded: " + "; ".join(notes))
    return "\n".join(lines)

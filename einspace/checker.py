"""Check a tree against a grammar and an input: derivability, shapes, and the costs they imply."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from functools import cached_property

from einspace.errors import EinspaceError, Infeasible, TreeError
from einspace.grammar.model import (
    Alternative,
    Grammar,
    Item,
    ItemVisitor,
    OpItem,
    ParallelItem,
    RepeatItem,
    SymbolItem,
    format_alternative,
)
from einspace.ops.registry import Group, canonical_args, get_op
from einspace.state import FeatureState, Signal, describe
from einspace.tree import (
    Node,
    Nonterminal,
    Parallel,
    Path_,
    Repeat,
    Terminal,
    TreeVisitor,
    describe_path,
    format_terminal,
    walk,
    walk_depths,
)


@dataclass(frozen=True)
class NodeFacts:
    """What the checker learned about one node: the signal in and out, and its own cost.

    `params` and `flops` cover the subtree once; `copies` says how many times the enclosing
    Repeat nodes instantiate it.
    """

    input: Signal
    output: Signal
    params: int
    flops: int
    copies: int


@dataclass(frozen=True)
class TreeStats:
    """A checked tree's size and cost at a glance, as `einspace show`, the reports and the limits
    read them. Depth counts non-terminal levels (`einspace.tree.walk_depths`); the branching
    factor is the mean b of the tree's branching operations (1 when it has none), as in the
    paper's Table 6. `operations` counts the terminals as the network runs them (each Repeat copy
    once, `CheckedTree.operations`): what `max_operations` bounds."""

    terminals: int
    operations: int
    nonterminals: int
    depth: int
    branching_factor: float
    params: int
    flops: int
    output: str

    @property
    def nodes(self) -> int:
        """Terminals and non-terminals: what `max_nodes` bounds."""
        return self.terminals + self.nonterminals

    def summary(self, sep: str = "  ") -> str:
        """The one-line form of the reports and pictures: params, FLOPs, depth, terminals, output."""
        fields = (
            f"params {self.params:,}",
            f"FLOPs {self.flops:,}",
            f"depth {self.depth}",
            f"terminals {self.terminals}",
            f"output {self.output}",
        )
        return sep.join(fields)

    def as_dict(self) -> dict[str, float | int | str]:
        """The fields by name, in order (the JSON form of `einspace sample --format json`)."""
        return asdict(self)


@dataclass(frozen=True)
class CheckedTree:
    """A tree that passed the checks, with per-node facts and whole-network totals."""

    tree: Node
    input: Signal
    output: Signal
    facts: dict[Path_, NodeFacts] = field(repr=False)
    params: int
    flops: int

    @cached_property
    def operations(self) -> int:
        """The terminal operations the compiled network runs: each terminal once per copy its
        enclosing Repeat nodes make. A network's time per step outside its arithmetic grows with
        this count, which `max_nodes` (a Repeat's subtree once) and FLOPs do not see."""
        return self.count_operations(lambda _: True)

    def count_operations(self, which: Callable[[Terminal], bool]) -> int:
        """The operations the compiled network runs among the terminals `which` accepts, each once
        per copy its enclosing Repeat nodes make."""
        terminals = ((path, node) for path, node in walk(self.tree) if isinstance(node, Terminal))
        return sum(self.facts[path].copies for path, node in terminals if which(node))

    @cached_property
    def stats(self) -> TreeStats:
        """Node counts, depth, branching factor, parameters, FLOPs and output (computed once)."""
        terminals = nonterminals = deepest = 0
        factors: list[int] = []
        for path, node, depth in walk_depths(self.tree):
            deepest = max(deepest, depth)
            if node.kind == "nonterminal":
                nonterminals += 1
            elif node.kind == "terminal":
                terminals += 1
                if get_op(node.op).group is Group.BRANCHING:
                    factors.append(len(self.facts[path].output))
        branching = sum(factors) / len(factors) if factors else 1.0
        return TreeStats(
            terminals,
            self.operations,
            nonterminals,
            deepest,
            branching,
            self.params,
            self.flops,
            describe(self.output),
        )


class _Checker(TreeVisitor[tuple[Signal, int, int]]):
    """One walk that infers signals through the tree and, given a grammar, matches rules: a
    handler per node kind takes the node, its path, the signal it receives and how many copies
    the enclosing repeats make of it."""

    def __init__(self, root: Node, grammar: Grammar | None):
        self.root = root
        self.grammar = grammar
        self.facts: dict[Path_, NodeFacts] = {}

    def fail(self, path: Path_, message: str) -> TreeError:
        return TreeError(message, describe_path(self.root, path))

    def visit(self, node: Node, path: Path_, signal: Signal, copies: int) -> tuple[Signal, int, int]:
        """The signal out of `node` and its subtree's parameters and FLOPs (once), recorded in facts."""
        out, params, flops = self.handler(node)(node, path, signal, copies)
        self.facts[path] = NodeFacts(signal, out, params, flops, copies)
        return out, params, flops

    def nonterminal(
        self, node: Nonterminal, path: Path_, signal: Signal, copies: int
    ) -> tuple[Signal, int, int]:
        if self.grammar is not None:
            self.match_rule(node, path, signal)
        out, params, flops = signal, 0, 0
        for i, child in enumerate(node.children):
            out, p, f = self.visit(child, (*path, i), out, copies)
            params, flops = params + p, flops + f
        return out, params, flops

    def parallel(self, node: Parallel, path: Path_, signal: Signal, copies: int) -> tuple[Signal, int, int]:
        if len(signal) != len(node.children):
            raise self.fail(path, f"{len(node.children)} parallel branches receive {describe(signal)}")
        outs: list[FeatureState] = []
        params = flops = 0
        for i, (child, branch) in enumerate(zip(node.children, signal, strict=True)):
            out, p, f = self.visit(child, (*path, i), (branch,), copies)
            outs.extend(out)
            params, flops = params + p, flops + f
        return tuple(outs), params, flops

    def repeat(self, node: Repeat, path: Path_, signal: Signal, copies: int) -> tuple[Signal, int, int]:
        if len(signal) != node.times or any(s != signal[0] for s in signal):
            raise self.fail(path, f"a repeat over {node.times} equal branches receives {describe(signal)}")
        inner, p, f = self.visit(node.child, (*path, 0), signal[:1], copies * node.times)
        return inner * node.times, p * node.times, f * node.times

    def terminal(self, node: Terminal, path: Path_, signal: Signal, copies: int) -> tuple[Signal, int, int]:
        try:
            op = get_op(node.op)
        except EinspaceError as exc:
            raise self.fail(path, str(exc)) from None
        args = dict(node.args)
        try:
            canonical_args(op, args)
        except EinspaceError as exc:
            raise self.fail(path, f"bad arguments for {node.op}: {exc}") from None
        try:
            out = op.transfer(signal, args)
        except Infeasible as exc:
            raise self.fail(path, f"{node.op} cannot apply to {describe(signal)}: {exc}") from None
        return out, op.param_count(signal, args), op.flops(signal, args)

    def match_rule(self, node: Nonterminal, path: Path_, signal: Signal) -> None:
        assert self.grammar is not None
        rules = self.grammar.rules_for(node.symbol)
        if not rules:
            known = ", ".join(self.grammar.nonterminals)
            raise self.fail(path, f"the grammar has no symbol {node.symbol!r} (it has {known})")
        # A child the grammar cannot know is named at its own path, not as a mismatch here.
        for i, child in enumerate(node.children):
            if isinstance(child, Nonterminal) and not self.grammar.rules_for(child.symbol):
                known = ", ".join(self.grammar.nonterminals)
                raise self.fail((*path, i), f"the grammar has no symbol {child.symbol!r} (it has {known})")
            if isinstance(child, Terminal):
                try:
                    get_op(child.op)
                except EinspaceError as exc:
                    raise self.fail((*path, i), str(exc)) from None
        rule = self.grammar.rule_for(node.symbol, signal)
        if rule is None:
            guards = "; ".join(" and ".join(map(str, r.guard)) for r in rules)
            raise self.fail(
                path, f"no rule for {node.symbol} applies to {describe(signal)} (guards: {guards})"
            )
        if not any(derives(alt, node.children) for alt in rule.alternatives):
            for alt in rule.alternatives:
                off_grid = _off_grid(alt, node.children)
                if off_grid is not None:
                    i, message = off_grid
                    raise self.fail((*path, i), message)
            options = " | ".join(format_alternative(a) for a in rule.alternatives)
            raise self.fail(path, f"{node.symbol} cannot derive these children here; its rule is {options}")


def derives(alternative: Alternative, kids: tuple[Node, ...]) -> bool:
    """Whether a node whose rule chose `alternative` may have these children (symbols, operations
    with arguments on the grammar's grid, branches and repeats as the items say)."""
    return len(alternative.items) == len(kids) and all(map(_item_matches, alternative.items, kids))


def _off_grid(alternative: Alternative, kids: tuple[Node, ...]) -> tuple[int, str] | None:
    """When `kids` would match `alternative` but for one operation's arguments, say which child
    and what the grammar allows there (a clearer message than "no alternative matches")."""
    if len(alternative.items) != len(kids):
        return None
    misses = [
        i
        for i, (item, kid) in enumerate(zip(alternative.items, kids, strict=True))
        if not _item_matches(item, kid)
    ]
    if len(misses) != 1:
        return None
    i = misses[0]
    item, kid = alternative.items[i], kids[i]
    if not (isinstance(item, OpItem) and isinstance(kid, Terminal) and kid.op == item.name):
        return None
    allowed = ", ".join(format_terminal(Terminal(item.name, c)) for c in item.choices[:12])
    more = f", ... ({len(item.choices)} in all)" if len(item.choices) > 12 else ""
    return i, f"{format_terminal(kid)} is not in the grammar's grid here; it allows {allowed}{more}"


class _Matches(ItemVisitor[bool]):
    """Whether a tree node is what a grammar item derives (of a kind the item has no handler
    for: no)."""

    def symbol(self, item: SymbolItem, node: Node) -> bool:
        return isinstance(node, Nonterminal) and node.symbol == item.name

    def op(self, item: OpItem, node: Node) -> bool:
        return isinstance(node, Terminal) and node.op == item.name and node.args in item.choices

    def parallel(self, item: ParallelItem, node: Node) -> bool:
        return (
            isinstance(node, Parallel)
            and len(node.children) == len(item.items)
            and all(map(self.visit, item.items, node.children))
        )

    def repeat(self, item: RepeatItem, node: Node) -> bool:
        return (
            isinstance(node, Repeat)
            and (item.times is None or item.times == node.times)
            and self.visit(item.item, node.child)
        )

    def default(self, item: Item, node: Node) -> bool:
        return False


_item_matches = _Matches().visit


def check_tree(tree: Node, grammar: Grammar | None, input: FeatureState | Signal) -> CheckedTree:
    """Check `tree` for input `input`; raise TreeError naming the first offending node.

    With a grammar, every non-terminal must be derivable by the rule that applies to its
    signal; without one only shapes are checked (trees are self-describing). The network
    output must be a single tensor.
    """
    signal: Signal = (input,) if isinstance(input, FeatureState) else tuple(input)
    checker = _Checker(tree, grammar)
    if grammar is not None and isinstance(tree, Nonterminal) and tree.symbol != grammar.start:
        raise TreeError(f"the root is {tree.symbol} but the grammar starts at {grammar.start}", tree.symbol)
    out, params, flops = checker.visit(tree, (), signal, 1)
    if len(out) != 1:
        raise TreeError(f"the network ends in {len(out)} branches; it must end in one tensor", "<root>")
    return CheckedTree(tree, signal, out, checker.facts, params, flops)

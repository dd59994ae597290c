"""Is a grammar consistent? Expectation matrix and spectral radius (paper App. A.4) per guard context."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from functools import cache
from typing import NamedTuple

import numpy as np

from einspace.errors import EinspaceError, GrammarError
from einspace.grammar.model import (
    Alternative,
    Grammar,
    ItemVisitor,
    OpItem,
    ParallelItem,
    RepeatItem,
    SymbolItem,
    format_alternative,
)
from einspace.ops.registry import get_op
from einspace.state import MODES, RANK_OF_MODE, FeatureState, Signal, describe

__all__ = ["GrammarAnalysis", "analyse", "critical_probability", "format_analysis", "label_text"]

Context = tuple[str, int]  # (mode, branching factor b): everything a guard can see except shapes
Label = tuple[str, Context]  # a non-terminal at a context: one type of the branching process
Dist = dict[Context, float]

_TOLERANCE = 1e-12
_MAX_SWEEPS = 10_000
_MAX_LABELS = 5_000


@dataclass(frozen=True, eq=False)
class GrammarAnalysis:
    """The branching process of a grammar, with (symbol, context) pairs as its types.

    `matrix[i, j]` is the expected number of `labels[j]` one expansion of `labels[i]` produces
    directly; `terminals[i]` the expected number of terminals. The grammar is consistent
    (finite derivations with probability one, finite expected size) iff the spectral radius is
    below 1 and no reachable label lacks a finite derivation (`infinite`, e.g. `S -> S S`
    with nothing else). Expectations are None when it is inconsistent. `symbol_matrix` is the
    paper's matrix over plain symbols: the context rows of a symbol averaged with weights
    `expected_occurrences` (uniformly when those are infinite).
    """

    start: str
    mode: str
    labels: tuple[Label, ...]
    matrix: np.ndarray
    terminals: np.ndarray
    spectral_radius: float
    consistent: bool
    infinite: tuple[Label, ...]
    derivable: bool
    expected_nonterminals: float | None
    expected_terminals: float | None
    expected_occurrences: dict[str, float] | None
    symbols: tuple[str, ...]
    symbol_matrix: np.ndarray
    taken: frozenset[tuple[int, int]]  # (rule, alternative) indices that can be taken from the start


def label_text(label: Label) -> str:
    """`M@im` for b = 1, `Branches@col,b=4` otherwise."""
    symbol, (mode, b) = label
    return f"{symbol}@{mode}" if b == 1 else f"{symbol}@{mode},b={b}"


@cache
def _signal(context: Context) -> Signal:
    """A stand-in signal with the context's mode, rank and b, so guards use Grammar.rule_for itself."""
    mode, b = context
    return (FeatureState((1,) * RANK_OF_MODE[mode], mode),) * b


class _Step(NamedTuple):
    """What one item does at one context, per unit of incoming probability."""

    dist: Dist  # output contexts; mass < 1 where the item fails or never returns
    children: dict[Label, float]  # non-terminals it puts in the tree
    terminals: float
    stuck: float = 0.0  # probability that it never returns (a symbol with no finite derivation)


_FAIL = _Step({}, {}, 0.0)


class _Analyser(ItemVisitor[_Step]):
    """Fixed-point iteration of output contexts, then one expansion per reachable label.

    Approximations, mirroring a sampler that renormalises over what is feasible: an op draws
    uniformly among the argument choices its `abstract` accepts; where an item cannot apply
    (no feasible choice, b mismatching a parallel or repeat item, no rule whose guard holds)
    that mass is dropped and the rule's alternatives are renormalised over what survives. The
    contexts after a symbol follow its output distribution conditioned on termination. A symbol
    with no finite derivation is not a failure but an infinite subtree (`infinite`): its mass
    is kept, so that its children still count and the grammar is reported inconsistent.
    """

    def __init__(self, grammar: Grammar) -> None:
        self.grammar = grammar
        self.out: dict[Label, Dist] = {}
        self.order: list[Label] = []
        self.infinite: set[Label] = set()
        self.ops: dict[tuple[OpItem, Context], tuple[Context, ...]] = {}

    def note(self, label: Label) -> None:
        if label not in self.out:
            if len(self.out) >= _MAX_LABELS:  # its matrices grow with the square of the pairs
                raise GrammarError(
                    f"the consistency analysis stops at {_MAX_LABELS} (symbol, context) pairs and {label[0]} "
                    "here is one more; sample and search skip the analysis with --allow-inconsistent "
                    "(`allow_inconsistent: true` in an experiment file)",
                    self.grammar.rules_for(label[0])[0].location,
                )
            self.out[label] = {}
            self.order.append(label)

    def op_results(self, item: OpItem, context: Context) -> tuple[Context, ...]:
        key = (item, context)
        if key not in self.ops:
            op, (mode, b) = get_op(item.name), context
            results = (op.abstract(mode, b, dict(args)) for args in item.choices)
            self.ops[key] = tuple(r for r in results if r is not None)
        return self.ops[key]

    def op(self, item: OpItem, context: Context) -> _Step:
        results = self.op_results(item, context)
        dist: Dist = {}
        for r in results:
            dist[r] = dist.get(r, 0.0) + 1.0 / len(results)
        return _Step(dist, {}, 1.0)

    def symbol(self, item: SymbolItem, context: Context) -> _Step:
        label = (item.name, context)
        self.note(label)
        if label in self.infinite:
            return _Step({}, {label: 1.0}, 0.0, 1.0)
        return _Step(dict(self.out[label]), {label: 1.0}, 0.0)

    def parallel(self, item: ParallelItem, context: Context) -> _Step:
        mode, b = context
        if b != len(item.items):
            return _FAIL
        children: dict[Label, float] = {}
        terminals, done, alive, first = 0.0, 1.0, 1.0, None
        for sub in item.items:
            step = self.visit(sub, (mode, 1))
            single = {c: p for c, p in step.dist.items() if c[1] == 1}  # a branch cannot branch again
            done *= sum(single.values())
            alive *= sum(single.values()) + step.stuck
            first = single if first is None else first
            _accumulate(children, step.children, 1.0)
            terminals += step.terminals
        if alive == 0.0:
            return _FAIL
        total = sum(first.values()) if first else 0.0
        dist = {(m, b): p * done / total for (m, _), p in first.items()} if done > 0 else {}
        return _Step(dist, children, terminals, alive - done)

    def repeat(self, item: RepeatItem, context: Context) -> _Step:
        mode, b = context
        if item.times is not None and item.times != b:
            return _FAIL
        step = self.visit(item.item, (mode, 1))
        dist = {(m, b): p for (m, one), p in step.dist.items() if one == 1}
        return _Step(dist, step.children, step.terminals, step.stuck)

    def expand(self, label: Label) -> tuple[Dist, dict[Label, float], float, float]:
        """One expansion of a label: output contexts given termination, expected children and
        terminals given no failure, and the probability of no failure (0: it cannot be derived)."""
        symbol, context = label
        rule = self.grammar.rule_for(symbol, _signal(context))
        out: Dist = {}
        sink: list = [0.0, {}, 0.0]  # [mass, mass-weighted children, mass-weighted terminals]
        for alt in rule.alternatives if rule else ():
            if alt.probability <= 0.0:
                continue
            for c, (m, ch, t) in self.through(alt, context, alt.probability, sink).items():
                out[c] = out.get(c, 0.0) + m
                _carry(sink, 0.0, ch, t, _FAIL, 1.0)
        done = sum(out.values())
        alive = done + sink[0]
        if alive <= 0.0:
            return {}, {}, 0.0, 0.0
        dist = {c: p / done for c, p in out.items()} if done > 0 else {}
        return dist, _scaled(sink[1], 1 / alive), sink[2] / alive, alive

    def through(self, alt: Alternative, context: Context, mass: float, sink: list) -> dict[Context, list]:
        """Carry `mass` at `context` through the items of one alternative: the [mass, children,
        terminals] reaching each output context; what never returns is added to `sink`."""
        state: dict[Context, list] = {context: [mass, {}, 0.0]}
        for it in alt.items:
            after: dict[Context, list] = {}
            for c, (m, ch, t) in state.items():
                step = self.visit(it, c)
                for c2, q in step.dist.items():
                    _carry(after.setdefault(c2, [0.0, {}, 0.0]), m, ch, t, step, q)
                if step.stuck > 0.0:
                    _carry(sink, m, ch, t, step, step.stuck)
            state = after
        return state

    def taken(self, labels: Iterable[Label]) -> set[tuple[int, int]]:
        """(rule index, alternative index) of every alternative that can complete (or run on
        forever) at one of `labels`: the others are never taken from this start."""
        position = {id(rule): i for i, rule in enumerate(self.grammar.rules)}
        found: set[tuple[int, int]] = set()
        for symbol, context in labels:
            rule = self.grammar.rule_for(symbol, _signal(context))
            for j, alt in enumerate(rule.alternatives if rule else ()):
                sink: list = [0.0, {}, 0.0]
                if self.through(alt, context, 1.0, sink) or sink[0] > 0.0:
                    found.add((position[id(rule)], j))
        return found

    def solve(self, start: Label) -> None:
        """Iterate output distributions from zero mass (Gauss-Seidel) until they stop changing,
        then mark as infinite the labels left without output that can be expanded at all."""
        self.note(start)
        for _ in range(_MAX_SWEEPS):
            known, change, i = len(self.order), 0.0, 0
            while i < len(self.order):
                label = self.order[i]
                new = self.expand(label)[0]
                old = self.out[label]
                change = max([change] + [abs(new.get(c, 0.0) - old.get(c, 0.0)) for c in {*new, *old}])
                self.out[label] = new
                i += 1
            if change < _TOLERANCE and len(self.order) == known:
                break
        self.infinite = {label for label in self.order if not self.out[label]}
        while True:  # greatest fixed point: drop those that fail before reaching an infinite label
            dead = {label for label in self.infinite if self.expand(label)[3] == 0.0}
            if not dead:
                return
            self.infinite -= dead


def _carry(entry: list, m: float, ch: dict[Label, float], t: float, step: _Step, q: float) -> None:
    """Move probability q of a path (mass m, weighted children ch and terminals t) through a step."""
    entry[0] += m * q
    _accumulate(entry[1], ch, q)
    _accumulate(entry[1], step.children, m * q)
    entry[2] += t * q + step.terminals * m * q


def _accumulate(into: dict[Label, float], source: dict[Label, float], scale: float) -> None:
    for key, value in source.items():
        into[key] = into.get(key, 0.0) + value * scale


def _scaled(d: dict[Label, float], scale: float) -> dict[Label, float]:
    return {k: v * scale for k, v in d.items()}


def analyse(grammar: Grammar, mode: str = "im") -> GrammarAnalysis:
    """The expectation matrix of `grammar` started at its start symbol on a `mode` input (b = 1)."""
    if mode not in MODES:
        raise EinspaceError(f"unknown mode {mode!r}; expected one of {', '.join(MODES)}")
    analyser = _Analyser(grammar)
    start: Label = (grammar.start, (mode, 1))
    analyser.solve(start)
    rows = {label: analyser.expand(label) for label in analyser.order}
    reachable, todo = {start}, [start]  # keep only labels reached with positive expected count
    while todo:
        for child, count in rows[todo.pop()][1].items():
            if count > 0.0 and child not in reachable:
                reachable.add(child)
                todo.append(child)
    rank = {s: i for i, s in enumerate(grammar.nonterminals)}
    labels = tuple(sorted(reachable, key=lambda x: (rank.get(x[0], -1), x[0], MODES.index(x[1][0]), x[1][1])))
    index = {label: i for i, label in enumerate(labels)}
    n = len(labels)
    matrix, terminals = np.zeros((n, n)), np.zeros(n)
    for label in labels:
        _, children, t, _ = rows[label]
        terminals[index[label]] = t
        for child, count in children.items():
            matrix[index[label], index[child]] += count
    rho = float(max(abs(np.linalg.eigvals(matrix)))) if n else 0.0
    infinite = tuple(label for label in labels if label in analyser.infinite)
    consistent = rho < 1.0 and not infinite
    s = index[start]
    nonterminals = terminal_count = per_symbol = None
    weights = np.ones(n)
    if consistent:
        system = np.eye(n) - matrix
        nonterminals = float(np.linalg.solve(system, np.ones(n))[s])
        terminal_count = float(np.linalg.solve(system, terminals)[s])
        unit = np.zeros(n)
        unit[s] = 1.0
        weights = np.linalg.solve(system.T, unit)  # expected occurrences of each label
        per_symbol = {}
        for label, w in zip(labels, weights, strict=True):
            per_symbol[label[0]] = per_symbol.get(label[0], 0.0) + float(w)
    symbols = tuple(dict.fromkeys(label[0] for label in labels))
    member = np.array([[label[0] == sym for label in labels] for sym in symbols], dtype=float)
    weighted = member * weights  # every reachable label has positive expected occurrences
    weighted /= weighted.sum(axis=1, keepdims=True)
    symbol_matrix = weighted @ matrix @ member.T
    return GrammarAnalysis(
        start=grammar.start,
        mode=mode,
        labels=labels,
        matrix=matrix,
        terminals=terminals,
        spectral_radius=rho,
        consistent=consistent,
        infinite=infinite,
        derivable=bool(analyser.out[start]),
        expected_nonterminals=nonterminals,
        expected_terminals=terminal_count,
        expected_occurrences=per_symbol,
        symbols=symbols,
        symbol_matrix=symbol_matrix,
        taken=frozenset(analyser.taken(labels)),
    )


def critical_probability(
    grammar: Grammar, symbol: str, alternative: int, mode: str = "im", tol: float = 1e-4
) -> float | None:
    """The probability of `symbol`'s alternative `alternative` at which ρ crosses 1 (bisection).

    The others keep their ratios (Grammar.with_probability). None when ρ is on the same side of
    1 at both ends of [0, 1], e.g. when the alternative does not affect recursion.
    """

    def supercritical(p: float) -> bool:
        return not analyse(grammar.with_probability(symbol, alternative, p), mode).consistent

    lo, hi = 0.0, 1.0
    at_lo = supercritical(lo)
    if at_lo == supercritical(hi):
        return None
    while hi - lo > tol:
        mid = (lo + hi) / 2
        if supercritical(mid) == at_lo:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def format_analysis(a: GrammarAnalysis, max_rows: int = 40, contexts: bool = False) -> str:
    """A report for `einspace check`: the paper-style matrix by symbol, then (with `contexts`)
    each (symbol, context) pair's children."""
    lines = [f"Consistency (paper App. A.4): start {a.start}, input mode {a.mode}"]
    if not a.derivable and not a.infinite:
        lines.append(f"WARNING: {a.start} cannot be derived from a {a.mode} input (no feasible choice)")
    syms = a.symbols[:max_rows]
    width = max([len(s) for s in syms] + [6])
    lines.append("Expectation matrix by symbol (row: expected children of one expansion of the row symbol):")
    lines.append(" " * (width + 2) + " ".join(f"{s:>{width}}" for s in syms))
    for sym, row in zip(syms, a.symbol_matrix, strict=False):
        lines.append(f"  {sym:<{width}}" + " ".join(f"{v:>{width}.3f}" for v in row[: len(syms)]))
    names = [label_text(label) for label in a.labels] if contexts else []
    if contexts:
        lines.append(f"By context ({len(a.labels)} (symbol, context) pairs; children of one expansion):")
    pad = max(len(t) for t in names[:max_rows]) if names else 0
    for i, name in enumerate(names[:max_rows]):
        parts = [f"{names[j]} {a.matrix[i, j]:.3f}" for j in np.flatnonzero(a.matrix[i])]
        parts += [f"terminals {a.terminals[i]:.3f}"] if a.terminals[i] else []
        line = f"  {name:<{pad}} ->"
        for part in parts:  # wrap between entries, never inside one
            if len(line) + len(part) > 100 and not line.endswith("->"):
                lines.append(line + ",")
                line = " " * (pad + 5)
            line += ("" if line.endswith(("->", " ")) else ",") + " " + part
        lines.append(line)
    if len(names) > max_rows:
        lines.append(f"  ... {len(names) - max_rows} more")
    lines.append(f"Spectral radius rho = {a.spectral_radius:.4f}")
    if a.consistent:
        lines.append("Consistent: yes (rho < 1: derivations are finite with probability one)")
        lines.append(f"Expected non-terminal nodes: {a.expected_nonterminals:.2f}")
        lines.append(f"Expected terminal nodes: {a.expected_terminals:.2f}")
    else:
        lines.append("Consistent: NO")
        if a.infinite:
            never = ", ".join(label_text(label) for label in a.infinite[:6])
            more = f" and {len(a.infinite) - 6} more" if len(a.infinite) > 6 else ""
            lines.append(f"WARNING: no finite derivation exists for {never}{more}: sampling would never end")
        if a.spectral_radius >= 1.0:
            lines.append(f"WARNING: rho = {a.spectral_radius:.4f} >= 1: derivations may never end and the")
            lines.append(
                "         expected size is infinite; raise the probability of terminating alternatives"
            )
    return "\n".join(lines)


def require_consistent(grammar: Grammar, input: FeatureState, allow: bool = False) -> None:
    """Refuse a grammar that derives no tree from `input`'s mode (a col grammar given images), and,
    unless `allow`, one whose derivations may never end (rho >= 1): sampling from it mostly hits
    the size limits, so its trees say more about the limits than the grammar. `allow` also lets a
    grammar too large to analyse through."""
    mode = input.mode
    try:
        analysis = analyse(grammar, mode)
    except GrammarError:
        if allow:
            return
        raise
    if not analysis.derivable and not analysis.infinite:
        raise EinspaceError(
            f"grammar {grammar.path} derives no tree from the input {describe((input,))}: no derivation of "
            f"{grammar.start} applies to {mode}-mode features (`einspace check {grammar.path}` says which "
            "modes it takes)"
        )
    if not analysis.consistent and not allow:
        raise EinspaceError(
            f"{grammar.path} is inconsistent in {mode} mode (spectral radius {analysis.spectral_radius:.4g} "
            ">= 1): its derivations may never end, so samples would mostly be cut by the limits. Raise "
            "the probability of terminating alternatives (`einspace check` shows the analysis), or "
            "allow it explicitly (--allow-inconsistent; `allow_inconsistent: true` in an experiment)"
        )


def never_taken(grammar: Grammar, analyses: Iterable[GrammarAnalysis]) -> list[str]:
    """Alternatives no analysed start mode can ever take (a guard never true where the symbol
    occurs, a repeat count or a parallel width that never matches b, operations that never
    apply), each as `file:line:col: Symbol -> alternative` with the reason in general terms."""
    taken: set[tuple[int, int]] = set()
    for analysis in analyses:
        taken |= analysis.taken
    lines = []
    for i, rule in enumerate(grammar.rules):
        guard = f" if {' and '.join(map(str, rule.guard))}" if rule.guard else ""
        for j, alt in enumerate(rule.alternatives):
            if (i, j) not in taken:
                where = alt.location or rule.location
                lines.append(f"{where}: {rule.symbol}{guard} -> {format_alternative(alt)}")
    return lines

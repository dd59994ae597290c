"""Inside probabilities over abstract signals: how likely each symbol derives each output structure.

The exact sampling mode (`einspace.sampling.exact`) draws a tree's *structure* from these tables.
An abstract signal is the mode of each branch, e.g. `("im",)` or `("im", "col")`: it is what the
guards read (mode, b and rank, the rank following from the mode) and what each operation's
`abstract(mode, b, args)` contract maps. For a symbol, an abstract input and a height h, the tables
hold, for every abstract output, the total PCFG probability of the derivations of height at most h
(non-terminal levels) whose guards hold and whose operations accept the modes and branch counts
they meet. Shapes are not part of the abstraction: this is an over-approximation of validity, and
the exact sampler rejects the drafts whose shapes do not fit.

Operations are trusted to say through `abstract` how they map modes and branch counts, and a
signal whose branches differ in mode is offered to none of them (every built-in operation needs one
mode across its branches); a registry-driven test checks both for the built-in operations.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from einspace.errors import EinspaceError
from einspace.grammar.model import Grammar, Item, OpItem, ParallelItem, RepeatItem, Rule, SymbolItem
from einspace.ops.registry import Args, get_op
from einspace.state import RANK_OF_MODE, FeatureState, Signal

__all__ = ["AbstractSignal", "InsideTables", "abstract_of", "inside_tables"]

#: One mode per branch: the part of a signal guards and operation contracts can see.
AbstractSignal = tuple[str, ...]
#: Probability mass per abstract output signal.
Dist = dict[AbstractSignal, float]


def abstract_of(signal: Signal) -> AbstractSignal:
    return tuple(state.mode for state in signal)


def _stand_in(signal: AbstractSignal) -> Signal:
    """A concrete signal with these modes and their ranks, for `Grammar.rule_for`."""
    return tuple(FeatureState((1,) * RANK_OF_MODE[mode], mode) for mode in signal)


@dataclass(frozen=True)
class _OpTable:
    """An operation item at one abstract input: the grid points by abstract output."""

    by_output: dict[AbstractSignal, tuple[Args, ...]]
    dist: Dist  # output -> share of the grid that leads there


class InsideTables:
    """`symbol(name, signal, h)`: abstract outputs of derivations of height <= h, with their
    probabilities; built once for every (symbol, abstract signal) pair reachable from the input.

    Also the quantities top-down sampling needs: `sequence` (the probability that the items of an
    alternative from position j on lead from one abstract signal to another) and `op_table`.
    """

    def __init__(self, grammar: Grammar, start: AbstractSignal, max_height: int):
        if max_height < 0:
            raise EinspaceError(f"max_height must be non-negative, got {max_height}")
        self.grammar = grammar
        self.start = start
        self.max_height = max_height
        self._rules: dict[tuple[str, AbstractSignal], Rule | None] = {}
        self._ops: dict[tuple[int, AbstractSignal], _OpTable] = {}
        self._sequences: dict[tuple[int, int, AbstractSignal, int], Dist] = {}
        self._symbols: dict[tuple[str, AbstractSignal], list[Dist]] = {}
        for pair in self._reachable():
            self._symbols[pair] = [{}]
        for height in range(1, max_height + 1):
            for (name, signal), levels in self._symbols.items():
                levels.append(self._expand(name, signal, height))

    # ------------------------------------------------------------------ queries

    def rule(self, name: str, signal: AbstractSignal) -> Rule | None:
        key = (name, signal)
        if key not in self._rules:
            self._rules[key] = self.grammar.rule_for(name, _stand_in(signal))
        return self._rules[key]

    def symbol(self, name: str, signal: AbstractSignal, height: int) -> Dist:
        """Outputs of `name` from `signal` within `height` levels (empty where it cannot be derived)."""
        if height <= 0:
            return {}
        levels = self._symbols.get((name, signal))
        if levels is None:
            raise EinspaceError(f"internal: ({name}, {signal}) was not found reachable")
        return levels[min(height, self.max_height)]

    def sequence(self, alternative: tuple[Item, ...], j: int, signal: AbstractSignal, height: int) -> Dist:
        """Outputs of items j, j+1, ... of an alternative applied in turn to `signal`, each symbol
        among them within `height` levels."""
        key = (id(alternative), j, signal, height)
        found = self._sequences.get(key)
        if found is not None:
            return found
        if j == len(alternative):
            result = {signal: 1.0}
        else:
            result = {}
            for middle, p in self.item(alternative[j], signal, height).items():
                for out, q in self.sequence(alternative, j + 1, middle, height).items():
                    result[out] = result.get(out, 0.0) + p * q
        self._sequences[key] = result
        return result

    def item(self, item: Item, signal: AbstractSignal, height: int) -> Dist:
        if isinstance(item, SymbolItem):
            return self.symbol(item.name, signal, height)
        if isinstance(item, OpItem):
            return self.op_table(item, signal).dist
        if isinstance(item, ParallelItem):
            if len(signal) != len(item.items):
                return {}
            combined: Dist = {(): 1.0}
            for sub, mode in zip(item.items, signal, strict=True):
                branch = {out: p for out, p in self.item(sub, (mode,), height).items() if len(out) == 1}
                combined = {a + b: p * q for a, p in combined.items() for b, q in branch.items()}
            return combined
        return self._repeat(item, signal, height)

    def _repeat(self, item: RepeatItem, signal: AbstractSignal, height: int) -> Dist:
        times = len(signal) if item.times is None else item.times
        if len(signal) != times or len(set(signal)) != 1:
            return {}
        inner = self.item(item.item, signal[:1], height)
        return {out * times: p for out, p in inner.items() if len(out) == 1}

    def op_table(self, item: OpItem, signal: AbstractSignal) -> _OpTable:
        key = (id(item), signal)
        table = self._ops.get(key)
        if table is None:
            table = self._ops[key] = _op_table(item, signal)
        return table

    # ------------------------------------------------------------------ construction

    def _expand(self, name: str, signal: AbstractSignal, height: int) -> Dist:
        rule = self.rule(name, signal)
        result: Dist = {}
        for alternative in rule.alternatives if rule else ():
            if alternative.probability <= 0.0:
                continue
            for out, p in self.sequence(alternative.items, 0, signal, height - 1).items():
                result[out] = result.get(out, 0.0) + alternative.probability * p
        return result

    def _reachable(self) -> list[tuple[str, AbstractSignal]]:
        """Every (symbol, abstract signal) a derivation from the start can meet, whatever the height:
        a fixed point of what each pair can output (a set-valued version of the tables)."""
        start = (self.grammar.start, self.start)
        outputs: dict[tuple[str, AbstractSignal], set[AbstractSignal]] = {start: set()}
        changed = True
        while changed:
            known = len(outputs)
            changed = False
            for pair in list(outputs):
                rule = self.rule(*pair)
                found: set[AbstractSignal] = set()
                for alternative in rule.alternatives if rule else ():
                    current = {pair[1]}
                    for item in alternative.items:
                        current = {out for signal in current for out in self._outputs(item, signal, outputs)}
                    found |= current
                if not found <= outputs[pair]:
                    outputs[pair] |= found
                    changed = True
                if len(outputs) > _MAX_PAIRS:
                    raise EinspaceError(
                        f"grammar {self.grammar.path}: more than {_MAX_PAIRS} (symbol, modes) pairs; "
                        "the exact sampling mode cannot tabulate it"
                    )
            changed = changed or len(outputs) > known
        return list(outputs)

    def _outputs(
        self,
        item: Item,
        signal: AbstractSignal,
        outputs: dict[tuple[str, AbstractSignal], set[AbstractSignal]],
    ) -> set[AbstractSignal]:
        """What an item can output from `signal` as far as the fixed point knows; notes new pairs."""
        if isinstance(item, SymbolItem):
            pair = (item.name, signal)
            if pair not in outputs:
                outputs[pair] = set()
            return outputs[pair]
        if isinstance(item, OpItem):
            return set(self.op_table(item, signal).dist)
        if isinstance(item, ParallelItem):
            if len(signal) != len(item.items):
                return set()
            combined: set[AbstractSignal] = {()}
            for sub, mode in zip(item.items, signal, strict=True):
                branch = {out for out in self._outputs(sub, (mode,), outputs) if len(out) == 1}
                combined = {a + b for a in combined for b in branch}
            return combined
        times = len(signal) if item.times is None else item.times
        if len(signal) != times or len(set(signal)) != 1:
            return set()
        return {out * times for out in self._outputs(item.item, signal[:1], outputs) if len(out) == 1}


#: More (symbol, modes) pairs than any sensible grammar has: a guard against runaway tables.
_MAX_PAIRS = 10_000


def _op_table(item: OpItem, signal: AbstractSignal) -> _OpTable:
    """Grid points of an operation item by the abstract output their `abstract` contract gives."""
    by_output: dict[AbstractSignal, list[Args]] = {}
    if len(set(signal)) == 1:  # mixed modes: no operation takes them
        op = get_op(item.name)
        for args in item.choices:
            result = op.abstract(signal[0], len(signal), dict(args))
            if result is not None:
                mode, b = result
                by_output.setdefault((mode,) * b, []).append(args)
    size = len(item.choices)
    return _OpTable(
        {out: tuple(args) for out, args in by_output.items()},
        {out: len(args) / size for out, args in by_output.items()},
    )


@lru_cache(maxsize=16)
def inside_tables(grammar: Grammar, start: AbstractSignal, max_height: int) -> InsideTables:
    """Tables for a grammar, an abstract input and a height, built once and shared (they are
    read-only after construction, apart from memoised sequences)."""
    return InsideTables(grammar, start, max_height)

"""Frozen objects a grammar file becomes: rules, alternatives, items, guards, probabilities."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar, Generic, TypeVar

from einspace.errors import EinspaceError, Location
from einspace.ops.registry import Args
from einspace.state import Signal

#: Attributes a guard may test, and how each is read off a signal.
GUARD_ATTRIBUTES = ("mode", "b", "rank")


def signal_attribute(signal: Signal, attribute: str) -> Any:
    """The value of a guard attribute for a signal (None when branches disagree on it)."""
    if attribute == "b":
        return len(signal)
    if attribute == "mode":
        modes = {s.mode for s in signal}
        return modes.pop() if len(modes) == 1 else None
    if attribute == "rank":
        ranks = {len(s.shape) for s in signal}
        return ranks.pop() if len(ranks) == 1 else None
    raise EinspaceError(f"unknown guard attribute {attribute!r}")


@dataclass(frozen=True)
class SymbolItem:
    """A non-terminal on a right-hand side."""

    kind: ClassVar[str] = "symbol"
    children: ClassVar[tuple[()]] = ()
    name: str
    location: Location | None = field(default=None, compare=False)


@dataclass(frozen=True)
class OpItem:
    """A terminal operation with its argument grid, e.g. `linear(d = 16 | 32)`.

    `choices` lists every argument combination of the grid (the product of the axes; linked
    axes such as `(k, s, p) = (3, 1, 1) | ...` count as one axis). A choice is drawn
    uniformly from the feasible ones, which makes each independent axis uniform too.
    """

    kind: ClassVar[str] = "op"
    children: ClassVar[tuple[()]] = ()
    name: str
    choices: tuple[Args, ...] = ((),)
    location: Location | None = field(default=None, compare=False)


@dataclass(frozen=True)
class ParallelItem:
    """`(X, Y)`: the incoming signal must have one branch per item; item i derives branch i."""

    kind: ClassVar[str] = "parallel"
    items: tuple[SymbolItem | OpItem, ...]
    location: Location | None = field(default=None, compare=False)

    @property
    def children(self) -> tuple[SymbolItem | OpItem, ...]:
        return self.items


@dataclass(frozen=True)
class RepeatItem:
    """`(X) * b` or `(X) * 4`: one derivation of X, instantiated once per branch.

    `times` None means "the incoming branching factor b". All branches must share one state.
    Each instance gets its own weights: repetition shares the structure, never parameters.
    """

    kind: ClassVar[str] = "repeat"
    item: SymbolItem | OpItem
    times: int | None = None
    location: Location | None = field(default=None, compare=False)

    @property
    def children(self) -> tuple[SymbolItem | OpItem]:
        return (self.item,)


Item = SymbolItem | OpItem | ParallelItem | RepeatItem

R = TypeVar("R")


def walk_items(items: Iterable[Item]) -> Iterator[Item]:
    """Each item, followed by those nested in it (the `children` of parallel and repeat items)."""
    for item in items:
        yield item
        yield from walk_items(item.children)


class ItemVisitor(Generic[R]):
    """Handlers per grammar item kind, called by name as `einspace.tree.TreeVisitor` does for
    tree nodes: `visit(item, *args)` calls the subclass's `symbol`, `op`, `parallel` or `repeat`
    method (the item's `kind`) with the same arguments, or `default` for a kind it does not
    handle. The samplers' inner loops keep plain `isinstance` tests: they run per item per draw,
    where a lookup by name costs."""

    def visit(self, item: Item, *args: Any) -> R:
        return self.handler(item)(item, *args)

    def handler(self, item: Item) -> Callable[..., R]:
        return getattr(self, item.kind, self.default)

    def default(self, item: Item, *args: Any) -> R:
        raise EinspaceError(f"{type(self).__name__} has no handler for {item.kind} items")


@dataclass(frozen=True)
class Alternative:
    """One right-hand side and its probability (normalised within its rule)."""

    items: tuple[Item, ...]
    probability: float
    location: Location | None = field(default=None, compare=False)


@dataclass(frozen=True)
class Condition:
    """One test of a guard: `attribute operator values`, e.g. `b in (4, 8)` or `mode == im`."""

    attribute: str
    operator: str  # "==", "!=" or "in"
    values: tuple[Any, ...]

    def holds(self, signal: Signal) -> bool:
        value = signal_attribute(signal, self.attribute)
        if self.operator == "!=":
            return value is not None and value not in self.values
        return value in self.values

    def __str__(self) -> str:
        if self.operator == "in":
            return f"{self.attribute} in ({', '.join(map(str, self.values))})"
        return f"{self.attribute} {self.operator} {self.values[0]}"


@dataclass(frozen=True)
class Rule:
    """All alternatives of one symbol under one guard (an empty guard always holds)."""

    symbol: str
    guard: tuple[Condition, ...]
    alternatives: tuple[Alternative, ...]
    location: Location | None = field(default=None, compare=False)

    def applies(self, signal: Signal) -> bool:
        return all(c.holds(signal) for c in self.guard)


@dataclass(frozen=True)
class Grammar:
    """A validated, parameterised probabilistic grammar.

    For a symbol, the rules are tried in file order and the first whose guard holds is used
    (pattern-matching semantics); when none holds, the symbol cannot be derived there.
    """

    start: str
    rules: tuple[Rule, ...]
    path: str = "<string>"
    source: str = field(default="", compare=False, repr=False)
    #: Every file the grammar was read from: the files it extends, then its own.
    files: tuple[str, ...] = field(default=(), compare=False, repr=False)

    def __post_init__(self) -> None:
        by_symbol: dict[str, list[Rule]] = {}
        for rule in self.rules:
            by_symbol.setdefault(rule.symbol, []).append(rule)
        object.__setattr__(self, "_by_symbol", {k: tuple(v) for k, v in by_symbol.items()})

    @property
    def nonterminals(self) -> tuple[str, ...]:
        """Non-terminal symbols in order of first definition."""
        return tuple(self._by_symbol)  # type: ignore[attr-defined]

    def rules_for(self, symbol: str) -> tuple[Rule, ...]:
        return self._by_symbol.get(symbol, ())  # type: ignore[attr-defined]

    def rule_for(self, symbol: str, signal: Signal) -> Rule | None:
        """The rule that applies to `symbol` in `signal`, or None if no guard holds."""
        for rule in self._by_symbol.get(symbol, ()):  # type: ignore[attr-defined]
            if rule.applies(signal):
                return rule
        return None

    def with_probability(self, symbol: str, alternative: int, probability: float) -> Grammar:
        """A copy where alternative `alternative` of every rule for `symbol` has `probability`
        and the others are rescaled to keep their ratios (e.g. to sweep p(M -> C))."""
        if not 0.0 <= probability <= 1.0:
            raise EinspaceError(f"probability must be in [0, 1], got {probability}")
        rules = []
        for rule in self.rules:
            if rule.symbol == symbol:
                if not 0 <= alternative < len(rule.alternatives):
                    raise EinspaceError(f"{symbol} has no alternative {alternative}")
                rest = 1.0 - rule.alternatives[alternative].probability
                alts = []
                for i, alt in enumerate(rule.alternatives):
                    if i == alternative:
                        p = probability
                    elif rest > 0:
                        p = alt.probability * (1.0 - probability) / rest
                    else:
                        p = (1.0 - probability) / (len(rule.alternatives) - 1)
                    alts.append(replace(alt, probability=p))
                rule = replace(rule, alternatives=tuple(alts))
            rules.append(rule)
        return replace(self, rules=tuple(rules))


def _format_args(args: Args) -> str:
    def value(v: Any) -> str:
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, tuple):
            return "(" + ", ".join(map(str, v)) + ")"
        return str(v)

    return ", ".join(f"{k} = {value(v)}" for k, v in args)


class ItemFormatter(ItemVisitor[str]):
    """Items as grammar text, an operation's grid shown by its size; `einspace.grammar.writer`
    overrides `grid` to write the grid out."""

    def symbol(self, item: SymbolItem) -> str:
        return item.name

    def op(self, item: OpItem) -> str:
        return item.name + self.grid(item.choices)

    def parallel(self, item: ParallelItem) -> str:
        return "(" + ", ".join(map(self.visit, item.items)) + ")"

    def repeat(self, item: RepeatItem) -> str:
        return f"({self.visit(item.item)}) * {'b' if item.times is None else item.times}"

    def grid(self, choices: tuple[Args, ...]) -> str:
        if choices == ((),):
            return ""
        return f"({_format_args(choices[0])})" if len(choices) == 1 else f"(<{len(choices)} choices>)"


def format_item(item: Item) -> str:
    """An item as it could be written in a grammar file (grids shown by their size)."""
    return ItemFormatter().visit(item)


def format_alternative(alternative: Alternative) -> str:
    return " ".join(format_item(i) for i in alternative.items)

"""What a grammar file must mean, checked once, with the location of whatever is wrong.

The parser calls the item- and rule-level checks (`condition`, `resolve_name`,
`resolve_call`, `rule_probabilities`) as it builds each object, and `build_grammar` for the
checks that need the whole file (start symbol, rule order, reachability, productivity).

Probabilities: an alternative may end in `@ p` with 0 < p <= 1. Within one rule, the
alternatives without an explicit probability share what the explicit ones leave,
1 - sum(explicit), equally; that share must be positive, so explicit probabilities that
already sum to 1 (or more) leave no room for unmarked alternatives. When every alternative
is explicit, they must sum to 1 (within 1e-6). Each guarded rule of a symbol is a separate
distribution: its alternatives sum to 1 on their own.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

from einspace.errors import EinspaceError, GrammarError, Location
from einspace.grammar.model import (
    GUARD_ATTRIBUTES,
    Condition,
    Grammar,
    Item,
    OpItem,
    ParallelItem,
    RepeatItem,
    Rule,
    SymbolItem,
    walk_items,
)
from einspace.ops.registry import canonical_args, get_op, has_op, list_ops
from einspace.state import MODES

#: A value as written, with where it was written.
Located = tuple[Any, Location]

_SUM_TOLERANCE = 1e-6


# ---------------------------------------------------------------------------------------------
# Checks made while the parser builds each object


def condition(attribute: str, operator: str, values: Sequence[Located], location: Location) -> Condition:
    """A guard condition, once its attribute and values make sense."""
    if attribute not in GUARD_ATTRIBUTES:
        raise GrammarError(
            f"unknown guard attribute {attribute!r}; a guard can test {', '.join(GUARD_ATTRIBUTES)}"
            + _did_you_mean(attribute, GUARD_ATTRIBUTES),
            location,
        )
    for value, where in values:
        if attribute == "mode" and value not in MODES:
            raise GrammarError(f"mode is {' or '.join(MODES)}, not {value!r}", where)
        if attribute != "mode" and (type(value) is not int or value < 1):
            raise GrammarError(f"{attribute} must be a positive integer, not {value!r}", where)
    return Condition(attribute, operator, tuple(value for value, _ in values))


def resolve_name(name: str, location: Location, nonterminals: frozenset[str]) -> SymbolItem | OpItem:
    """A bare name: the non-terminal if the grammar has a rule for it, else an operation."""
    if name in nonterminals:
        return SymbolItem(name, location)
    return OpItem(name, _choices(name, [{}], location, nonterminals), location)


def resolve_call(
    name: str,
    arg_names: Sequence[str],
    grid: Sequence[Mapping[str, Any]],
    location: Location,
    nonterminals: frozenset[str],
) -> OpItem:
    """`name(args)`: an operation with an argument grid, one mapping per grid point."""
    if name in nonterminals:
        raise GrammarError(f"{name!r} is a non-terminal; only operations take arguments", location)
    for i, arg in enumerate(arg_names):
        if arg in arg_names[:i]:
            raise GrammarError(f"argument {arg!r} of {name!r} is given twice", location)
    return OpItem(name, _choices(name, grid, location, nonterminals), location)


def _choices(
    name: str, grid: Sequence[Mapping[str, Any]], location: Location, nonterminals: frozenset[str]
) -> tuple[tuple[tuple[str, Any], ...], ...]:
    if not has_op(name):
        raise GrammarError(
            f"{name!r} is neither a non-terminal with a rule nor a registered operation"
            + _did_you_mean(name, [*nonterminals, *list_ops()]),
            location,
        )
    op = get_op(name)
    choices: dict[tuple[tuple[str, Any], ...], None] = {}  # ordered, and a set: linear in the grid
    for point in grid:
        try:
            choice = canonical_args(op, point)
        except EinspaceError as exc:
            raise GrammarError(str(exc), location) from None
        if choice in choices:
            written = ", ".join(f"{k} = {v}" for k, v in choice)
            raise GrammarError(f"{name}({written}) appears twice in the argument grid", location)
        choices[choice] = None
    return tuple(choices)


def check_probability(given: Located) -> float:
    """An explicit probability, once it is in (0, 1]."""
    if not 0.0 < given[0] <= 1.0:
        raise GrammarError(f"probability must be in (0, 1], got {given[0]:g}", given[1])
    return given[0]


def rule_probabilities(explicit: Sequence[Located | None], location: Location) -> tuple[float, ...]:
    """The probability of each alternative of one rule (see the module docstring)."""
    for given in explicit:
        if given is not None:
            check_probability(given)
    total = sum(given[0] for given in explicit if given is not None)
    unmarked = sum(given is None for given in explicit)
    if unmarked == 0:
        if abs(total - 1.0) > _SUM_TOLERANCE:
            raise GrammarError(f"the probabilities of this rule sum to {total:g}, not 1", location)
        return tuple(given[0] for given in explicit if given is not None)
    share = (1.0 - total) / unmarked
    if share <= 0.0:
        raise GrammarError(
            f"explicit probabilities sum to {total:g}, leaving nothing for the {unmarked} "
            "alternative(s) without one",
            location,
        )
    return tuple(share if given is None else given[0] for given in explicit)


# ---------------------------------------------------------------------------------------------
# Checks of the whole grammar


def build_grammar(starts: Sequence[Located], rules: Sequence[Rule], path: str, source: str) -> Grammar:
    """The Grammar, after the checks that need every rule at hand."""
    start = _check_start(starts, rules, path)
    _check_rule_order(rules)
    for rule in rules:
        _check_alternatives(rule)
    grammar = Grammar(start, tuple(rules), path, source)
    _check_reachable(grammar)
    _check_productive(grammar)
    return grammar


def _check_start(starts: Sequence[Located], rules: Sequence[Rule], path: str) -> str:
    if not starts:
        raise GrammarError("no start symbol; declare one with a line such as `start S`", Location(path, 1, 1))
    (start, where), *others = starts
    if others:
        raise GrammarError(f"a second start declaration (the first is at line {where.line})", others[0][1])
    symbols = [rule.symbol for rule in rules]
    if start not in symbols:
        raise GrammarError(f"the start symbol {start!r} has no rule" + _did_you_mean(start, symbols), where)
    return start


def _check_rule_order(rules: Sequence[Rule]) -> None:
    """Operations cannot be symbols; every rule of a symbol must be able to apply somewhere."""
    earlier: dict[str, list[Rule]] = {}
    for rule in rules:
        if has_op(rule.symbol):
            message = f"{rule.symbol!r} is a registered operation and cannot have a rule"
            raise GrammarError(message, rule.location)
        for before in earlier.get(rule.symbol, []):
            line = _where(before.location, rule.location)
            if not before.guard and not rule.guard:
                message = f"a second rule for {rule.symbol} without a guard (the first is at {line})"
                raise GrammarError(message, rule.location)
            if not before.guard:
                raise GrammarError(
                    f"this rule for {rule.symbol} can never apply: the rule at {line} has no guard",
                    rule.location,
                )
            if set(before.guard) == set(rule.guard):
                guard = " and ".join(map(str, rule.guard))
                raise GrammarError(
                    f"a second rule for {rule.symbol} with the guard `{guard}` (the first is at {line})",
                    rule.location,
                )
        earlier.setdefault(rule.symbol, []).append(rule)


def _check_alternatives(rule: Rule) -> None:
    for i, alternative in enumerate(rule.alternatives):
        for item in alternative.items:
            _check_item(item)
        for before in rule.alternatives[:i]:
            if before.items == alternative.items:
                line = _where(before.location, alternative.location)
                raise GrammarError(f"this alternative repeats the one at {line}", alternative.location)


def _check_item(item: Item) -> None:
    if isinstance(item, ParallelItem) and len(item.items) < 2:
        raise GrammarError(
            "a parallel item needs at least 2 branches; write the item alone, or (X) * b to repeat it",
            item.location,
        )
    if isinstance(item, RepeatItem) and item.times is not None and item.times < 2:
        raise GrammarError(f"a repeat count must be b or at least 2, got {item.times}", item.location)


def _check_reachable(grammar: Grammar) -> None:
    reached = {grammar.start}
    todo = [grammar.start]
    while todo:
        for rule in grammar.rules_for(todo.pop()):
            for symbol in _symbols(item for alt in rule.alternatives for item in alt.items):
                if symbol not in reached:
                    reached.add(symbol)
                    todo.append(symbol)
    for symbol in grammar.nonterminals:
        if symbol not in reached:
            raise GrammarError(
                f"non-terminal {symbol} is not reachable from the start symbol {grammar.start}",
                grammar.rules_for(symbol)[0].location,
            )


def _check_productive(grammar: Grammar) -> None:
    """Every symbol must derive some string of operations (guards and shapes aside)."""
    productive: set[str] = set()
    changed = True
    while changed:
        changed = False
        for symbol in grammar.nonterminals:
            if symbol not in productive and any(
                all(s in productive for s in _symbols(alt.items))
                for rule in grammar.rules_for(symbol)
                for alt in rule.alternatives
            ):
                productive.add(symbol)
                changed = True
    stuck = [symbol for symbol in grammar.nonterminals if symbol not in productive]
    if not stuck:
        return
    # Report a symbol on the cycle that causes it (`M -> M x`), not one that merely needs it (`S -> M`):
    # follow what each stuck symbol needs until a symbol comes round again.
    path = [stuck[0]]
    while True:
        needed = [
            name
            for rule in grammar.rules_for(path[-1])
            for alt in rule.alternatives
            for name in _symbols(alt.items)
            if name not in productive
        ]
        if needed[0] in path:
            cycle = path[path.index(needed[0]) :]
            break
        path.append(needed[0])
    loop = f" (here, the cycle {' -> '.join([*cycle, cycle[0]])})" if len(cycle) > 1 else ""
    raise GrammarError(
        f"non-terminal {cycle[0]} never derives only operations: every alternative "
        f"needs itself or another such non-terminal{loop}",
        grammar.rules_for(cycle[0])[0].location,
    )


# ---------------------------------------------------------------------------------------------
# Helpers


def _symbols(items: Iterable[Item]) -> Iterator[str]:
    """The non-terminals named in some items, nested ones included."""
    return (item.name for item in walk_items(items) if isinstance(item, SymbolItem))


def _where(earlier: Location, here: Location) -> str:
    """Where an earlier definition is, seen from `here`: `line 12`, or `file:12:5` in another file
    of a composed grammar."""
    return f"line {earlier.line}" if earlier.path == here.path else str(earlier)


def _did_you_mean(name: str, candidates: Iterable[str]) -> str:
    """Close matches, ignoring case: symbols are often capitalised, operations rarely."""
    by_folded = {c.casefold(): c for c in candidates}
    close = [by_folded[c] for c in difflib.get_close_matches(name.casefold(), list(by_folded), n=3)]
    return f"; did you mean {' or '.join(repr(c) for c in close)}?" if close else ""

"""Grammars that extend grammars: the rules of a base grammar, then what an extending file changes.

An extending file (`extends einspace`) starts from every rule of its base, in the base's
order. Then, in its own file order:

- `X -> ...` for a symbol the base defines replaces all of the base's rules for X (every
  guarded variant), where they stood; a symbol the base lacks is added at the end;
- `X += a | b @ 0.05` adds alternatives to every rule of X (or, with a guard, `X if mode == im
  += ...`, to the rule with exactly that guard). An added alternative takes the probability
  written after it, or without one the share it would have as one more equal alternative,
  1 / (n + k) for n existing and k added; the existing alternatives are scaled down together
  to make room, keeping their ratios;
- `X @= a @ 0.4 | b @ 0.1` sets the probabilities of existing alternatives (written as in the
  base) and scales the others to fill the rest, keeping their ratios;
- `start Y` replaces the base's start symbol.

Every rule and alternative keeps the location of the file that wrote it, which is how
`einspace check` says where each came from.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from einspace.errors import GrammarError, Location
from einspace.grammar.model import Alternative, Condition, Grammar, Item, Rule, format_alternative

__all__ = ["Change", "compose"]

_SUM_TOLERANCE = 1e-6


@dataclass(frozen=True)
class Change:
    """`X += ...` (kind "add") or `X @= ...` (kind "reweight") in an extending file.

    `alternatives` are (items, explicit probability or None, location); `guard` None means
    every rule of the symbol.
    """

    kind: str
    symbol: str
    guard: tuple[Condition, ...] | None
    alternatives: tuple[tuple[tuple[Item, ...], float | None, Location], ...]
    location: Location


def compose(base: Grammar, rules: Sequence[Rule], changes: Sequence[Change]) -> list[Rule]:
    """The rules of `base` with the extending file's own `rules`, then its `changes`, applied."""
    own: dict[str, list[Rule]] = {}
    for rule in rules:
        own.setdefault(rule.symbol, []).append(rule)
    merged: list[Rule] = []
    for rule in base.rules:
        if rule.symbol not in own:
            merged.append(rule)
        elif not any(r.symbol == rule.symbol for r in merged):
            merged.extend(own[rule.symbol])
    merged.extend(rule for rule in rules if rule.symbol not in base.nonterminals)
    for change in changes:
        targets = _targets(merged, change)
        apply = _add if change.kind == "add" else _reweight
        merged = [apply(rule, change) if i in targets else rule for i, rule in enumerate(merged)]
    return merged


def _targets(rules: list[Rule], change: Change) -> set[int]:
    """Indices of the rules a change applies to; an error when there are none."""
    of_symbol = [i for i, rule in enumerate(rules) if rule.symbol == change.symbol]
    if not of_symbol:
        symbols = sorted({rule.symbol for rule in rules})
        raise GrammarError(
            f"no rule for {change.symbol!r} to change (the grammar defines {', '.join(symbols)})",
            change.location,
        )
    if change.guard is None:
        return set(of_symbol)
    chosen = {i for i in of_symbol if set(rules[i].guard) == set(change.guard)}
    if not chosen:
        guards = "; ".join(" and ".join(map(str, rules[i].guard)) or "no guard" for i in of_symbol)
        wanted = " and ".join(map(str, change.guard))
        raise GrammarError(
            f"{change.symbol} has no rule with the guard `{wanted}` (its guards: {guards})", change.location
        )
    return chosen


def _add(rule: Rule, change: Change) -> Rule:
    count = len(rule.alternatives) + len(change.alternatives)
    added = [
        Alternative(items, 1.0 / count if p is None else p, where) for items, p, where in change.alternatives
    ]
    room = 1.0 - sum(a.probability for a in added)
    if room <= _SUM_TOLERANCE:
        raise GrammarError(
            f"the added alternatives of {rule.symbol} take probability {1 - room:g}, leaving nothing "
            "for the existing ones",
            change.location,
        )
    kept = [replace(a, probability=a.probability * room) for a in rule.alternatives]
    return replace(rule, alternatives=(*kept, *added))


def _reweight(rule: Rule, change: Change) -> Rule:
    given: dict[int, float] = {}
    for items, p, where in change.alternatives:
        if p is None:
            raise GrammarError("@= sets probabilities: write one after each alternative (`a @ 0.4`)", where)
        matches = [i for i, a in enumerate(rule.alternatives) if a.items == items]
        if not matches:
            written = " | ".join(format_alternative(a) for a in rule.alternatives)
            raise GrammarError(
                f"{rule.symbol} has no such alternative to reweight; its alternatives are: {written}", where
            )
        if matches[0] in given:
            raise GrammarError("this alternative is reweighted twice", where)
        given[matches[0]] = p
    total = sum(given.values())
    rest = sum(a.probability for i, a in enumerate(rule.alternatives) if i not in given)
    others = len(rule.alternatives) - len(given)
    if total > 1 + _SUM_TOLERANCE or (others and total >= 1 - _SUM_TOLERANCE):
        raise GrammarError(
            f"the probabilities set for {rule.symbol} sum to {total:g}, leaving "
            f"{'nothing for the other alternatives' if others else 'a sum above 1'}",
            change.location,
        )
    if not others and abs(total - 1) > _SUM_TOLERANCE:
        raise GrammarError(f"the probabilities of {rule.symbol} sum to {total:g}, not 1", change.location)
    alternatives = tuple(
        replace(a, probability=given[i] if i in given else a.probability * (1 - total) / rest)
        for i, a in enumerate(rule.alternatives)
    )
    return replace(rule, alternatives=alternatives)

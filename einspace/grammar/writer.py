"""Write a Grammar back as grammar-file text that parses to an equal grammar (one self-contained file).

Every alternative gets an explicit `@ p`; a grammar composed from several files (`extends`) is
written flattened. Argument grids are written as a product of axes when they are one, otherwise as
one linked axis over all arguments, so the grid points and their order survive the round trip.
"""

from __future__ import annotations

from itertools import product
from typing import Any

from einspace.grammar.model import Grammar, Item, ItemFormatter, Rule
from einspace.ops.registry import Args

__all__ = ["format_grammar"]


def format_grammar(grammar: Grammar, header: str = "") -> str:
    """The grammar as file text; `header` (any number of lines) is written first as `#` comments."""
    lines = [f"# {line}".rstrip() for line in header.splitlines()]
    if lines:
        lines.append("")
    lines.append(f"start {grammar.start}")
    for rule in grammar.rules:
        lines.append("")
        lines.extend(_format_rule(rule))
    return "\n".join(lines) + "\n"


def _format_rule(rule: Rule) -> list[str]:
    head = rule.symbol + (f" if {' and '.join(map(str, rule.guard))}" if rule.guard else "") + " ->"
    pad = " " * (len(head) - 1)
    alternatives = [
        " ".join(_format_item(item) for item in alt.items) + f" @ {float(alt.probability)!r}"
        for alt in rule.alternatives
    ]
    return [f"{head} {alternatives[0]}", *(f"{pad}| {text}" for text in alternatives[1:])]


class _GridWriter(ItemFormatter):
    """Items as grammar text with every grid written out, so the file reads back the same."""

    def grid(self, choices: tuple[Args, ...]) -> str:
        return _format_grid(choices)


def _format_item(item: Item) -> str:
    return _GridWriter().visit(item)


def _format_grid(choices: tuple[Args, ...]) -> str:
    if choices == ((),):
        return ""
    names = [name for name, _ in choices[0]]
    axes = [list(dict.fromkeys(args[i][1] for args in choices)) for i in range(len(names))]
    if tuple(tuple(zip(names, point, strict=True)) for point in product(*axes)) == choices:
        return (
            "("
            + ", ".join(f"{n} = " + " | ".join(map(_value, a)) for n, a in zip(names, axes, strict=True))
            + ")"
        )
    points = " | ".join("(" + ", ".join(_value(v) for _, v in args) + ")" for args in choices)
    return f"(({', '.join(names)}) = {points})"


def _value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, tuple):
        return "(" + ", ".join(map(_value, value)) + ")"
    if isinstance(value, float):
        return repr(value)
    return str(value)

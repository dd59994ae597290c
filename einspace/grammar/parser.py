"""Read grammar files: Lark parses the text, one Transformer turns it into model objects."""

from __future__ import annotations

from collections.abc import Iterator
from functools import cache
from itertools import product
from pathlib import Path
from typing import Any, NamedTuple

from lark import Lark, Token, Transformer, v_args
from lark.exceptions import UnexpectedCharacters, UnexpectedInput, UnexpectedToken, VisitError
from lark.lark import PostLex

from einspace.errors import GrammarError, GrammarSyntaxError, LocatedError, Location
from einspace.grammar import validate
from einspace.grammar.model import (
    Alternative,
    Condition,
    Grammar,
    OpItem,
    ParallelItem,
    RepeatItem,
    Rule,
    SymbolItem,
)

__all__ = ["load_grammar", "parse_grammar"]

#: How the regex terminals of pcfg.lark are named in messages; literal ones are quoted.
_TERMINAL_WORDS = {
    "NAME": "a name",
    "CALL_NAME": "a name",
    "INT": "a number",
    "FLOAT": "a number",
    "_NL": "end of line",
    "$END": "end of file",
}

#: How an unexpected token with a value is named: "unexpected name 'foo'".
_TOKEN_NOUNS = {"NAME": "name", "CALL_NAME": "name", "INT": "number", "FLOAT": "number"}


def parse_grammar(text: str, path: str = "<string>") -> Grammar:
    """Parse and validate grammar text; `path` is only used to say where errors are."""
    try:
        tree = _lark().parse(text)
        nonterminals = frozenset(str(rule.children[0]) for rule in tree.find_data("rule"))
        starts, rules = _ToModel(path, nonterminals).transform(tree)
        return validate.build_grammar(starts, rules, path, text)
    except UnexpectedInput as exc:
        raise _syntax_error(exc, path, text) from None
    except _UnclosedParen as exc:
        raise GrammarSyntaxError("'(' is never closed", _location(path, exc.token), text) from None
    except VisitError as exc:
        if isinstance(exc.orig_exc, LocatedError):
            raise _with_source(exc.orig_exc, text) from None
        raise
    except GrammarError as exc:
        raise _with_source(exc, text) from None


def load_grammar(path: str | Path) -> Grammar:
    """Read and parse a grammar file."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        reason = getattr(exc, "strerror", None) or exc
        raise GrammarError(f"cannot read grammar file {str(path)!r}: {reason}") from None
    return parse_grammar(text, str(path))


def _with_source(exc: LocatedError, text: str) -> LocatedError:
    """The same error with the caret context, which the code that raised it could not give."""
    return exc if exc.source else type(exc)(exc.message, exc.location, text)


def _location(path: str, token: Token) -> Location:
    return Location(path, token.line or 1, token.column or 1)


# ---------------------------------------------------------------------------------------------
# Lexing and parsing


class _UnclosedParen(Exception):
    """Raised by the post-lexer at end of input while a '(' is still open."""

    def __init__(self, token: Token):
        super().__init__("unclosed parenthesis")
        self.token = token


class _LineJoiner(PostLex):
    """Makes a rule one logical line, so that the meta-grammar needs no layout rules.

    Newlines inside parentheses are dropped (an argument grid may span lines), as is a
    newline followed by '|' (a continuation line). Runs of newlines become one, leading
    newlines vanish, and the input always ends with a newline. The state is local to each
    call of `process`, so one cached parser serves any number of parses.
    """

    always_accept = ("_NL",)

    def process(self, stream: Iterator[Token]) -> Iterator[Token]:
        open_parens: list[Token] = []
        pending: Token | None = None  # a newline held back until we see what follows it
        last: Token | None = None
        for token in stream:
            if token.type == "_NL":
                if not open_parens and last is not None:
                    pending = pending or token
                continue
            if pending is not None and token.type != "VBAR":
                yield pending
            pending = None
            if token.type == "LPAR":
                open_parens.append(token)
            elif token.type == "RPAR" and open_parens:
                open_parens.pop()
            last = token
            yield token
        if open_parens:
            raise _UnclosedParen(open_parens[-1])
        if last is not None:
            yield pending or Token("_NL", "", last.end_pos, last.end_line, last.end_column)


@cache
def _lark() -> Lark:
    return Lark.open(
        "pcfg.lark",
        rel_to=__file__,
        parser="lalr",
        lexer="basic",
        postlex=_LineJoiner(),
        propagate_positions=True,
    )


def _describe(terminal: str) -> str:
    if terminal in _TERMINAL_WORDS:
        return _TERMINAL_WORDS[terminal]
    return repr(_lark().get_terminal(terminal).pattern.value)


def _syntax_error(exc: UnexpectedInput, path: str, text: str) -> GrammarSyntaxError:
    """Say in words what was found and what could have come instead."""
    location = Location(path, exc.line, exc.column)
    if isinstance(exc, UnexpectedCharacters):
        return GrammarSyntaxError(f"unexpected character {exc.char!r}", location, text)
    if not isinstance(exc, UnexpectedToken):
        return GrammarSyntaxError("unexpected end of file", location, text)
    token = exc.token
    if token.type in _TOKEN_NOUNS:
        found = f"{_TOKEN_NOUNS[token.type]} {str(token)!r}"
    elif token.type == "_NL":
        found = _describe(token.type)
    else:
        found = repr(str(token))
    message = f"unexpected {found}"
    accepts = exc.accepts or exc.expected
    words = sorted({_describe(t) for t in accepts}, key=lambda w: (w[0] == "'", w))
    if words:
        expected = words[0] if len(words) == 1 else f"{', '.join(words[:-1])} or {words[-1]}"
        message += f"; expected {expected}"
    if token.type == "EQUAL" and "RPAR" in accepts:
        message += " (an operation's arguments follow its name without a space: linear(d = 16))"
    return GrammarSyntaxError(message, location, text)


# ---------------------------------------------------------------------------------------------
# Tree to model


class _Value(NamedTuple):
    value: Any
    location: Location


class _Alternative(NamedTuple):
    items: tuple
    probability: _Value | None
    location: Location


@v_args(inline=True)
class _ToModel(Transformer):
    """Builds rules bottom-up; names are resolved to symbols or operations as they are met.

    `nonterminals` (every symbol with a rule, collected before transforming) is what lets a
    bare name become a SymbolItem or an OpItem on the spot.
    """

    def __init__(self, path: str, nonterminals: frozenset[str]):
        super().__init__()
        self.path = path
        self.nonterminals = nonterminals

    def _at(self, token: Token) -> Location:
        return _location(self.path, token)

    def _at_meta(self, meta: Any) -> Location:
        return Location(self.path, meta.line, meta.column)

    @v_args(inline=False)
    def start(self, declarations: list[_Value | Rule]) -> tuple[list[_Value], list[Rule]]:
        starts = [d for d in declarations if isinstance(d, _Value)]
        rules = [d for d in declarations if isinstance(d, Rule)]
        return starts, rules

    def start_decl(self, name: Token) -> _Value:
        return _Value(str(name), self._at(name))

    def rule(self, name: Token, *parts: Any) -> Rule:
        guard: tuple[Condition, ...] = () if isinstance(parts[0], _Alternative) else parts[0]
        alternatives: list[_Alternative] = [p for p in parts if isinstance(p, _Alternative)]
        location = self._at(name)
        probabilities = validate.rule_probabilities([a.probability for a in alternatives], location)
        alts = tuple(
            Alternative(a.items, p, a.location) for a, p in zip(alternatives, probabilities, strict=True)
        )
        return Rule(str(name), guard, alts, location)

    def guard(self, *conditions: Condition) -> tuple[Condition, ...]:
        return conditions

    def equal(self, attribute: Token, value: _Value) -> Condition:
        return validate.condition(str(attribute), "==", (value,), self._at(attribute))

    def not_equal(self, attribute: Token, value: _Value) -> Condition:
        return validate.condition(str(attribute), "!=", (value,), self._at(attribute))

    def member(self, attribute: Token, *values: _Value) -> Condition:
        return validate.condition(str(attribute), "in", values, self._at(attribute))

    def alternative(self, *parts: Any) -> _Alternative:
        probability = parts[-1] if isinstance(parts[-1], _Value) else None
        items = tuple(parts if probability is None else parts[:-1])
        return _Alternative(items, probability, items[0].location)

    def probability(self, number: Token) -> _Value:
        return _Value(float(number), self._at(number))

    def name_item(self, name: Token) -> SymbolItem | OpItem:
        return validate.resolve_name(str(name), self._at(name), self.nonterminals)

    def call_item(self, name: Token, *axes: tuple[tuple[str, ...], tuple[tuple, ...]]) -> OpItem:
        names = [n for axis_names, _ in axes for n in axis_names]
        grid = [dict(zip(names, sum(combo, ()), strict=True)) for combo in product(*(p for _, p in axes))]
        return validate.resolve_call(str(name), names, grid, self._at(name), self.nonterminals)

    @v_args(meta=True, inline=True)
    def parallel(self, meta: Any, *items: Any) -> ParallelItem:
        return ParallelItem(items, self._at_meta(meta))

    @v_args(meta=True, inline=True)
    def repeat(self, meta: Any, item: Any, count: Token) -> RepeatItem:
        if count.type == "INT":
            return RepeatItem(item, int(count), self._at_meta(meta))
        if str(count) != "b":
            raise GrammarError(f"repeat count must be an integer or b, got {str(count)!r}", self._at(count))
        return RepeatItem(item, None, self._at_meta(meta))

    def axis(self, name: Token, *values: _Value) -> tuple[tuple[str, ...], tuple[tuple, ...]]:
        return (str(name),), tuple((v.value,) for v in values)

    @v_args(inline=False)
    def linked_axis(self, children: list) -> tuple[tuple[str, ...], tuple[tuple, ...]]:
        names = tuple(str(c) for c in children if isinstance(c, Token))
        points = []
        for value in children[len(names) :]:
            if not isinstance(value.value, tuple) or len(value.value) != len(names):
                raise GrammarError(
                    f"({', '.join(names)}) needs {len(names)} values in parentheses, got {value.value!r}",
                    value.location,
                )
            points.append(value.value)
        return names, tuple(points)

    def int_value(self, token: Token) -> _Value:
        return _Value(int(token), self._at(token))

    def float_value(self, token: Token) -> _Value:
        return _Value(float(token), self._at(token))

    def word_value(self, token: Token) -> _Value:
        return _Value(str(token), self._at(token))

    def true_value(self, token: Token) -> _Value:
        return _Value(True, self._at(token))

    def false_value(self, token: Token) -> _Value:
        return _Value(False, self._at(token))

    @v_args(meta=True, inline=True)
    def tuple_value(self, meta: Any, *values: _Value) -> _Value:
        return _Value(tuple(v.value for v in values), self._at_meta(meta))

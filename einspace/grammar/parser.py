"""Read grammar files: Lark parses the text, one Transformer turns it into model objects."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from functools import cache
from itertools import product
from pathlib import Path
from typing import Any, NamedTuple

from lark import Lark, Token, Transformer, v_args
from lark.exceptions import UnexpectedCharacters, UnexpectedInput, UnexpectedToken, VisitError
from lark.lark import PostLex

from einspace.bundled import bundled_grammars, grammar_path
from einspace.errors import EinspaceError, GrammarError, GrammarSyntaxError, LocatedError, Location
from einspace.grammar import validate
from einspace.grammar.compose import Change, compose
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
from einspace.ops.registry import OPERATIONS

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


def parse_grammar(text: str, path: str = "<string>", *, _extending: tuple[Path, ...] = ()) -> Grammar:
    """Parse and validate grammar text; `path` says where errors are and where an `extends`
    looks for files named relative to this one."""
    try:
        tree = _lark().parse(text)
        base = _base_grammar(tree, path, _extending)
        nonterminals = frozenset(str(rule.children[0]) for rule in tree.find_data("rule"))
        if base is not None:
            nonterminals |= frozenset(base.nonterminals)
        starts, rules, changes = _ToModel(path, nonterminals).transform(tree)
        if base is not None:
            rules = compose(base, rules, changes)
            starts = starts or [(base.start, base.rules_for(base.start)[0].location)]
        elif changes:
            raise GrammarError(
                f"`{changes[0].symbol} {'+=' if changes[0].kind == 'add' else '@='}` changes the grammar "
                "this file extends, and it extends none: add a line such as `extends einspace`",
                changes[0].location,
            )
        grammar = validate.build_grammar(starts, rules, path, text)
        return replace(grammar, files=(*(base.files if base else ()), path))
    except UnexpectedInput as exc:
        raise _syntax_error(exc, path, text) from None
    except _UnclosedParen as exc:
        raise GrammarSyntaxError("'(' is never closed", _location(path, exc.token), text) from None
    except VisitError as exc:
        if isinstance(exc.orig_exc, LocatedError):
            raise _with_source(exc.orig_exc, path, text) from None
        raise
    except GrammarError as exc:
        raise _with_source(exc, path, text) from None


#: Grammars loaded in this process: file -> the text of every file it was composed of, the
#: operations' `changes` when it was parsed (a plugin's operation makes a grammar valid), and the
#: grammar. Loading a grammar again (every evaluation in a worker, every `Experiment.space()`)
#: parses nothing while none of those files and no plugin's operation changed.
_LOADED: dict[Path, tuple[tuple[tuple[str, str], ...], int, Grammar]] = {}


def load_grammar(path: str | Path = "einspace", *, _extending: tuple[Path, ...] = ()) -> Grammar:
    """Read and parse a grammar file (and the files it extends), by path or by the name of a
    bundled grammar (`einspace` = the paper's space; `einspace.bundled.names_bundled` is the
    rule). A grammar loaded before is parsed again only when one of its files changed or a
    plugin's operation was registered or removed since."""
    try:
        file = grammar_path(path)
    except EinspaceError as exc:
        raise GrammarError(str(exc)) from None
    text = _read(file)
    own = (str(file), text)
    texts, changes, grammar = _LOADED.get(file.resolve(), ((), -1, None))
    if (
        grammar is not None
        and changes == OPERATIONS.changes
        and texts[-1] == own
        and all(_unchanged(f, t) for f, t in texts[:-1])
    ):
        return grammar
    grammar = parse_grammar(text, str(file), _extending=_extending)
    texts = tuple((f, _read(f)) for f in grammar.files[:-1]) + (own,)
    _LOADED[file.resolve()] = (texts, OPERATIONS.changes, grammar)
    return grammar


def _unchanged(path: str, text: str) -> bool:
    try:
        return Path(path).read_text(encoding="utf-8") == text
    except (OSError, UnicodeDecodeError):
        return False


def _read(path: str | Path) -> str:
    try:
        return Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        reason = getattr(exc, "strerror", None) or exc
        raise GrammarError(f"cannot read grammar file {str(path)!r}: {reason}") from None


def _with_source(exc: LocatedError, path: str, text: str) -> LocatedError:
    """The same error with the caret context, which the code that raised it could not give
    (read from the file the location names when that is another file of a composition)."""
    if exc.source or exc.location is None:
        return exc
    source = text
    if exc.location.path != path:
        try:
            source = Path(exc.location.path).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            return exc
    return type(exc)(exc.message, exc.location, source)


def _base_grammar(tree: Any, path: str, extending: tuple[Path, ...]) -> Grammar | None:
    """The grammar an `extends` declaration names, loaded (None without one)."""
    declarations = list(tree.find_data("extends_decl"))
    if not declarations:
        return None
    if len(declarations) > 1:
        first = declarations[0].children[0]
        raise GrammarError(
            f"a second `extends` (the first is at line {first.line}); a grammar extends one other",
            _location(path, declarations[1].children[0]),
        )
    token = declarations[0].children[0]
    here = _location(path, token)
    target = _extended_file(token, path, here)
    this = Path(path).resolve() if path != "<string>" else None
    chain = (*extending, *([this] if this else []))
    if target.resolve() in chain:
        cycle = " -> ".join(str(p) for p in (*chain[chain.index(target.resolve()) :], target.resolve()))
        raise GrammarError(f"grammars extend each other in a cycle: {cycle}", here)
    if len(chain) >= MAX_EXTENDS:  # each level is a few Python frames: stop well before RecursionError
        raise GrammarError(
            f"grammars extend each other more than {MAX_EXTENDS} deep (from {chain[0]}); "
            "merge some of the files in the chain",
            here,
        )
    return load_grammar(target, _extending=chain)


#: How long a chain of `extends` may be.
MAX_EXTENDS = 100


def _extended_file(token: Token, path: str, here: Location) -> Path:
    """`extends "file.pcfg"`: relative to the extending file; `extends name`: `name.pcfg` beside
    the extending file if there is one, else the bundled grammar of that name."""
    folder = Path(path).parent if path != "<string>" else Path.cwd()
    if token.type == "STRING":
        target = folder / str(token)[1:-1]
        if target.is_dir():
            raise GrammarError(f"cannot extend {str(token)}: {target} is a folder, not a grammar file", here)
        if not target.is_file():
            raise GrammarError(f"cannot extend {str(token)}: no file {target}", here)
        return target
    beside = folder / f"{token}.pcfg"
    if beside.is_file():
        return beside
    bundled = bundled_grammars()
    if str(token) in bundled:
        return bundled[str(token)]
    names = ", ".join(sorted(bundled))
    raise GrammarError(
        f"cannot extend {str(token)!r}: no file {beside} and no bundled grammar of that name "
        f'(bundled: {names}; write a path in quotes, extends "../my.pcfg")',
        here,
    )


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
        message = f"unexpected character {exc.char!r}"
        if text.splitlines()[exc.line - 1].lstrip().startswith("extends "):
            message += ' (a path goes in quotes: extends "../my.pcfg")'
        return GrammarSyntaxError(message, location, text)
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
    def start(self, declarations: list[Any]) -> tuple[list[_Value], list[Rule], list[Change]]:
        starts = [d for d in declarations if isinstance(d, _Value)]
        rules = [d for d in declarations if isinstance(d, Rule)]
        changes = [d for d in declarations if isinstance(d, Change)]
        return starts, rules, changes

    def start_decl(self, name: Token) -> _Value:
        return _Value(str(name), self._at(name))

    def extends_decl(self, reference: Token) -> None:
        """Handled before the transformation (`_base_grammar`); nothing to build here."""
        return None

    def add_rule(self, name: Token, *parts: Any) -> Change:
        return self._change("add", name, parts)

    def reweight_rule(self, name: Token, *parts: Any) -> Change:
        return self._change("reweight", name, parts)

    def _change(self, kind: str, name: Token, parts: tuple[Any, ...]) -> Change:
        guard = None if isinstance(parts[0], _Alternative) else parts[0]
        alternatives = tuple(
            (a.items, a.probability and validate.check_probability(a.probability), a.location)
            for a in parts
            if isinstance(a, _Alternative)
        )
        return Change(kind, str(name), guard, alternatives, self._at(name))

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

"""Derivation trees: immutable nodes, bracket text and JSON forms, content hash, traversal.

`walk` and `walk_depths` iterate, but most tree code recurses, a call or more per level (the
visitors, parsing, the JSON form, `pretty`, `replace_at`), so trees are bounded by Python's
recursion limit: `parse_tree` refuses deeper text with a clear error, and the default sampling
limit (depth 40) stays far below it.
"""

from __future__ import annotations

import hashlib
import json
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any, ClassVar, Generic, TypeVar

from lark import Lark, Transformer, UnexpectedInput, v_args
from lark.exceptions import VisitError

from einspace.errors import EinspaceError, Location, TreeSyntaxError


@dataclass(frozen=True, slots=True)
class Terminal:
    """A terminal operation with its arguments, e.g. `linear(d=64)`."""

    kind: ClassVar[str] = "terminal"
    children: ClassVar[tuple[Node, ...]] = ()

    op: str
    args: tuple[tuple[str, Any], ...] = ()

    def with_children(self, new: tuple[Node, ...]) -> Node:
        raise EinspaceError("a terminal has no children")


@dataclass(frozen=True, slots=True)
class Nonterminal:
    """An expanded symbol; its children are applied in sequence."""

    kind: ClassVar[str] = "nonterminal"

    symbol: str
    children: tuple[Node, ...]

    def with_children(self, new: tuple[Node, ...]) -> Node:
        """A copy with other children (the same symbol)."""
        return Nonterminal(self.symbol, new)


@dataclass(frozen=True, slots=True)
class Parallel:
    """One child per incoming branch: child i transforms branch i (the grammar's `(X, Y)`)."""

    kind: ClassVar[str] = "parallel"

    children: tuple[Node, ...]

    def with_children(self, new: tuple[Node, ...]) -> Node:
        return Parallel(new)


@dataclass(frozen=True, slots=True)
class Repeat:
    """One derivation applied to each of `times` branches, each copy with its own weights."""

    kind: ClassVar[str] = "repeat"

    child: Node
    times: int

    @property
    def children(self) -> tuple[Node, ...]:
        return (self.child,)

    def with_children(self, new: tuple[Node, ...]) -> Node:
        return Repeat(new[0], self.times)


Node = Terminal | Nonterminal | Parallel | Repeat

#: A node's address: the child indices from the root (Repeat's child is index 0).
Path_ = tuple[int, ...]

R = TypeVar("R")


class TreeVisitor(Generic[R]):
    """Handlers per node kind, called by name as in lark's visitors.

    `visit(node, *args)` calls the subclass's `terminal`, `nonterminal`, `parallel` or `repeat`
    method (the node's `kind`) with the same arguments, or `default` for a kind it does not
    handle. Handlers recurse by visiting children; a walk that must survive any depth iterates
    `walk` and visits each node instead.
    """

    def visit(self, node: Node, *args: Any) -> R:
        return self.handler(node)(node, *args)

    def handler(self, node: Node) -> Callable[..., R]:
        """The method for `node`'s kind; a visitor that wraps every call (to record what it
        found, say) overrides `visit` and calls this, keeping one frame per level."""
        return getattr(self, node.kind, self.default)

    def default(self, node: Node, *args: Any) -> R:
        raise EinspaceError(f"{type(self).__name__} has no handler for a {node.kind} node")


def walk(root: Node) -> Iterator[tuple[Path_, Node]]:
    """Pre-order traversal yielding (path, node), without recursion (trees can be deep)."""
    for path, node, _ in walk_depths(root):
        yield path, node


def walk_depths(root: Node) -> Iterator[tuple[Path_, Node, int]]:
    """Pre-order (path, node, depth), without recursion. The one depth rule of limits and
    statistics: a node's depth is the number of non-terminals from the root down to it, itself
    included (parallel and repeat groupings add none: the paper's derivation trees have no
    such nodes)."""
    stack: list[tuple[Path_, Node, int]] = [((), root, 0)]
    while stack:
        path, node, above = stack.pop()
        depth = above + (node.kind == "nonterminal")
        yield path, node, depth
        kids = node.children
        for i in range(len(kids) - 1, -1, -1):
            stack.append(((*path, i), kids[i], depth))


def tree_depth(root: Node) -> int:
    """Non-terminal levels of a tree: the deepest depth of `walk_depths`."""
    return max((depth for _, _, depth in walk_depths(root)), default=0)


def node_at(root: Node, path: Path_) -> Node:
    node = root
    for i in path:
        node = node.children[i]
    return node


def replace_at(root: Node, path: Path_, new: Node) -> Node:
    """A new tree with the node at `path` replaced; untouched subtrees are shared."""
    if not path:
        return new
    kids = list(root.children)
    kids[path[0]] = replace_at(kids[path[0]], path[1:], new)
    return root.with_children(tuple(kids))


def describe_path(root: Node, path: Path_) -> str:
    """A readable address such as `S > M#1 > Branches#1 > [0] > M`, for error messages."""
    parts = [_LABEL.visit(root)]
    node = root
    for i in path:
        node = node.children[i]
        parts.append(f"{_LABEL.visit(node)}#{i}")
    return " > ".join(parts)


class _Label(TreeVisitor[str]):
    """A node's name in a path: its symbol or operation, or what kind of grouping it is."""

    def terminal(self, node: Terminal) -> str:
        return node.op

    def nonterminal(self, node: Nonterminal) -> str:
        return node.symbol

    def parallel(self, node: Parallel) -> str:
        return "[parallel]"

    def repeat(self, node: Repeat) -> str:
        return f"*{node.times}"


_LABEL = _Label()


# ----------------------------------------------------------------------------- text form


def _format_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, tuple):
        return "(" + ",".join(_format_value(v) for v in value) + ")"
    return str(value) if not isinstance(value, float) else repr(value)


def format_terminal(node: Terminal) -> str:
    if not node.args:
        return node.op
    return f"{node.op}(" + ", ".join(f"{k}={_format_value(v)}" for k, v in node.args) + ")"


def to_text(root: Node) -> str:
    """The canonical one-line bracket form; `parse_tree(to_text(t)) == t`."""
    return _Text().write(root)


class _Text(TreeVisitor[None]):
    """Writes the bracket form from an explicit stack of pending strings and nodes (deep trees
    stay off the call stack): each handler writes a node's opening and pushes the rest."""

    def __init__(self) -> None:
        self.out: list[str] = []
        self.pending: list[Node | str] = []

    def write(self, root: Node) -> str:
        self.pending.append(root)
        while self.pending:
            item = self.pending.pop()
            if isinstance(item, str):
                self.out.append(item)
            else:
                self.visit(item)
        return "".join(self.out)

    def terminal(self, node: Terminal) -> None:
        self.out.append(format_terminal(node))

    def nonterminal(self, node: Nonterminal) -> None:
        self.out.append(f"({node.symbol}")
        self.pending.append(")")
        for child in reversed(node.children):
            self.pending += (child, " ")

    def parallel(self, node: Parallel) -> None:
        self.out.append("[")
        self.pending.append("]")
        for i in range(len(node.children) - 1, -1, -1):
            self.pending.append(node.children[i])
            if i:
                self.pending.append(" ")

    def repeat(self, node: Repeat) -> None:
        self.pending += (f"*{node.times}", node.child)


def pretty(root: Node, indent: str = "  ", width: int = 88) -> str:
    """Multi-line form: subtrees that fit in `width` stay on one line; parses back like `to_text`."""
    printer = _Pretty(indent, width)
    printer.visit(root, 0, "")
    return "\n".join(printer.lines)


class _Pretty(TreeVisitor[None]):
    """One handler per kind, each given its indentation depth and the text to write after it (the
    `*b` of the repeats it is the body of)."""

    def __init__(self, indent: str, width: int):
        self.indent, self.width = indent, width
        self.lines: list[str] = []

    def terminal(self, node: Terminal, depth: int, suffix: str) -> None:
        self.lines.append(self.indent * depth + format_terminal(node) + suffix)

    def repeat(self, node: Repeat, depth: int, suffix: str) -> None:
        self.visit(node.child, depth, f"*{node.times}{suffix}")

    def nonterminal(self, node: Nonterminal, depth: int, suffix: str) -> None:
        self.group(node, depth, suffix, f"({node.symbol}", ")")

    def parallel(self, node: Parallel, depth: int, suffix: str) -> None:
        self.group(node, depth, suffix, "[", "]")

    def group(self, node: Node, depth: int, suffix: str, opener: str, closer: str) -> None:
        pad = self.indent * depth
        if len(pad) + len(text := to_text(node)) <= self.width:
            self.lines.append(pad + text + suffix)
            return
        self.lines.append(pad + opener)
        for child in node.children:
            self.visit(child, depth + 1, "")
        self.lines[-1] += closer + suffix


@v_args(inline=True)
class _ToTree(Transformer):
    def start(self, node):
        return node

    def node(self, symbol, *kids):
        return Nonterminal(str(symbol), tuple(kids))

    def repeated(self, child, times):
        return Repeat(child, int(times))

    def parallel(self, *kids):
        return Parallel(tuple(kids))

    def terminal(self, name, *args):
        return Terminal(str(name), tuple(args))

    def arg(self, name, value):
        return (str(name), value)

    def int(self, token):
        return int(token)

    def float(self, token):
        return float(token)

    def true(self):
        return True

    def false(self):
        return False

    def word(self, token):
        return str(token)

    def tuple(self, *values):
        return tuple(values)


@cache
def _parser() -> Lark:
    return Lark.open("tree.lark", rel_to=__file__, parser="lalr", maybe_placeholders=False)


def parse_tree(text: str, path: str = "<string>") -> Node:
    """Parse the bracket form (one-line or pretty). Syntax only: see `check_tree` for meaning."""
    try:
        tree = _parser().parse(text)
        return _ToTree().transform(tree)
    except (RecursionError, VisitError) as exc:
        if isinstance(exc, VisitError) and not isinstance(exc.orig_exc, RecursionError):
            raise  # a bug in the transformer, not the text
        raise TreeSyntaxError(
            f"the tree is nested too deeply to read (Python's recursion limit, {sys.getrecursionlimit()}, "
            "was reached)",
            Location(path, 1, 1),
        ) from None
    except UnexpectedInput as exc:
        expected = sorted(getattr(exc, "expected", None) or getattr(exc, "allowed", None) or [])
        names = ", ".join(_TOKEN_WORDS.get(t, t) for t in expected)
        found = getattr(exc, "token", None)
        what = "unexpected end of text" if found is not None and found.type == "$END" else "unexpected input"
        if found is not None and found.type != "$END":
            what = f"unexpected {str(found)!r}"
        message = f"{what} in tree" + (f"; expected {names}" if names else "")
        raise TreeSyntaxError(message, Location(path, exc.line, exc.column), text) from None


_TOKEN_WORDS = {
    "LPAR": "'('",
    "RPAR": "')'",
    "LSQB": "'['",
    "RSQB": "']'",
    "STAR": "'*'",
    "COMMA": "','",
    "EQUAL": "'='",
    "SYMBOL": "a symbol",
    "NAME": "a name",
    "CALL_NAME": "an operation call",
    "INT": "an integer",
    "FLOAT": "a number",
    "$END": "end of text",
}


def read_text_file(path: str | Path, what: str) -> str:
    """A file's text; a missing, unreadable or binary file is an EinspaceError saying which."""
    try:
        return Path(path).read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        problem = f"is not UTF-8 text (byte {exc.start}); is it the right file?"
        raise EinspaceError(f"{what} {path} {problem}") from None
    except OSError as exc:
        raise EinspaceError(f"cannot read {what} {path}: {exc.strerror}") from None


def load_tree(path: str | Path) -> Node:
    """Read a tree file (bracket form; `#` comment lines are skipped)."""
    text = read_text_file(path, "tree file")
    body = "\n".join("" if line.lstrip().startswith("#") else line for line in text.splitlines())
    return parse_tree(body, str(path))


# ----------------------------------------------------------------------------- JSON and hash


def to_json(root: Node) -> Any:
    """A JSON-able nested form: {"symbol", "children"}, {"op", "args"}, {"parallel"}, {"repeat", "times"}."""
    return _JSON.visit(root)


class _Json(TreeVisitor[Any]):
    """The nested dictionaries of `to_json`, one handler per kind."""

    def terminal(self, node: Terminal) -> Any:
        return {"op": node.op, "args": {k: _json_value(v) for k, v in node.args}}

    def nonterminal(self, node: Nonterminal) -> Any:
        return {"symbol": node.symbol, "children": [self.visit(c) for c in node.children]}

    def parallel(self, node: Parallel) -> Any:
        return {"parallel": [self.visit(c) for c in node.children]}

    def repeat(self, node: Repeat) -> Any:
        return {"repeat": self.visit(node.child), "times": node.times}


_JSON = _Json()


def from_json(data: Any) -> Node:
    """Inverse of `to_json`."""
    try:
        if "op" in data:
            args = tuple((k, _tree_value(v)) for k, v in data.get("args", {}).items())
            return Terminal(data["op"], args)
        if "symbol" in data:
            return Nonterminal(data["symbol"], tuple(from_json(c) for c in data["children"]))
        if "parallel" in data:
            return Parallel(tuple(from_json(c) for c in data["parallel"]))
        return Repeat(from_json(data["repeat"]), int(data["times"]))
    except (KeyError, TypeError, AttributeError) as exc:
        raise EinspaceError(f"not a derivation tree in JSON form: {exc!r} in {str(data)[:80]}") from None


def _json_value(value: Any) -> Any:
    return [_json_value(v) for v in value] if isinstance(value, tuple) else value


def _tree_value(value: Any) -> Any:
    return tuple(_tree_value(v) for v in value) if isinstance(value, list) else value


def dumps_json(root: Node) -> str:
    return json.dumps(to_json(root), separators=(",", ":"))


def content_hash(root: Node) -> str:
    """A stable hash of the tree's content (SHA-256 of its canonical text, 16 hex digits)."""
    return hashlib.sha256(to_text(root).encode()).hexdigest()[:16]

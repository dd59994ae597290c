"""Derivation trees: immutable nodes, bracket text and JSON forms, content hash, traversal."""

from __future__ import annotations

import hashlib
import json
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from lark import Lark, Transformer, UnexpectedInput, v_args

from einspace.errors import EinspaceError, Location, TreeSyntaxError


@dataclass(frozen=True, slots=True)
class Terminal:
    """A terminal operation with its arguments, e.g. `linear(d=64)`."""

    op: str
    args: tuple[tuple[str, Any], ...] = ()


@dataclass(frozen=True, slots=True)
class Nonterminal:
    """An expanded symbol; its children are applied in sequence."""

    symbol: str
    children: tuple[Node, ...]


@dataclass(frozen=True, slots=True)
class Parallel:
    """One child per incoming branch: child i transforms branch i (the grammar's `(X, Y)`)."""

    children: tuple[Node, ...]


@dataclass(frozen=True, slots=True)
class Repeat:
    """One derivation applied to each of `times` branches, each copy with its own weights."""

    child: Node
    times: int


Node = Terminal | Nonterminal | Parallel | Repeat

#: A node's address: the child indices from the root (Repeat's child is index 0).
Path_ = tuple[int, ...]


def children(node: Node) -> tuple[Node, ...]:
    """The direct children of any node."""
    if isinstance(node, (Nonterminal, Parallel)):
        return node.children
    if isinstance(node, Repeat):
        return (node.child,)
    return ()


def with_children(node: Node, new: tuple[Node, ...]) -> Node:
    """A copy of `node` with other children (same kind and label)."""
    if isinstance(node, Nonterminal):
        return Nonterminal(node.symbol, new)
    if isinstance(node, Parallel):
        return Parallel(new)
    if isinstance(node, Repeat):
        return Repeat(new[0], node.times)
    raise EinspaceError("a terminal has no children")


def walk(root: Node) -> Iterator[tuple[Path_, Node]]:
    """Pre-order traversal yielding (path, node), without recursion (trees can be deep)."""
    stack: list[tuple[Path_, Node]] = [((), root)]
    while stack:
        path, node = stack.pop()
        yield path, node
        kids = children(node)
        for i in range(len(kids) - 1, -1, -1):
            stack.append(((*path, i), kids[i]))


def node_at(root: Node, path: Path_) -> Node:
    node = root
    for i in path:
        node = children(node)[i]
    return node


def replace_at(root: Node, path: Path_, new: Node) -> Node:
    """A new tree with the node at `path` replaced; untouched subtrees are shared."""
    if not path:
        return new
    kids = list(children(root))
    kids[path[0]] = replace_at(kids[path[0]], path[1:], new)
    return with_children(root, tuple(kids))


def describe_path(root: Node, path: Path_) -> str:
    """A readable address such as `S > M#1 > Branches#1 > [0] > M`, for error messages."""
    parts = [_label(root)]
    node = root
    for i in path:
        node = children(node)[i]
        parts.append(f"{_label(node)}#{i}")
    return " > ".join(parts)


def _label(node: Node) -> str:
    if isinstance(node, Nonterminal):
        return node.symbol
    if isinstance(node, Terminal):
        return node.op
    if isinstance(node, Parallel):
        return "[parallel]"
    return f"*{node.times}"


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
    out: list[str] = []
    # An explicit stack of pending strings and nodes keeps deep trees off the call stack.
    stack: list[Node | str] = [root]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            out.append(item)
        elif isinstance(item, Terminal):
            out.append(format_terminal(item))
        elif isinstance(item, Nonterminal):
            stack.append(")")
            for child in reversed(item.children):
                stack.append(child)
                stack.append(" ")
            out.append(f"({item.symbol}")
        elif isinstance(item, Parallel):
            stack.append("]")
            for i in range(len(item.children) - 1, -1, -1):
                stack.append(item.children[i])
                if i:
                    stack.append(" ")
            out.append("[")
        else:
            stack.append(f"*{item.times}")
            stack.append(item.child)
    return "".join(out)


def pretty(root: Node, indent: str = "  ", width: int = 88) -> str:
    """Multi-line form: subtrees that fit in `width` stay on one line; parses back like `to_text`."""
    lines: list[str] = []

    def emit(node: Node, depth: int, suffix: str = "") -> None:
        pad = indent * depth
        if isinstance(node, Terminal):
            lines.append(pad + format_terminal(node) + suffix)
        elif isinstance(node, Repeat):
            emit(node.child, depth, f"*{node.times}{suffix}")
        elif len(pad) + len(text := to_text(node)) <= width:
            lines.append(pad + text + suffix)
        else:
            opener, closer = (f"({node.symbol}", ")") if isinstance(node, Nonterminal) else ("[", "]")
            lines.append(pad + opener)
            for child in children(node):
                emit(child, depth + 1)
            lines[-1] += closer + suffix

    emit(root, 0)
    return "\n".join(lines)


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
    except RecursionError:
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
    if isinstance(root, Terminal):
        return {"op": root.op, "args": {k: _json_value(v) for k, v in root.args}}
    if isinstance(root, Nonterminal):
        return {"symbol": root.symbol, "children": [to_json(c) for c in root.children]}
    if isinstance(root, Parallel):
        return {"parallel": [to_json(c) for c in root.children]}
    return {"repeat": to_json(root.child), "times": root.times}


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

"""The normal form of a tree under export: the trees whose exported files are the same code have
the same normal form, so that `einspace export` then `import-model` can be checked to give back
the tree it started from (tests/test_round_trip.py).

An exported file keeps every computation and the order of every routing operation, but not:
  - how sequences are grouped (`M -> M M` is associative; export writes one line per operation);
  - operations that compute nothing: `identity`, and a routing module's identity side;
  - the order of the branches of a clone whose aggregation is a sum (the importer puts shortcuts
    last, as `residual` does);
  - where routing modules begin and end: `R1 permute (M) R2 permute` next to another permute
    is a run of permutes, written as one; permutes that undo each other, and an image turned into
    tokens and back (col2im then im2col 1×1, or im2col 1×1 then col2im), are no code at all;
  - whether layers on an image's channels were written in im mode (`linear`) or between an
    im2col 1×1 and its col2im: both are 1×1 `nn.Conv2d`s.
The normal form is a text: each sequence flattened to its operations (routing ones as they
apply), with those rules applied; each branching module its split, branches and aggregation.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from einspace.network.importer.pieces import compose_orders
from einspace.seeds import architectures as arch
from einspace.tree import Node, Nonterminal, Parallel, Repeat, Terminal, format_terminal

__all__ = ["normal_form", "normal_hash"]

_TOKENS = arch.op("im2col", k=1, s=1, p=0)


@dataclass(frozen=True)
class _Branching:
    split: Terminal
    branches: tuple[tuple[_Item, ...], ...]
    merge: Terminal


_Item = Terminal | _Branching


def normal_form(tree: Node, image: bool) -> str:
    """The normal form's text of `tree` (a whole network or a module), whose input is an image
    (im mode) or tokens."""
    return _text(_simplify(_items(tree), image))


def normal_hash(tree: Node, image: bool) -> str:
    """A hash of the normal form (16 hex digits, as `content_hash`)."""
    return hashlib.sha256(normal_form(tree, image).encode()).hexdigest()[:16]


def _items(node: Node) -> list[_Item]:
    """The operations of a module in the order they apply, routing ones included."""
    if isinstance(node, Terminal):
        return [] if node.op == "identity" else [node]
    if isinstance(node, Nonterminal):
        symbols = tuple(c.symbol if isinstance(c, Nonterminal) else "" for c in node.children)
        if symbols[:1] == ("B",):
            split, branches, merge = node.children
            return [
                _Branching(
                    split.children[0], tuple(tuple(_items(b)) for b in _branches(branches)), merge.children[0]
                )
            ]
        return [item for child in node.children for item in _items(child)]
    raise TypeError(f"not a module: {node!r}")


def _branches(node: Node) -> list[Node]:
    if isinstance(node, Nonterminal):  # Branches -> (...)
        (node,) = node.children
    if isinstance(node, Repeat):
        return [node.child] * node.times
    if isinstance(node, Parallel):
        return list(node.children)
    return [node]


def _simplify(items: list[_Item], image: bool) -> list[_Item]:
    """The rules of the module docstring, applied left to right, `image` telling the mode."""
    out: list[_Item] = []
    modes: list[bool] = []  # whether the input of out[i] is an image
    for item in items:
        here = _image_after(out[-1], modes[-1]) if out else image
        if isinstance(item, _Branching):
            branches = tuple(tuple(_simplify(list(b), here)) for b in item.branches)
            if item.split.op == "clone" and item.merge.op == "add":  # in any order
                branches = tuple(sorted(branches, key=lambda b: _text(list(b))))
            item = _Branching(item.split, branches, item.merge)
        out.append(item)
        modes.append(here)
        while _reduce(out):
            del modes[len(out) :]
    return out


def _reduce(out: list[_Item]) -> bool:
    """One rule applied at the end of `out` (True), or none applies."""
    last = out[-2:]
    names = [item.op if isinstance(item, Terminal) else "" for item in last]
    if names == ["permute", "permute"]:
        order = compose_orders(*(dict(i.args)["order"] for i in last))  # type: ignore[union-attr]
        out[-2:] = (
            [] if order == tuple(range(1, len(order) + 1)) else [Terminal("permute", (("order", order),))]
        )
        return True
    if last in ([Terminal("col2im", ()), _TOKENS], [_TOKENS, Terminal("col2im", ())]):
        out[-2:] = []
        return True
    if out[-1:] == [Terminal("col2im", ())]:  # layers on the channels between: as in im mode
        start = len(out) - 2
        while start >= 0 and _is_linear(out[start]):
            start -= 1
        if start >= 0 and start < len(out) - 2 and out[start] == _TOKENS:
            out[start:] = out[start + 1 : -1]
            return True
    return False


def _is_linear(item: _Item) -> bool:
    return isinstance(item, Terminal) and item.op == "linear"


def _image_after(item: _Item, image: bool) -> bool:
    if isinstance(item, Terminal) and item.op == "im2col":
        return False
    if isinstance(item, Terminal) and item.op == "col2im":
        return True
    return image


def _text(items: list[_Item]) -> str:
    parts = []
    for item in items:
        if isinstance(item, Terminal):
            parts.append(format_terminal(item))
        else:
            inner = ", ".join(f"[{_text(list(b))}]" for b in item.branches)
            parts.append(f"{format_terminal(item.split)}({inner}){format_terminal(item.merge)}")
    return " ".join(parts)

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
  - whether layers on an image's channels were written in im mode (`linear`) or on tokens, between
    an im2col 1×1 and its col2im, after an im2col 1×1 or before a col2im: a 1×1 `nn.Conv2d` and a
    `nn.Linear` on the tokens compute the same, and the importer reads either as it finds it.
The normal form is a text: each sequence flattened to its operations (routing ones as they
apply), with those rules applied; each branching module its split, branches and aggregation.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from einspace.checker import check_tree
from einspace.network.importer.pieces import compose_orders
from einspace.seeds import architectures as arch
from einspace.state import FeatureState
from einspace.tree import Node, Nonterminal, Parallel, Repeat, Terminal, format_terminal, walk

__all__ = ["normal_form", "normal_hash"]

_TOKENS = arch.op("im2col", k=1, s=1, p=0)


@dataclass(frozen=True)
class _Branching:
    split: Terminal
    branches: tuple[tuple[_Item, ...], ...]
    merge: Terminal


@dataclass(frozen=True)
class _Permute:
    """A permute, with the shape it applies to when the input is known."""

    order: tuple[int, ...]
    shape: tuple[int, ...] | None


_Item = Terminal | _Branching | _Permute


def normal_form(tree: Node, image: bool, input: FeatureState | None = None) -> str:
    """The normal form's text of `tree` (a whole network or a module), whose input is an image
    (im mode) or tokens. With the `input` (a whole network's), a permute is written as what it
    does to that shape (on axes of size 1, permutes that differ may move the same elements, or
    none: then it is a reshape, or nothing), and a grouped convolution with a group per channel
    is the depthwise one (the same `nn.Conv2d`)."""
    shapes = {}
    if input is not None:
        facts = check_tree(tree, None, input).facts
        shaped = ("permute", "grouped_conv")
        shapes = {
            p: facts[p].input[0].shape for p, n in walk(tree) if isinstance(n, Terminal) and n.op in shaped
        }
    return _text(_simplify(_items(tree, (), shapes), image))


def normal_hash(tree: Node, image: bool, input: FeatureState | None = None) -> str:
    """A hash of the normal form (16 hex digits, as `content_hash`)."""
    return hashlib.sha256(normal_form(tree, image, input).encode()).hexdigest()[:16]


def _items(node: Node, path: tuple[int, ...], shapes: dict[tuple[int, ...], tuple[int, ...]]) -> list[_Item]:
    """The operations of a module in the order they apply, routing ones included."""
    if isinstance(node, Terminal):
        if node.op == "permute":
            return [_Permute(dict(node.args)["order"], shapes.get(path))]
        args = dict(node.args)
        if node.op == "grouped_conv" and path in shapes and args["g"] == shapes[path][0]:  # one per channel
            return [arch.op("depthwise_conv", k=args["k"], s=args["s"], p=args["p"])]
        return [] if node.op == "identity" else [node]
    if isinstance(node, Nonterminal):
        symbols = tuple(c.symbol if isinstance(c, Nonterminal) else "" for c in node.children)
        if symbols[:1] == ("B",):
            split, branches, merge = node.children
            inner = tuple(tuple(_items(b, (*path, 1, *at), shapes)) for at, b in _branches(branches))
            return [_Branching(split.children[0], inner, merge.children[0])]
        return [item for i, child in enumerate(node.children) for item in _items(child, (*path, i), shapes)]
    raise TypeError(f"not a module: {node!r}")


def _branches(node: Node) -> list[tuple[tuple[int, ...], Node]]:
    """The branches of `Branches -> ...`, each with its path below it (as `check_tree` keys them)."""
    (inner,) = node.children if isinstance(node, Nonterminal) else (node,)
    if isinstance(inner, Repeat):
        return [((0, 0), inner.child)] * inner.times
    if isinstance(inner, Parallel):
        return [((0, i), child) for i, child in enumerate(inner.children)]
    return [((0,), inner)]


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
    if len(last) == 2 and all(isinstance(item, _Permute) for item in last):
        first, second = last
        order = compose_orders(first.order, second.order)  # type: ignore[union-attr]
        kept = order != tuple(range(1, len(order) + 1))
        out[-2:] = [_Permute(order, first.shape)] if kept else []  # type: ignore[union-attr]
        return True
    if last in ([Terminal("col2im", ()), _TOKENS], [_TOKENS, Terminal("col2im", ())]):
        out[-2:] = []
        return True
    col2im = Terminal("col2im", ())
    if len(last) == 2 and last[0] == col2im and _is_linear(last[1]):  # a layer on the channels
        out[-2:] = [last[1], col2im]  # is one on the tokens before they are folded
        return True
    if len(last) == 2 and _is_linear(last[0]) and last[1] == _TOKENS:  # or after they are made
        start = len(out) - 2
        while start > 0 and _is_linear(out[start - 1]):
            start -= 1
        out[start:] = [_TOKENS, *out[start:-1]]
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


def _permute_text(item: _Permute) -> str:
    """The permute's order; on a known shape, what it does: the shape it gives and the order of
    the axes longer than 1 (a reshape when they keep theirs, nothing when the shape stays)."""
    if item.shape is None:
        return format_terminal(Terminal("permute", (("order", item.order),)))
    out = tuple(item.shape[a - 1] for a in item.order)
    moved = tuple(a for a in item.order if item.shape[a - 1] != 1)
    if moved == tuple(sorted(moved)):
        return "" if out == item.shape else f"reshape(shape={out})"
    return f"permute(axes={moved}, shape={out})"


def _text(items: list[_Item]) -> str:
    parts = []
    for item in items:
        if isinstance(item, _Permute):
            parts.append(_permute_text(item))
        elif isinstance(item, Terminal):
            parts.append(format_terminal(item))
        else:
            inner = ", ".join(f"[{_text(list(b))}]" for b in item.branches)
            parts.append(f"{format_terminal(item.split)}({inner}){format_terminal(item.merge)}")
    return " ".join(p for p in parts if p)

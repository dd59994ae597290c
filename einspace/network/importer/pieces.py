"""What the importer builds a tree from: pieces (a module of the grammar with the weights of its
stateful terminals and the model's submodule it comes from) and routes still to be paired into
routing modules; sequences of pieces nested as the model nests its submodules."""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx as fx

from einspace.seeds import architectures as arch
from einspace.tree import Nonterminal, Terminal

__all__ = [
    "Entry",
    "Piece",
    "Route",
    "cancel",
    "common_owner",
    "compose_orders",
    "flat",
    "partner",
    "sequence",
]

#: Weights of one stateful terminal (linear, norm, positional encoding), keyed as in its
#: compiled module; None keeps the fresh initialisation (a substituted layer).
Entry = dict[str, torch.Tensor] | None


@dataclass(frozen=True)
class Piece:
    """A module of the grammar, the weights of its stateful terminals in compiled order, and the
    model's submodule it comes from (its path; None for an identity), to group sequences by."""

    module: Nonterminal
    entries: tuple[Entry, ...]
    owner: tuple[str, ...] | None = None
    #: The layer norm node of a channel_norm read from a channels-last image: valid only between
    #: the permutes to channels-last and back, which `cancel` removes with this mark.
    channels_last: fx.Node | None = None


@dataclass(frozen=True)
class Route:
    """A routing operation still to be paired into `R1 M R2`: opens (im2col, permute) or closes
    (col2im, permute) a routing module."""

    op: Terminal
    node: fx.Node


def common_owner(owners: list[tuple[str, ...] | None]) -> tuple[str, ...] | None:
    """The longest module path that all given paths start with (None when none is given)."""
    known = [o for o in owners if o is not None]
    if not known:
        return None
    common = known[0]
    for owner in known[1:]:
        n = 0
        while n < min(len(common), len(owner)) and common[n] == owner[n]:
            n += 1
        common = common[:n]
    return common


def sequence(pieces: list[Piece]) -> Piece:
    """The pieces in sequence, nested as the model nests its submodules: the pieces of one child
    module form one module of the tree, so the tree reads like the model (and stays shallow)."""
    if not pieces:
        return Piece(arch.identity(), ())
    if len(pieces) == 1:
        return pieces[0]
    common = common_owner([p.owner for p in pieces])
    depth = len(common) if common is not None else 0

    def child(index_piece: tuple[int, Piece]) -> Any:
        index, piece = index_piece
        return piece.owner[depth] if piece.owner is not None and len(piece.owner) > depth else -index

    parts = [[p for _, p in run] for _, run in itertools.groupby(enumerate(pieces), key=child)]
    grouped = [sequence(run) if len(run) < len(pieces) else flat(run) for run in parts]
    return flat(grouped, common)


def flat(pieces: list[Piece], owner: tuple[str, ...] | None = None) -> Piece:
    if len(pieces) == 1:
        return pieces[0]
    entries = tuple(e for p in pieces for e in p.entries)
    owner = owner or common_owner([p.owner for p in pieces])
    return Piece(arch.seq(*(p.module for p in pieces)), entries, owner)


def cancel(items: list[Piece | Route]) -> list[Piece | Route]:
    """Drop col2im followed by image-to-tokens (im2col 1×1), and two permutes in a row that
    undo each other: such pairs change nothing. A channels-last layer norm between the permutes
    to channels-last and back is the grammar's channel_norm, without them."""
    out: list[Piece | Route] = []
    for item in _split_around_norms(items):
        last = out[-1] if out else None
        if isinstance(item, Route) and item.op == arch.op("permute", order=(3, 1, 2)):
            n = 0  # the channels-last norms just before (two in a row: their permutes between cancelled)
            while n < len(out) and isinstance(out[-1 - n], Piece) and out[-1 - n].channels_last is not None:
                n += 1
            opener = out[-1 - n] if n and n < len(out) else None
            if isinstance(opener, Route) and opener.op == arch.op("permute", order=(2, 3, 1)):
                norms = [Piece(p.module, p.entries, p.owner) for p in out[len(out) - n :]]  # type: ignore[union-attr]
                del out[len(out) - n - 1 :]
                out.extend(norms)
                continue
        if (
            isinstance(item, Route)
            and isinstance(last, Route)
            and item.op.op == last.op.op == "permute"
            and _undoes(dict(last.op.args)["order"], dict(item.op.args)["order"])
        ):
            out.pop()
            continue
        if (
            isinstance(item, Route)
            and item.op == arch.op("im2col", k=1, s=1, p=0)
            and isinstance(last, Route)
            and last.op.op == "col2im"
        ):
            out.pop()
            continue
        out.append(item)
    return out


_TO_CHANNELS_LAST, _FROM_CHANNELS_LAST = (2, 3, 1), (3, 1, 2)


def _split_around_norms(items: list[Piece | Route]) -> list[Piece | Route]:
    """A permute just after a channels-last layer norm (or just before one) that is the permute
    back from channels-last (or to it) and others written as one: the permutes apart, so that
    `cancel` finds the pair around each norm (export writes a permute next to a channel_norm so)."""
    out: list[Piece | Route] = []
    for i, item in enumerate(items):
        order = dict(item.op.args).get("order") if isinstance(item, Route) and item.op.op == "permute" else ()
        if len(order) != 3:
            out.append(item)
            continue
        after, before = i > 0 and _is_norm(items[i - 1]), i + 1 < len(items) and _is_norm(items[i + 1])
        orders = [order]
        if after:  # back from channels-last, then the rest
            orders = [_FROM_CHANNELS_LAST, compose_orders(_inverse(_FROM_CHANNELS_LAST), orders[-1])]
        if before:  # the rest, then to channels-last
            orders[-1:] = [compose_orders(orders[-1], _inverse(_TO_CHANNELS_LAST)), _TO_CHANNELS_LAST]
        kept = [o for o in orders if o != (1, 2, 3)]
        out += [Route(arch.op("permute", order=o), item.node) for o in kept] if len(orders) > 1 else [item]
    return out


def compose_orders(first: tuple[int, ...], second: tuple[int, ...]) -> tuple[int, ...]:
    """The order of permuting by `first`, then by `second`."""
    return tuple(first[axis - 1] for axis in second)


def _inverse(order: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(order.index(axis) + 1 for axis in range(1, len(order) + 1))


def _is_norm(item: Piece | Route) -> bool:
    return isinstance(item, Piece) and item.channels_last is not None


def _undoes(first: tuple[int, ...], second: tuple[int, ...]) -> bool:
    """Whether permuting by `first`, then by `second`, gives the axes back in their order."""
    return len(first) == len(second) and compose_orders(first, second) == tuple(range(1, len(first) + 1))


def partner(items: list[Piece | Route], i: int) -> int | None:
    """The route that closes the one at i: the col2im of an im2col (nested pairs skipped), or
    the next permute."""
    opener = items[i].op.op  # type: ignore[union-attr]
    depth = 0
    for j in range(i + 1, len(items)):
        item = items[j]
        if not isinstance(item, Route):
            continue
        if opener == "permute" and item.op.op == "permute":
            return j
        if opener == "im2col" and item.op.op == "im2col":
            depth += 1
        elif opener == "im2col" and item.op.op == "col2im":
            if depth == 0:
                return j
            depth -= 1
    return None

"""How the importer reads ViT's class token: a learnt token put in front of the tokens
(`torch.cat([cls_token.expand(B, -1, -1), x], dim=1)`), and class-token pooling, the classifier
reading the first token (`x[:, 0]`; inside the backbone `x[:, :1]`). `einspace_zoo` has both as
`class_token` and `first_token`; in a grammar without them they are substituted: no class token,
and the mean over the tokens (the grammar's head) in place of the first token.

`TokenRules` is a part of `Converter` (converter.py), which provides the traced model (`values`,
`inputs`, `fail`), the grammar's grid (`terminal`, `grid`) and the record of substitutions.
"""

from __future__ import annotations

import builtins
import operator

import torch
import torch.fx as fx

from einspace.network.importer.pieces import Piece
from einspace.seeds import architectures as arch

__all__ = ["TokenRules"]

_CLASS_TOKEN = "a class token (a learnt token put in front of the tokens)"
_POOLING = "class-token pooling (the classifier reads the first token, x[:, 0])"


class TokenRules:
    """The class token and the first token, each as the grammar's terminal or substituted."""

    def class_token(self, node: fx.Node) -> tuple[list[Piece], fx.Node] | None:
        """A concatenation along the tokens of a learnt token [1, 1, D] (expanded over the batch)
        and the tokens: the class token, and the tokens it is put in front of; None when `node` is
        not one."""
        if node.target is not torch.cat:
            return None
        tensors = node.args[0] if node.args else node.kwargs.get("tensors")
        dim = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim", 0)
        value = self.values[node]
        if not isinstance(tensors, (list, tuple)) or len(tensors) != 2 or value.dim() != 3 or dim % 3 != 1:
            return None
        token, tokens = tensors
        learnt = self._learnt_token(token)
        if learnt is None or not isinstance(tokens, fx.Node) or tokens not in self.dynamic:
            return None
        if "class_token" not in self.grid:
            self.substituted(
                node, _CLASS_TOKEN, "the tokens without it (grammar einspace_zoo has class_token)"
            )
            return [], tokens
        self.terminal(node, "class_token")
        entry = {"token": learnt.detach().reshape(1, 1, -1).clone()}
        return [Piece(arch.computation("class_token"), (entry,))], tokens

    def _learnt_token(self, token: object) -> torch.Tensor | None:
        """The learnt tensor that `token` is, expanded over the batch ([B, 1, D], reading only
        the input's shape); None when it is not one."""
        if not isinstance(token, fx.Node) or not isinstance(self.values.get(token), torch.Tensor):
            return None
        value = self.values[token]
        learnt, pending, seen = [], [token], set()
        while pending:
            node = pending.pop()
            if node in seen:
                continue
            seen.add(node)
            if node.op == "placeholder":
                return None  # it reads the input's values
            if node.op == "get_attr":
                learnt.append(self.values[node])
            elif not (
                node.target is builtins.getattr or (node.op == "call_method" and node.target == "size")
            ):
                pending.extend(node.all_input_nodes)  # the shape alone is read past getattr and size
        if value.dim() != 3 or value.shape[1] != 1 or len(learnt) != 1:
            return None
        (found,) = learnt
        if found.numel() != value.shape[2]:
            return None
        return found if torch.equal(found.reshape(1, 1, -1).expand_as(value), value) else None

    def first_token(self, node: fx.Node) -> bool:
        """Whether `node` keeps the first token of tokens [B, N, D] as [B, 1, D] (`x[:, :1]`)."""
        return self._token_zero(node, keep=True)

    def _token_zero(self, node: fx.Node, keep: bool) -> bool:
        """Whether `node` reads the first token of tokens [B, N, D]: as [B, 1, D] (keep) or [B, D]."""
        if node.target is not operator.getitem or len(self.inputs(node)) != 1:
            return False
        before, after = self.values[self.inputs(node)[0]], self.values[node]
        if not isinstance(before, torch.Tensor) or before.dim() != 3 or not isinstance(after, torch.Tensor):
            return False
        wanted = before[:, :1] if keep else before[:, 0]
        return after.shape == wanted.shape and torch.equal(after, wanted)

    def in_layout_run(self, node: fx.Node) -> bool:
        """Whether a run of reshapes goes on back to `node`: a layout node, not the grammar's first
        token (`x[:, :1]`, a terminal of its own)."""
        return self.is_layout(node) and not (self.first_token(node) and "first_token" in self.grid)

    def first_token_piece(self, node: fx.Node) -> list[Piece]:
        self.terminal(node, "first_token")
        return [Piece(arch.computation("first_token"), ())]

    def pooled_first_token(self, node: fx.Node) -> tuple[fx.Node, list[Piece]] | None:
        """Class-token pooling before the classifier (`x[:, 0]`): the tokens, and the first token
        kept (the head's mean then reads it) or, without `first_token` in the grammar, nothing
        (the mean over all tokens, substituted). None when `node` is not that."""
        if not self._token_zero(node, keep=False):
            return None
        tokens = self.inputs(node)[0]
        if "first_token" in self.grid:
            return tokens, self.first_token_piece(node)
        self.substituted(
            node,
            _POOLING,
            "the mean over the tokens, the grammar's head (grammar einspace_zoo has first_token)",
        )
        return tokens, []

"""How the importer reads the classification head: a linear layer of the mean (or the max, the
training setting `head_pooling`) over space or tokens, however the pooling is written (`mean`,
`amax`, adaptive pooling, a flatten or view after it); or class-token pooling.

`HeadRules` is a part of `Converter` (converter.py), which provides the traced model (`values`,
`inputs`, `modules`, `fail`, `use`) and the rules for what may stand between (`passes_unchanged`,
`kept_dropout`, `pooled_first_token`).
"""

from __future__ import annotations

import operator

import torch
import torch.fx as fx
import torch.nn.functional as F
from torch import nn

from einspace.network.compiler import HEAD_POOLINGS
from einspace.network.importer.graph import target_name
from einspace.network.importer.pieces import Piece

__all__ = ["HeadRules"]

#: What may stand between the backbone's output and the classifier, by name: the head's
#: reductions (x.mean, torch.amax, ...) and reshapes to [B, C].
_HEAD_POOLS = {f.__name__ for f in HEAD_POOLINGS.values()} | {"flatten", "view", "reshape", "squeeze"}


class HeadRules:
    """The paper's head at the end of a model, with the pooling it uses."""

    def head(self, end: fx.Node) -> tuple[nn.Linear | None, fx.Node, list[Piece], str]:
        """The paper's head at the end (a linear layer of the mean over space or tokens, or of the
        max: `head_pooling`): its linear, the backbone's output, what the backbone ends with
        before the head (class-token pooling) and the pooling; or no head. The pooling is checked
        on the values; what is the identity at inference (dropout, nn.Identity) may stand
        between, and is left out after the pooling (where the grammar has no place for a
        dropout)."""
        if end.op != "call_module" or not isinstance(self.modules[end.target], nn.Linear):
            return None, end, [], "mean"
        pooled = self.values[end.args[0]]
        if not isinstance(pooled, torch.Tensor) or pooled.dim() != 2:
            return None, end, [], "mean"
        candidates, node = [], end.args[0]
        while isinstance(node, fx.Node) and len(self.inputs(node)) == 1:
            if not (self.head_pool(node) or self.passes_unchanged(node)):
                break
            if self.kept_dropout(node) and self.values[node].dim() > 2:  # in the backbone
                break
            node = self.inputs(node)[0]
            candidates.append(node)
        for source in reversed(candidates):  # the earliest value whose mean (max) is the pooled one
            value = self.values[source]
            if value.dim() not in (3, 4) or value.shape[0] != pooled.shape[0]:
                continue
            for pooling, reduce in HEAD_POOLINGS.items():
                reduced = reduce(value, (2, 3) if value.dim() == 4 else 1)
                if reduced.shape == pooled.shape and torch.allclose(reduced, pooled, rtol=1e-5, atol=1e-6):
                    self.use(end)
                    return self.modules[end.target], source, [], pooling
        first = self.pooled_first_token(node) if isinstance(node, fx.Node) else None
        if first is not None:
            self.use(end)
            return self.modules[end.target], *first, "mean"
        what = self.describe(node) if isinstance(node, fx.Node) else "its input"
        if isinstance(node, fx.Node) and node.target is operator.getitem:
            what += " (a slice, such as a class token x[:, 0])"
        raise self.fail(
            end,
            f"the classifier `{end.target}` reads [B, {pooled.shape[1]}] computed by {what}: the "
            "grammar's head is a linear layer of the mean (or max) over space (or tokens) of the "
            "backbone's output, and this is neither",
        )

    def head_pool(self, node: fx.Node) -> bool:
        """A node that may stand between the backbone's output and the classifier: a pooling, or a
        reshape to [B, C]."""
        if node.op == "call_module":
            return isinstance(
                self.modules[node.target], (nn.AdaptiveAvgPool2d, nn.AdaptiveMaxPool2d, nn.Flatten)
            )
        return target_name(node.target) in _HEAD_POOLS or node.target in (
            F.adaptive_avg_pool2d,
            F.adaptive_max_pool2d,
        )

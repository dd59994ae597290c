"""The model's weights in the imported tree: entries of one layer, and the state_dict of the compiled
tree with them (a fresh initialisation where a substitution changed a layer's shape)."""

from __future__ import annotations

import torch
from torch import nn

from einspace.errors import EinspaceError
from einspace.network.compiler import compile_backbone, compile_network
from einspace.network.importer.pieces import Entry
from einspace.state import FeatureState
from einspace.tree import Node

__all__ = ["linear_entry", "rows_of", "transferred_state"]


def linear_entry(weight: torch.Tensor, bias: torch.Tensor | None) -> dict[str, torch.Tensor]:
    bias = torch.zeros(weight.shape[0], dtype=weight.dtype) if bias is None else bias
    return {"weight": weight.detach().clone(), "bias": bias.detach().clone()}


def rows_of(bias: torch.Tensor | None, rows: torch.Tensor) -> torch.Tensor | None:
    return None if bias is None else bias[rows]


def transferred_state(
    tree: Node,
    input: FeatureState,
    classes: int | None,
    entries: tuple[Entry, ...],
    head: nn.Linear | None,
) -> tuple[dict[str, torch.Tensor], list[str]]:
    """A state_dict for the compiled tree: the model's weights where the imported entries fit,
    a fresh initialisation elsewhere; and the names of the layers whose shapes did not fit."""
    if classes is None:
        built, prefix = compile_backbone(tree, input, lower=False), ""
    else:
        built, prefix = compile_network(tree, input, classes, lower=False), "backbone."
    backbone = built if classes is None else built.backbone
    state = built.state_dict()
    holders = [
        (name, m)
        for name, m in backbone.named_modules()
        if any(True for _ in m.parameters(recurse=False)) or any(True for _ in m.buffers(recurse=False))
    ]
    if len(holders) != len(entries):
        raise EinspaceError(f"internal: {len(entries)} imported layers for {len(holders)} compiled ones")
    mismatched = []
    for (name, _), entry in zip(holders, entries, strict=True):
        if entry is None:
            continue
        keys = {local: f"{prefix}{name}.{local}" if name else f"{prefix}{local}" for local in entry}
        if all(key in state and state[key].shape == entry[local].shape for local, key in keys.items()):
            for local, key in keys.items():
                state[key] = entry[local].detach().clone().to(state[key].dtype)
        else:
            mismatched.append(name)
    if head is not None:  # its input width is the backbone's last, which a substitution may change
        entry = linear_entry(head.weight, head.bias)
        keys = {local: f"head.linear.{local}" for local in entry}
        if all(state[key].shape == entry[local].shape for local, key in keys.items()):
            for local, key in keys.items():
                state[key] = entry[local].to(state[key].dtype)
        else:
            mismatched.append("head.linear")
    return state, mismatched

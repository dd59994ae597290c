"""Weight inheritance (Real et al., "Large-Scale Evolution of Image Classifiers", ICML 2017): a
child of evolution starts from its parent's trained weights wherever the variation left the
parent's network unchanged, and from a fresh initialisation elsewhere.

What is unchanged. Parent and child trees are walked together from the root for as long as their
nodes agree in kind and label (the same non-terminal symbol with as many children, a parallel of
as many branches, a repeat as many times); where a subtree is equal in both, each of its
terminals is a candidate, and it inherits when it reads a signal of the same state in both
networks (a mutation upstream may have changed the shape it sees) and its parameters and buffers
have the same shapes. A repeat's copies inherit copy by copy. The classification head inherits
when it reads features of the same state. So a mutation inherits everything outside the subtree
it replaced and a crossover everything outside the subtree it took from the second parent (that
subtree trains afresh: its weights were trained at another place of another network).

Files. A run asked to (`Inheritance.save`) writes its trained weights per terminal path, with its
tree and the state each terminal read, as a file `torch.load(..., weights_only=True)` reads
(tensors and plain values only). A parent file that is missing (pruned, written on another node,
removed from a resumed run), unreadable or of another tree shape is not an error: the child
trains from its fresh initialisation and its metric `inheritance_missing` is 1.

Metrics: `inherited_params` (parameters that start from the parent's values) and
`inherited_share` (their share of the network's parameters, head included).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch import nn

from einspace.checker import CheckedTree
from einspace.errors import EinspaceError
from einspace.evaluators.base import Inheritance
from einspace.evaluators.continuation import save_atomically
from einspace.network.compiler import Network, terminal_modules
from einspace.tree import Node, Nonterminal, Parallel, Path_, Repeat, Terminal, parse_tree, to_text

__all__ = ["Lineage", "unchanged_terminals"]


def _label(node: Node) -> tuple[Any, ...]:
    """What two aligned nodes must share for their children to correspond."""
    if isinstance(node, Terminal):
        return ("terminal", node.op, node.args)
    if isinstance(node, Nonterminal):
        return ("nonterminal", node.symbol, len(node.children))
    if isinstance(node, Parallel):
        return ("parallel", len(node.children))
    if isinstance(node, Repeat):
        return ("repeat", node.times)
    raise EinspaceError(f"unknown tree node {node!r}")


def _terminals(node: Node, path: Path_) -> Iterator[Path_]:
    if isinstance(node, Terminal):
        yield path
    for i, child in enumerate(node.children if not isinstance(node, Repeat) else (node.child,)):
        yield from _terminals(child, (*path, i))


def unchanged_terminals(child: Node, parent: Node) -> list[Path_]:
    """The paths of the child's terminals that lie in a subtree equal to the parent's at the same
    place, reached through nodes that agree in kind and label (the tree side of inheritance; the
    states the terminals read are compared by `Lineage`)."""
    found: list[Path_] = []
    stack: list[tuple[Path_, Node, Node]] = [((), child, parent)]
    while stack:
        path, c, p = stack.pop()
        if c == p:
            found.extend(_terminals(c, path))
        elif not isinstance(c, Terminal) and _label(c) == _label(p):
            kids_c = (c.child,) if isinstance(c, Repeat) else c.children
            kids_p = (p.child,) if isinstance(p, Repeat) else p.children
            stack.extend(((*path, i), a, b) for i, (a, b) in enumerate(zip(kids_c, kids_p, strict=True)))
    return sorted(found)


def _key(path: Path_) -> str:
    return ".".join(map(str, path))


def _same_shapes(fresh: dict[str, torch.Tensor], saved: dict[str, Any]) -> bool:
    return fresh.keys() == saved.keys() and all(
        isinstance(saved[k], torch.Tensor) and saved[k].shape == v.shape for k, v in fresh.items()
    )


class Lineage:
    """One run's side of inheritance: built on the network before it is lowered, it loads what
    the parent's file gives (`inherit`) and, after training, writes the run's own file (`save`)."""

    def __init__(self, inheritance: Inheritance, checked: CheckedTree, network: nn.Module):
        if not isinstance(network, Network):
            raise EinspaceError(f"weight inheritance needs a compiled Network, not {type(network).__name__}")
        self.inheritance, self.checked, self.network = inheritance, checked, network
        self.terminals = terminal_modules(network.backbone)
        # state_dict keys of each terminal's copies in the whole network: lowering keeps them
        # (a kernel adopts its slots' parameters under their names), so they find the trained
        # values in the lowered network too
        names = {id(m): name for name, m in network.named_modules()}
        self.keys = {
            path: [{k: f"{names[id(m)]}.{k}" for k in m.state_dict()} for m in modules]
            for path, modules in self.terminals.items()
        }

    def _reads(self, path: Path_) -> str:
        return str(self.checked.facts[path].input)

    def inherit(self) -> dict[str, float]:
        """Load the parent's weights into the unchanged terminals (and head); the metrics (none
        for a run with no parent)."""
        if self.inheritance.parent is None:
            return {}
        total = sum(p.numel() for p in self.network.parameters())
        read = self._read(self.inheritance.parent)
        if read is None:
            return {
                "inherited_params": 0.0,
                "inherited_share": 0.0,
                "inherited_head": 0.0,
                "inheritance_missing": 1.0,
            }
        saved, parent_tree = read
        inherited = 0
        for path in unchanged_terminals(self.checked.tree, parent_tree):
            entry = saved["terminals"].get(_key(path))
            modules = self.terminals.get(path, [])
            if entry is None or entry["reads"] != self._reads(path) or len(entry["states"]) != len(modules):
                continue
            inherited += sum(self._load(m, s) for m, s in zip(modules, entry["states"], strict=True))
        head, head_params = saved.get("head"), 0
        if head is not None and head["reads"] == str(self.checked.output):
            head_params = self._load(self.network.head, head["state"])
        inherited += head_params
        return {
            "inherited_params": float(inherited),
            "inherited_share": inherited / total if total else 0.0,
            "inherited_head": float(head_params > 0),
            "inheritance_missing": 0.0,
        }

    @staticmethod
    def _load(module: nn.Module, state: dict[str, Any]) -> int:
        """Load `state` into `module` if it fits it exactly; the parameters loaded."""
        if not _same_shapes(module.state_dict(), state):
            return 0
        module.load_state_dict(state)
        return sum(p.numel() for p in module.parameters())

    @staticmethod
    def _read(path: str | None) -> tuple[dict[str, Any], Node] | None:
        """The parent's saved weights and its tree (None: no usable file)."""
        if path is None or not Path(path).is_file():
            return None
        try:
            saved = torch.load(path, map_location="cpu", weights_only=True)
            tree = parse_tree(saved["tree"])
        except Exception:  # noqa: BLE001 - any unusable file means: start fresh
            return None
        ok = isinstance(saved, dict) and isinstance(saved.get("terminals"), dict)
        return (saved, tree) if ok else None

    def save(self, trained: nn.Module) -> dict[str, float]:
        """Write the trained weights of `trained` (the network this lineage was built on, maybe
        lowered and moved to a device) where asked; whether it worked."""
        if self.inheritance.save is None:
            return {}
        values = trained.state_dict()

        def state(keys: dict[str, str]) -> dict[str, torch.Tensor]:
            return {k: values[q].detach().cpu().clone() for k, q in keys.items()}

        terminals = {
            _key(path): {"reads": self._reads(path), "states": [state(k) for k in copies]}
            for path, copies in self.keys.items()
            if any(copies) and all(q in values for k in copies for q in k.values())
        }
        head = state({k: f"head.{k}" for k in self.network.head.state_dict()})
        content = {
            "tree": to_text(self.checked.tree),
            "terminals": terminals,
            "head": {"reads": str(self.checked.output), "state": head},
        }
        return {"weights_saved": float(save_atomically(content, self.inheritance.save))}

"""Does an operation do what it says? Build its module and run it, against its `infer` and counts.

The sampler and checker trust each operation's `infer` (shapes) and `param_count`; a plugin
whose module disagrees with them yields trees that check and then fail at forward time, or
budgets that are wrong. `verify_operations` builds every distinct (operation, arguments,
input) that appears in trees sampled from a grammar, runs a batch of 2 through it on the CPU,
and reports each disagreement (`einspace check GRAMMAR --input C,H,W --verify N`).
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Any

import torch

from einspace.grammar.model import Grammar
from einspace.ops.registry import Group, Operation, get_op
from einspace.state import FeatureState, Signal, describe

__all__ = ["verify_operation", "verify_operations"]


def verify_operation(op: Operation, signal: Signal, args: Mapping[str, Any]) -> str | None:
    """None if `op`'s module, run on random input of `signal`, gives the shapes `infer` says
    and has `param_count` parameters; otherwise what differs (or what the module raised)."""
    call = f"{op.name}({', '.join(f'{k}={v}' for k, v in args.items())}) on {describe(signal)}"
    expected = op.transfer(signal, args)
    try:
        module = op.build(signal, args)
        tensors = [torch.randn(2, *state.shape) for state in signal]
        with torch.no_grad():
            out = module(tensors if op.group is Group.AGGREGATION or len(signal) > 1 else tensors[0])
    except Exception as exc:  # noqa: BLE001 - what a plugin's module raises is the finding
        return f"{call}: the module raised {type(exc).__name__}: {exc}"
    outs = out if isinstance(out, (list, tuple)) else [out]
    if not all(isinstance(t, torch.Tensor) for t in outs):
        return f"{call}: the module returned {type(out).__name__}, not tensors"
    got = [tuple(t.shape[1:]) for t in outs]
    want = [state.shape for state in expected]
    if got != want:
        return f"{call}: infer says {want} but the module outputs {got}"
    params = sum(p.numel() for p in module.parameters())
    if params != op.param_count(signal, args):
        return f"{call}: param_count says {op.param_count(signal, args)} but the module has {params}"
    return None


def verify_operations(
    grammar: Grammar, input: FeatureState, trees: int = 20, random_seed: int = 0
) -> list[str]:
    """The problems `verify_operation` finds in every distinct operation use of `trees` trees
    sampled within CPU-sized limits (20 deep, 300 nodes, 5M parameters)."""
    from einspace.checker import check_tree
    from einspace.sampling.base import Limits
    from einspace.sampling.paper import Sampler
    from einspace.tree import Terminal, walk

    limits = Limits(max_depth=20, max_nodes=300, max_params=5_000_000)
    sampler = Sampler(grammar, input, limits, rng=random.Random(random_seed))
    seen: set[tuple[Any, Signal]] = set()
    problems: list[str] = []
    for _ in range(trees):
        checked = check_tree(sampler.sample(), grammar, input)
        for path, node in walk(checked.tree):
            signal = checked.facts[path].input
            if not isinstance(node, Terminal) or (node, signal) in seen:
                continue
            seen.add((node, signal))
            problem = verify_operation(get_op(node.op), signal, dict(node.args))
            if problem:
                problems.append(problem)
    return problems

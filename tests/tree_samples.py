"""Small sampled trees for the tests that run networks literally (lowering, export):
deterministic, and cheap enough to run in float64 in milliseconds."""

from __future__ import annotations

from collections.abc import Sequence

from einspace import Limits, Sampler, check_tree
from einspace.checker import CheckedTree
from einspace.errors import SamplingError
from einspace.grammar.model import Grammar
from einspace.state import input_state
from einspace.tree import Terminal, walk


def cheap(checked: CheckedTree, max_flops: float, max_instances: int) -> bool:
    """Few FLOPs and few module instances: nested repeats multiply the instances, which the
    tree limits (counting nodes) do not see."""
    instances = sum(checked.facts[p].copies for p, n in walk(checked.tree) if isinstance(n, Terminal))
    return checked.flops <= max_flops and instances <= max_instances


def sampled_trees(
    grammar: Grammar,
    inputs: Sequence[tuple[int, ...]],
    limits: Limits,
    count: int,
    *,
    max_flops: float,
    max_instances: int,
    first_seed: int = 1,
) -> list[CheckedTree]:
    """The first `count` cheap trees sampled with seeds first_seed, first_seed + 1, ..., seed s
    on input inputs[s % len(inputs)]; seeds that find no tree are passed over."""
    trees: list[CheckedTree] = []
    seed = first_seed
    while len(trees) < count:
        x = input_state(inputs[seed % len(inputs)])
        try:
            tree = Sampler(grammar, x, limits, random_seed=seed).sample()
        except SamplingError:
            tree = None
        seed += 1
        if tree is not None and cheap(checked := check_tree(tree, grammar, x), max_flops, max_instances):
            trees.append(checked)
    return trees

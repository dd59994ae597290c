"""Mutation (paper Sec. 4.1) and crossover: new valid trees from old ones."""

from __future__ import annotations

import random

from einspace.checker import CheckedTree, check_tree
from einspace.errors import TreeError, VariationError
from einspace.grammar.model import Grammar
from einspace.sampling.base import Limits, cyclic_gc_paused
from einspace.sampling.paper import Sampler
from einspace.state import FeatureState, Signal
from einspace.tree import Node, Nonterminal, Path_, node_at, replace_at, walk, walk_depths


def limit_violation(checked: CheckedTree, limits: Limits) -> str | None:
    """Which limit a checked tree breaks, if any (mutation and crossover keep trees within them)."""
    stats = checked.stats
    if stats.depth > limits.max_depth:
        return f"depth {stats.depth} > max_depth {limits.max_depth}"
    if stats.nodes > limits.max_nodes:
        return f"{stats.nodes} nodes > max_nodes {limits.max_nodes}"
    violation = limits.cost_violation(checked.params, checked.flops)
    return violation[1] if violation else None


def _depths_and_sizes(tree: Node) -> tuple[dict[Path_, int], dict[Path_, int]]:
    """Per node: its depth (`walk_depths`), and the nodes in its subtree that `max_nodes` counts
    (terminals and non-terminals)."""
    rows = list(walk_depths(tree))
    depths = {path: depth for path, _, depth in rows}
    sizes: dict[Path_, int] = {}
    for path, node, _ in reversed(rows):  # reversed pre-order: children before their parent
        own = node.kind in ("terminal", "nonterminal")
        sizes[path] = own + sum(sizes[(*path, i)] for i in range(len(node.children)))
    return depths, sizes


class Variation:
    """Mutation and crossover for one grammar and input, within `limits`, from one random stream.

    Both only ever return trees that check against the grammar and input and stay within the
    limits; neither returns a tree identical to its (first) parent.
    """

    def __init__(
        self,
        grammar: Grammar,
        input: FeatureState | Signal,
        limits: Limits | None = None,
        rng: random.Random | None = None,
        max_tries: int = 50,
    ):
        self.grammar = grammar
        self.input = input
        self.limits = limits or Limits()
        self.rng = rng or random.Random()
        self.max_tries = max_tries
        self.sampler = Sampler(grammar, input, self.limits, rng=self.rng)

    def _valid(self, tree: Node) -> CheckedTree | None:
        try:
            checked = check_tree(tree, self.grammar, self.input)
        except TreeError:
            return None
        return None if limit_violation(checked, self.limits) else checked

    def mutate(self, tree: Node) -> Node:
        """Pick a non-terminal uniformly (root included) and derive its subtree anew from its
        inherited signal; downstream nodes are re-checked, and a derivation that breaks them is
        skipped in favour of the sampler's next one (backtracking, not blind retries)."""
        return self.mutate_checked(tree).tree

    def mutate_checked(self, tree: Node) -> CheckedTree:
        """`mutate`, returning the child checked (its costs at hand, not computed again)."""
        with cyclic_gc_paused():
            return self._mutate(tree)

    def _mutate(self, tree: Node) -> CheckedTree:
        checked = check_tree(tree, self.grammar, self.input)
        depths, sizes = _depths_and_sizes(tree)
        total = sizes[()]
        candidates = [path for path, node in walk(tree) if isinstance(node, Nonterminal)]
        limits = self.limits
        for _ in range(self.max_tries):
            path = self.rng.choice(candidates)
            facts = checked.facts[path]
            old = node_at(tree, path)
            assert isinstance(old, Nonterminal)
            params = float("inf")
            if limits.max_params is not None:
                params = (limits.max_params - checked.params + facts.params * facts.copies) / facts.copies
            derivations = self.sampler.derivations(
                old.symbol,
                facts.input,
                limits.max_depth - depths[path] + 1,  # the levels from its own down
                limits.max_nodes - total + sizes[path],
                params,
            )
            for new, _, _, _ in derivations:
                if new == old:
                    continue
                child = self._valid(replace_at(tree, path, new))
                if child is not None:
                    return child
        raise VariationError(
            f"no valid mutation found in {self.max_tries} tries within {limits.describe()}; "
            "the tree may be minimal, or the limits too tight"
        )

    def crossover(self, a: Node, b: Node) -> Node:
        """`a` with one of its subtrees replaced by a subtree of `b` that has the same symbol and
        receives the same signal; as in `mutate`, the nodes after it are re-checked, and a donor
        that breaks them is passed over."""
        return self.crossover_checked(a, b).tree

    def crossover_checked(self, a: Node, b: Node) -> CheckedTree:
        """`crossover`, returning the child checked."""
        with cyclic_gc_paused():
            return self._crossover(a, b)

    def _crossover(self, a: Node, b: Node) -> CheckedTree:
        checked_a = check_tree(a, self.grammar, self.input)
        checked_b = check_tree(b, self.grammar, self.input)
        donors: dict[tuple, list[Node]] = {}
        for path, node in walk(b):
            if isinstance(node, Nonterminal):
                donors.setdefault((node.symbol, checked_b.facts[path].input), []).append(node)
        # The root is no site: exchanging it would just return `b`.
        sites = [path for path, node in walk(a) if path and isinstance(node, Nonterminal)]
        self.rng.shuffle(sites)
        tries = 0
        for path in sites:
            node = node_at(a, path)
            options = [d for d in donors.get((node.symbol, checked_a.facts[path].input), ()) if d != node]
            self.rng.shuffle(options)
            for donor in options:
                child = self._valid(replace_at(a, path, donor))
                if child is not None:
                    return child
                tries += 1
                if tries >= self.max_tries:
                    raise VariationError(
                        f"no valid crossover found in {self.max_tries} tries within {self.limits.describe()}"
                    )
        raise VariationError("the parents share no exchangeable subtrees (same symbol and input signal)")

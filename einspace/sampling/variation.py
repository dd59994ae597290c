"""Mutation (paper Sec. 4.1) and crossover: new valid trees from old ones.

Three mutation operators, chosen per try by weight (`Variation(mutations=...)`):

- `subtree` (the paper's): a node's subtree derived anew from the signal it receives;
- `insert`: a new derivation of a node's symbol put before or after the node, the two joined by
  the symbol's sequence rule (`M -> M M`), so that the node's own subtree is kept whole;
- `remove`: a node made by a sequence rule replaced by one of its two parts.

`subtree` alone often rebuilds what worked along with what did not; `insert` and `remove` add or
drop one stage and keep the rest (Real et al., "Large-Scale Evolution of Image Classifiers", 2017:
insert and remove a layer).
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterator, Mapping

from einspace.checker import CheckedTree, check_tree
from einspace.errors import TreeError, VariationError
from einspace.grammar.model import Grammar
from einspace.sampling.base import Limits, cyclic_gc_paused
from einspace.sampling.paper import Sampler
from einspace.state import FeatureState, Signal
from einspace.tree import Node, Nonterminal, Path_, node_at, replace_at, walk, walk_depths

#: The mutation operators, in the order their weights are drawn (module docstring).
MUTATIONS = ("subtree", "insert", "remove")


def limit_violation(checked: CheckedTree, limits: Limits) -> str | None:
    """Which limit a checked tree breaks, if any (mutation and crossover keep trees within them)."""
    stats = checked.stats
    if stats.depth > limits.max_depth:
        return f"depth {stats.depth} > max_depth {limits.max_depth}"
    if stats.nodes > limits.max_nodes:
        return f"{stats.nodes} nodes > max_nodes {limits.max_nodes}"
    violation = limits.cost_violation(checked)
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


def mutation_weights(mutations: Mapping[str, float] | None) -> dict[str, float]:
    """The operators' weights, checked: known names, non-negative numbers, some weight in all
    (None: the paper's `subtree` alone)."""
    if mutations is None:
        mutations = {"subtree": 1.0}
    if not isinstance(mutations, Mapping):
        raise VariationError(f"mutations must map operators {list(MUTATIONS)} to weights, got {mutations!r}")
    unknown = sorted(set(mutations) - set(MUTATIONS))
    if unknown:
        raise VariationError(f"unknown mutation operator(s) {unknown}; the operators are {list(MUTATIONS)}")
    for name, weight in mutations.items():
        if isinstance(weight, bool) or not isinstance(weight, int | float) or not 0 <= weight < math.inf:
            raise VariationError(f"mutation weight of {name!r} must be a finite number >= 0, got {weight!r}")
    if not sum(mutations.values()) > 0:
        raise VariationError(f"mutation weights {dict(mutations)} are all zero: give some operator a weight")
    return {name: float(mutations.get(name, 0.0)) for name in MUTATIONS}


def sequence_symbols(grammar: Grammar) -> frozenset[str]:
    """The symbols X with a sequence rule `X -> X X` (under some guard): where `insert` can put a
    stage and `remove` can take one out."""
    return frozenset(
        rule.symbol
        for rule in grammar.rules
        for alternative in rule.alternatives
        if alternative.probability > 0
        and len(alternative.items) == 2
        and all(item.kind == "symbol" and item.name == rule.symbol for item in alternative.items)
    )


def _is_sequence(node: Nonterminal) -> bool:
    """Whether `node` was derived by its symbol's sequence rule: two parts of its own symbol."""
    return len(node.children) == 2 and all(
        isinstance(part, Nonterminal) and part.symbol == node.symbol for part in node.children
    )


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
        mutations: Mapping[str, float] | None = None,
    ):
        self.grammar = grammar
        self.mutations = mutation_weights(mutations)
        self._sequences = sequence_symbols(grammar)
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
        """Pick an operator by weight and a site for it uniformly (any non-terminal, root
        included, for `subtree`), and derive the change from the signal the site receives;
        downstream nodes are re-checked, and a derivation that breaks them is skipped in favour
        of the sampler's next one (backtracking, not blind retries)."""
        return self.mutate_checked(tree).tree

    def mutate_checked(self, tree: Node) -> CheckedTree:
        """`mutate`, returning the child checked (its costs at hand, not computed again)."""
        with cyclic_gc_paused():
            return self._mutate(tree)

    def _mutate(self, tree: Node) -> CheckedTree:
        checked = check_tree(tree, self.grammar, self.input)
        depths, sizes = _depths_and_sizes(tree)
        sites: dict[str, list[Path_]] = {name: [] for name in MUTATIONS}
        for path, node in walk(tree):
            if isinstance(node, Nonterminal):
                sites["subtree"].append(path)
                if node.symbol in self._sequences:
                    sites["insert"].append(path)
                    if _is_sequence(node):
                        sites["remove"].append(path)
        operators = [name for name in MUTATIONS if self.mutations[name] > 0 and sites[name]]
        if not operators:
            raise VariationError(
                f"no site for the mutation operators {[n for n in MUTATIONS if self.mutations[n] > 0]} "
                "in this tree (insert and remove need a symbol with a sequence rule X -> X X)"
            )
        weights = [self.mutations[name] for name in operators]
        for _ in range(self.max_tries):
            # one operator: no draw, so the paper's `subtree` alone keeps its random stream
            operator = operators[0] if len(operators) == 1 else self.rng.choices(operators, weights)[0]
            path = self.rng.choice(sites[operator])
            old = node_at(tree, path)
            assert isinstance(old, Nonterminal)
            for new in self._changes(operator, old, checked, path, depths, sizes):
                if new == old:
                    continue
                child = self._valid(replace_at(tree, path, new))
                if child is not None:
                    return child
        raise VariationError(
            f"no valid mutation found in {self.max_tries} tries within {self.limits.describe()}; "
            "the tree may be minimal, or the limits too tight"
        )

    def _changes(
        self,
        operator: str,
        old: Nonterminal,
        checked: CheckedTree,
        path: Path_,
        depths: dict[Path_, int],
        sizes: dict[Path_, int],
    ) -> Iterator[Node]:
        """The replacements `operator` proposes for `old`, the node at `path`, in the order to try them."""
        if operator == "remove":
            parts = list(old.children)
            self.rng.shuffle(parts)
            yield from parts
            return
        facts, limits = checked.facts[path], self.limits
        params = float("inf")
        if limits.max_params is not None:
            own = facts.params if operator == "subtree" else 0
            params = (limits.max_params - checked.params + own * facts.copies) / facts.copies
        total = sizes[()]
        if operator == "subtree":
            derivations = self.sampler.derivations(
                old.symbol,
                facts.input,
                limits.max_depth - depths[path] + 1,  # the levels from its own down
                limits.max_nodes - total + sizes[path],
                params,
            )
            for new, _, _, _ in derivations:
                yield new
            return
        before = self.rng.random() < 0.5
        derivations = self.sampler.derivations(
            old.symbol,
            facts.input if before else facts.output,
            limits.max_depth - depths[path],  # one level below the new sequence node
            limits.max_nodes - total - 1,  # the sequence node itself counts
            params,
        )
        for new, _, _, _ in derivations:
            yield Nonterminal(old.symbol, (new, old) if before else (old, new))

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

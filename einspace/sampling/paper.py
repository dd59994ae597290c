"""The `paper` sampling mode: top-down, attribute-checked sampling with chronological backtracking.

Each symbol is expanded left to right carrying the signal (the features' attributes). An
alternative is drawn with its probability among those not yet tried; an operation's
arguments are drawn uniformly among the grid points not yet tried. Alternatives whose guard,
shapes, depth, size or parameter budget rule them out are skipped, which renormalises the
probabilities over the feasible ones. When a later item finds no feasible option, the latest
untried decision is revisited (the sampler is a lazy depth-first search written with
generators; see `_COMPLETIONS_PER_CHOICE`), so a sample never fails a forward pass.

A complete tree below `min_params` or `min_flops`, or above `max_flops` or `max_operations` (costs
known only once it is whole), is rejected and the search goes on, to the next derivation or a new
attempt, like a tree below `min_depth`.

The search is bounded by a step budget per attempt; an attempt that exhausts it is restarted
with the random stream where it stands, and after `max_attempts` the sampler gives up with a
message. Nothing waits on a clock and nothing runs a network.

Renormalising locally and backtracking make this distribution differ from the grammar's
conditioned on validity (it favours larger trees: `benchmarks/sampling.py` measures by how much);
`einspace.sampling.exact` is the mode that draws from the latter.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass

from einspace.errors import Infeasible, SamplingError
from einspace.grammar.model import Grammar, Item, OpItem, ParallelItem, RepeatItem, SymbolItem
from einspace.ops.registry import get_op
from einspace.sampling.base import SamplerBase, cyclic_gc_paused
from einspace.state import Signal, describe
from einspace.tree import Node, Nonterminal, Parallel, Repeat, Terminal, tree_depth

_INF = float("inf")

#: How many completed derivations a symbol with a choice offers before giving up. With 1, a
#: failure downstream never reopens a finished subtree: it revisits the latest untried
#: argument choice of an operation in the same alternative, else the enclosing symbol's next
#: alternative. Reopening finished subtrees (chronological backtracking into their deepest
#: choices) thrashes: measured 10x fewer nodes per second on the paper's grammar.
_COMPLETIONS_PER_CHOICE = 1

#: Memoised rule look-ups and operation inferences kept before the caches are cleared.
_CACHE_LIMIT = 20_000

#: What a derivation yields: the subtree, the signal after it, its node count and parameters.
Derivation = tuple[Node, Signal, int, int]


class _OutOfSteps(Exception):
    """Internal: the current attempt used up its step budget."""


@dataclass(frozen=True)
class _Alt:
    """An alternative prepared for sampling: items with their minimum sizes and heights."""

    probability: float
    items: tuple[Item, ...]
    min_nodes: int
    min_height: int
    reserve: tuple[int, ...]  # reserve[k]: minimum nodes the items after k still need


class Sampler(SamplerBase):
    """Samples derivation trees from a grammar for a given input; reproducible by random seed.

    >>> sampler = Sampler(load_grammar("grammars/einspace.pcfg"), input_state((3, 32, 32)), random_seed=0)
    >>> tree = sampler.sample()
    """

    def _setup(self) -> None:
        self._min_nodes, self._min_height = _minimum_sizes(self.grammar)
        self._alts = {
            (sym, id(rule)): tuple(self._prepare(alt.items, alt.probability) for alt in rule.alternatives)
            for sym in self.grammar.nonterminals
            for rule in self.grammar.rules_for(sym)
        }
        self._rules: dict[tuple[str, Signal], object] = {}
        self._infer: dict[tuple[str, tuple, Signal], tuple[Signal, int] | None] = {}
        self._steps = 0
        #: complete trees rejected for a minimum on their costs, by the setting's name.
        self._rejected: Counter[str] = Counter()

    # ------------------------------------------------------------------ public API

    def sample(self) -> Node:
        """A tree for the whole input, or SamplingError after the attempts run out."""
        tree = self._search(
            lambda: self._symbol(
                self.grammar.start,
                self.input,
                self.limits.max_depth,
                self.limits.max_nodes,
                self._param_budget(),
            ),
            accept=self._complete,
            what=f"tree of {self.grammar.start} for input {describe(self.input)}",
        )
        return tree[0]

    def _complete(self, derivation: Derivation) -> bool:
        """Whether a derivation of the start symbol is a tree to return: one output branch, at
        least `min_depth` deep, and no minimum unmet (a tree below one is rejected whole)."""
        tree, out = derivation[0], derivation[1]
        if len(out) != 1 or tree_depth(tree) < self.limits.min_depth:
            return False
        violation = self._cost_violation(tree)
        if violation:
            self._rejected[violation] += 1
            return False
        return True

    def derivations(
        self, symbol: str, signal: Signal, max_depth: int, max_nodes: int, max_params: float = _INF
    ) -> Iterator[Derivation]:
        """Derivations of `symbol` at `signal`, lazily, in sampling order (for mutation).

        The caller stops at the first it likes. The iteration ends quietly when the step
        budget (`limits.max_steps`) runs out.
        """
        self._steps = 0
        try:
            yield from self._symbol(symbol, signal, max_depth, max_nodes, max_params)
        except _OutOfSteps:
            return

    # ------------------------------------------------------------------ search driver

    def _search(self, start, accept, what: str) -> Derivation:
        """Run attempts until one yields an accepted derivation. An attempt ends in a dead end
        (every option tried, see `_COMPLETIONS_PER_CHOICE`) or by running out of steps; both
        restart with the random stream where it stands, which changes the choices."""
        if len(self._infer) + len(self._rules) > _CACHE_LIMIT:
            self._infer.clear()
            self._rules.clear()
        with cyclic_gc_paused():
            return self._attempts(start, accept, what)

    def _attempts(self, start, accept, what: str) -> Derivation:
        limits = self.limits
        out_of_steps = 0
        self._rejected.clear()
        for _ in range(limits.max_attempts):
            self._steps = 0
            try:
                for derivation in start():
                    if accept(derivation):
                        return derivation
                    self._step()
            except _OutOfSteps:
                out_of_steps += 1
            except RecursionError:
                raise SamplingError(f"{what}: trees too deep for Python; lower max_depth") from None
        dead_ends = limits.max_attempts - out_of_steps
        rejected = "".join(f", {n} trees rejected by {name}" for name, n in self._rejected.items())
        raise SamplingError(
            f"found no {what} in {limits.max_attempts} attempts ({dead_ends} dead ends, {out_of_steps} ran "
            f"out of {limits.max_steps} steps{rejected}) within {limits.describe()}; "
            "the grammar may not fit this input, or the limits are too tight"
        )

    def _step(self) -> None:
        self._steps += 1
        if self._steps > self.limits.max_steps:
            raise _OutOfSteps

    def _param_budget(self) -> float:
        return _INF if self.limits.max_params is None else self.limits.max_params

    # ------------------------------------------------------------------ expansion

    def _symbol(
        self, name: str, signal: Signal, depth: int, nodes: int, params: float
    ) -> Iterator[Derivation]:
        if self._min_height[name] > depth or self._min_nodes[name] > nodes:
            return
        key = (name, signal)
        rule = self._rules.get(key)
        if rule is None:
            rule = self._rules[key] = self.grammar.rule_for(name, signal) or False
        if rule is False:
            return
        self._step()
        alts = [a for a in self._alts[(name, id(rule))] if a.min_height < depth and a.min_nodes < nodes]
        rng = self.rng
        offered = 0
        cap = _COMPLETIONS_PER_CHOICE if len(alts) > 1 else _INF
        while alts:
            total = sum(a.probability for a in alts)
            r = rng.random() * total
            index = len(alts) - 1
            for i, a in enumerate(alts):
                r -= a.probability
                if r < 0:
                    index = i
                    break
            alt = alts.pop(index)
            for kids, out, n, p in self._items(alt, 0, signal, depth - 1, nodes - 1, params):
                yield Nonterminal(name, kids), out, n + 1, p
                offered += 1
                if offered >= cap:
                    return

    def _items(
        self, alt: _Alt, k: int, signal: Signal, depth: int, nodes: int, params: float
    ) -> Iterator[tuple[tuple[Node, ...], Signal, int, int]]:
        if k == len(alt.items):
            yield (), signal, 0, 0
            return
        budget = nodes - alt.reserve[k]
        for child, out, n, p in self._item(alt.items[k], signal, depth, budget, params):
            for rest, final, n2, p2 in self._items(alt, k + 1, out, depth, nodes - n, params - p):
                yield (child, *rest), final, n + n2, p + p2

    def _item(
        self, item: Item, signal: Signal, depth: int, nodes: int, params: float
    ) -> Iterator[Derivation]:
        if isinstance(item, SymbolItem):
            return self._symbol(item.name, signal, depth, nodes, params)
        if isinstance(item, OpItem):
            return self._op(item, signal, nodes, params)
        if isinstance(item, ParallelItem):
            return self._parallel(item, signal, depth, nodes, params)
        return self._repeat(item, signal, depth, nodes, params)

    def _op(self, item: OpItem, signal: Signal, nodes: int, params: float) -> Iterator[Derivation]:
        if nodes < 1:
            return
        choices = list(item.choices)
        rng = self.rng
        while choices:
            self._step()
            args = choices.pop(rng.randrange(len(choices))) if len(choices) > 1 else choices.pop()
            result = self._apply(item.name, args, signal)
            if result is not None and result[1] <= params:
                yield Terminal(item.name, args), result[0], 1, result[1]

    def _apply(self, op_name: str, args: tuple, signal: Signal) -> tuple[Signal, int] | None:
        """Output signal and parameter count of an operation, or None if infeasible (memoised)."""
        key = (op_name, args, signal)
        try:
            return self._infer[key]
        except KeyError:
            pass
        op = get_op(op_name)
        kwargs = dict(args)
        try:
            result = (op.transfer(signal, kwargs), op.param_count(signal, kwargs))
        except Infeasible:
            result = None
        self._infer[key] = result
        return result

    def _parallel(self, item: ParallelItem, signal: Signal, depth: int, nodes: int, params: float):
        if len(signal) != len(item.items):
            return
        reserve = [
            sum(_item_min_nodes(i, self._min_nodes) for i in item.items[k + 1 :])
            for k in range(len(item.items))
        ]

        def branches(k: int, nodes: int, params: float):
            if k == len(item.items):
                yield (), (), 0, 0
                return
            for child, out, n, p in self._item(
                item.items[k], signal[k : k + 1], depth, nodes - reserve[k], params
            ):
                if len(out) != 1:
                    continue
                for rest, outs, n2, p2 in branches(k + 1, nodes - n, params - p):
                    yield (child, *rest), out + outs, n + n2, p + p2

        for kids, out, n, p in branches(0, nodes, params):
            yield Parallel(kids), out, n, p

    def _repeat(self, item: RepeatItem, signal: Signal, depth: int, nodes: int, params: float):
        times = len(signal) if item.times is None else item.times
        if len(signal) != times or times < 1 or any(s != signal[0] for s in signal):
            return
        for child, out, n, p in self._item(item.item, signal[:1], depth, nodes, params / times):
            if len(out) == 1:
                yield Repeat(child, times), out * times, n, p * times

    # ------------------------------------------------------------------ preparation

    def _prepare(self, items: tuple[Item, ...], probability: float) -> _Alt:
        sizes = [_item_min_nodes(i, self._min_nodes) for i in items]
        heights = [_item_min_height(i, self._min_height) for i in items]
        reserve = tuple(sum(sizes[k + 1 :]) for k in range(len(items)))
        return _Alt(probability, items, sum(sizes), max(heights, default=0), reserve)


def _item_minimum(item: Item, symbol: dict[str, float], op: int, combine) -> float:
    """The least of a measure an item can have, given each symbol's: nodes (op 1, parallel
    branches summed) or non-terminal height (op 0, parallel branches by their maximum)."""
    if isinstance(item, SymbolItem):
        return symbol[item.name]
    if isinstance(item, OpItem):
        return op
    if isinstance(item, ParallelItem):
        return combine(_item_minimum(i, symbol, op, combine) for i in item.items)
    return _item_minimum(item.item, symbol, op, combine)


def _item_min_nodes(item: Item, symbol: dict[str, float]) -> float:
    return _item_minimum(item, symbol, 1, sum)


def _item_min_height(item: Item, symbol: dict[str, float]) -> float:
    return _item_minimum(item, symbol, 0, max)


def _minimum_sizes(grammar: Grammar) -> tuple[dict[str, float], dict[str, float]]:
    """Fewest nodes and fewest non-terminal levels each symbol can derive, ignoring guards
    and shapes (a lower bound, so pruning on it never removes a feasible option)."""
    nodes = {s: _INF for s in grammar.nonterminals}
    height = {s: _INF for s in grammar.nonterminals}
    changed = True
    while changed:
        changed = False
        for rule in grammar.rules:
            for alt in rule.alternatives:
                n = 1 + sum(_item_min_nodes(i, nodes) for i in alt.items)
                h = 1 + max((_item_min_height(i, height) for i in alt.items), default=0)
                if n < nodes[rule.symbol]:
                    nodes[rule.symbol], changed = n, True
                if h < height[rule.symbol]:
                    height[rule.symbol], changed = h, True
    return nodes, height

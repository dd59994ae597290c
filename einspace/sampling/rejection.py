"""The textbook reference for the conditioned distribution: sample the PCFG blindly, keep valid trees.

Each alternative is drawn with its probability and each operation's arguments uniformly from its
whole grid, without looking at guards, shapes or limits; a draft that meets a guard that holds
nowhere, an operation that cannot apply, or a limit it breaks is thrown away whole. What is kept is
the PCFG conditioned on validity, by definition. It shares no tables with the exact mode, which
makes it the yardstick the exact mode is tested against; it is slow where valid trees are rare.
"""

from __future__ import annotations

from collections import Counter

from einspace.errors import Infeasible, SamplingError
from einspace.grammar.model import Item, OpItem, ParallelItem, SymbolItem
from einspace.ops.registry import get_op
from einspace.sampling.base import SamplerBase, cyclic_gc_paused
from einspace.state import Signal, describe
from einspace.tree import Node, Nonterminal, Parallel, Repeat, Terminal

__all__ = ["RejectionSampler"]


class _Invalid(Exception):
    """Internal: the draft is not a valid tree within the limits; `args[0]` says why."""


class RejectionSampler(SamplerBase):
    """Draws from the PCFG until a draft is valid within `limits` (`max_attempts` x 100 drafts at most)."""

    def _setup(self) -> None:
        #: drafts started and kept, and drafts thrown away by reason.
        self.stats: Counter[str] = Counter()

    def sample(self) -> Node:
        with cyclic_gc_paused():
            for _ in range(self.limits.max_attempts * 100):
                self.stats["drafts"] += 1
                self._nodes, self._params = 0, 0
                try:
                    tree, out, height = self._symbol(self.grammar.start, self.input, self.limits.max_depth, 1)
                    if len(out) != 1:
                        raise _Invalid("branches")
                    if height < self.limits.min_depth:
                        raise _Invalid("min_depth")
                    violation = self._cost_violation(tree)
                    if violation:
                        raise _Invalid(violation)
                except _Invalid as invalid:
                    self.stats[invalid.args[0]] += 1
                    continue
                self.stats["accepted"] += 1
                return tree
        raise SamplingError(
            f"no valid tree for {describe(self.input)} in {self.stats['drafts']} drafts "
            f"within {self.limits.describe()}"
        )

    def _symbol(self, name: str, signal: Signal, depth: int, copies: int) -> tuple[Node, Signal, int]:
        if depth < 1:
            raise _Invalid("depth")
        self._count()
        rule = self.grammar.rule_for(name, signal)
        if rule is None:
            raise _Invalid("guards")
        r = self.rng.random()
        chosen = rule.alternatives[-1]
        for alternative in rule.alternatives:
            r -= alternative.probability
            if r < 0:
                chosen = alternative
                break
        kids, tallest = [], 0
        for item in chosen.items:
            kid, signal, height = self._item(item, signal, depth - 1, copies)
            kids.append(kid)
            tallest = max(tallest, height)
        return Nonterminal(name, tuple(kids)), signal, tallest + 1

    def _item(self, item: Item, signal: Signal, depth: int, copies: int) -> tuple[Node, Signal, int]:
        if isinstance(item, SymbolItem):
            return self._symbol(item.name, signal, depth, copies)
        if isinstance(item, OpItem):
            self._count()
            args = item.choices[self.rng.randrange(len(item.choices))]
            op = get_op(item.name)
            try:
                out = op.transfer(signal, dict(args))
            except Infeasible:
                raise _Invalid("shapes") from None
            self._params += op.param_count(signal, dict(args)) * copies
            if self.limits.max_params is not None and self._params > self.limits.max_params:
                raise _Invalid("params")
            return Terminal(item.name, args), out, 0
        if isinstance(item, ParallelItem):
            if len(signal) != len(item.items):
                raise _Invalid("branches")
            kids, outs, tallest = [], [], 0
            for k, sub in enumerate(item.items):
                kid, out, height = self._item(sub, signal[k : k + 1], depth, copies)
                if len(out) != 1:
                    raise _Invalid("branches")
                kids.append(kid)
                outs.extend(out)
                tallest = max(tallest, height)
            return Parallel(tuple(kids)), tuple(outs), tallest
        times = len(signal) if item.times is None else item.times
        if len(signal) != times or any(state != signal[0] for state in signal):
            raise _Invalid("branches")
        kid, out, height = self._item(item.item, signal[:1], depth, copies * times)
        if len(out) != 1:
            raise _Invalid("branches")
        return Repeat(kid, times), out * times, height

    def _count(self) -> None:
        self._nodes += 1
        if self._nodes > self.limits.max_nodes:
            raise _Invalid("nodes")

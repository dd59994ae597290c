"""The exact sampling mode: trees drawn from the grammar's distribution conditioned on validity.

Every valid tree within the limits comes out with probability proportional to its PCFG
probability (the product of its alternatives' probabilities and, per operation, 1 / the size of its
argument grid). How each limit and constraint is met:

- guards, modes, branch counts and the operations' `abstract` contracts, and `max_depth`: exactly,
  by drawing top-down from inside probabilities (`einspace.sampling.inside`): each alternative, the modes
  between its items and each argument are drawn with the probability that the derivations through
  them complete, so a draft never reaches a dead end of these kinds;
- shapes (an `add` of unequal branches, a kernel larger than its input, a `col2im` whose sequence
  changed, ...), `max_nodes`, `max_params`, `max_operations`, `min_depth`, `min_params`, `min_flops`
  and `max_flops`: by rejection (the minimums and `max_flops` of complete drafts only). A draft's shapes and
  costs are computed as it is drawn; the first failure discards the whole draft (nothing is
  repaired locally, which is what would distort the distribution) and a new draft starts.

Drafts follow the PCFG restricted to a superset of the valid trees, so keeping the valid ones
leaves exactly the PCFG conditioned on validity. `stats` counts drafts and why each was rejected.
"""

from __future__ import annotations

import sys
from bisect import bisect
from collections import Counter
from functools import lru_cache
from itertools import accumulate

from einspace.errors import Infeasible, SamplingError
from einspace.grammar.model import Item, OpItem, ParallelItem, SymbolItem
from einspace.ops.registry import Args, get_op
from einspace.sampling.base import SamplerBase, cyclic_gc_paused
from einspace.sampling.inside import AbstractSignal, InsideTables, abstract_of, inside_tables
from einspace.state import RANK_OF_MODE, Signal, describe
from einspace.tree import Node, Nonterminal, Parallel, Repeat, Terminal, tree_depth

__all__ = ["DRAFTS_PER_ATTEMPT", "ExactSampler"]

#: Drafts an exact sampler may reject per `Limits.max_attempts` before it gives up.
DRAFTS_PER_ATTEMPT = 100

#: Python frames one non-terminal level of a draft takes at most (a symbol and a parallel step).
_FRAMES_PER_LEVEL = 3

#: Frames the callers of `sample` may use without the recursion limit being looked at closely.
_CALLER_FRAMES = 500

#: Memoised operation results (by concrete signal) kept before the memo is cleared.
_CACHE_LIMIT = 50_000

_SYMBOL, _OP, _PARALLEL, _REPEAT = range(4)


class _Rejected(Exception):
    """Internal: the draft broke a constraint the tables do not capture; `args[0]` says which."""


class _Step:
    """One item of a chosen alternative, from known input modes to known output modes.

    kind _SYMBOL: `target` is the (symbol, modes, height, output modes) of the child plan, resolved
    on first use into `plan`; _OP: `target` is the operation name and `plan` its grid points that
    lead to the output modes; _PARALLEL: `plan` holds one step per branch; _REPEAT: one step.
    """

    __slots__ = ("kind", "target", "plan")

    def __init__(self, kind: int, target: object, plan: object):
        self.kind, self.target, self.plan = kind, target, plan


class _SymbolPlan:
    """A symbol at some modes and height that must end in given modes: its alternatives, each with
    the modes between its items fixed, and their weights (PCFG probability x completion mass)."""

    __slots__ = ("name", "options", "cumulative")

    def __init__(self, name: str, options: list[tuple[_Step, ...]], weights: list[float]):
        self.name = name
        self.options = options
        self.cumulative = list(accumulate(weights))


class _PlanBook:
    """The plans of one set of tables, built on first use and shared by every sampler of the same
    grammar, input modes and depth (strategies make new samplers often), with the memos of
    operation results and of the leaves they make (pure functions of their keys)."""

    def __init__(self, tables: InsideTables):
        self.tables = tables
        self.plans: dict[tuple[str, AbstractSignal, int, AbstractSignal], _SymbolPlan] = {}
        self.infer: dict[tuple[str, Args, Signal], tuple[Signal, int] | None] = {}
        self.terminals: dict[tuple[str, Args], Terminal] = {}
        self.preterminals: dict[tuple[str, int], Nonterminal] = {}  # (symbol, id of its one terminal)

    def plan(self, key: tuple[str, AbstractSignal, int, AbstractSignal]) -> _SymbolPlan:
        plan = self.plans.get(key)
        if plan is None:
            plan = self.plans[key] = self._build_plan(*key)
        return plan

    def _build_plan(
        self, name: str, modes: AbstractSignal, height: int, target: AbstractSignal
    ) -> _SymbolPlan:
        """Every (alternative, modes after each of its items) that can end in `target`, weighted by
        the alternative's probability times each item's inside probability of its step."""
        tables = self.tables
        rule = tables.rule(name, modes)
        options: list[tuple[_Step, ...]] = []
        weights: list[float] = []
        for alternative in rule.alternatives if rule else ():
            items = alternative.items
            paths: list[tuple[tuple[_Step, ...], AbstractSignal, float]] = [
                ((), modes, alternative.probability)
            ]
            for j, item in enumerate(items):
                grown = []
                for steps, current, weight in paths:
                    for after, p in tables.item(item, current, height - 1).items():
                        if tables.sequence(items, j + 1, after, height - 1).get(target, 0.0) > 0.0:
                            step = self._make_step(item, current, height - 1, after)
                            grown.append(((*steps, step), after, weight * p))
                paths = grown
            for steps, _, weight in paths:
                if weight > 0.0:
                    options.append(steps)
                    weights.append(weight)
        return _SymbolPlan(name, options, weights)

    def _make_step(self, item: Item, modes: AbstractSignal, height: int, target: AbstractSignal) -> _Step:
        if isinstance(item, SymbolItem):
            return _Step(_SYMBOL, (item.name, modes, height, target), None)
        if isinstance(item, OpItem):
            return _Step(_OP, item.name, self.tables.op_table(item, modes).by_output[target])
        if isinstance(item, ParallelItem):
            branches = tuple(
                self._make_step(sub, modes[k : k + 1], height, target[k : k + 1])
                for k, sub in enumerate(item.items)
            )
            return _Step(_PARALLEL, None, branches)
        return _Step(_REPEAT, None, self._make_step(item.item, modes[:1], height, target[:1]))


#: The plan book of a grammar's tables, shared by the samplers built on them (the class cached as
#: it is: a decorated factory function would be one that mutmut, scripts/mutation.py, skips).
_plan_book = lru_cache(maxsize=16)(_PlanBook)


class ExactSampler(SamplerBase):
    """Samples trees from `grammar` for `input` within `limits`, exactly from the PCFG conditioned on
    validity (see the module docstring). Same interface as the paper-mode `Sampler`.

    >>> sampler = ExactSampler(load_grammar("einspace"), input_state((3, 32, 32)), random_seed=0)
    >>> tree = sampler.sample()
    """

    def _setup(self) -> None:
        modes = abstract_of(self.input)
        self.tables: InsideTables = inside_tables(self.grammar, modes, self.limits.max_depth)
        #: drafts started, trees accepted, and drafts rejected by reason ("shapes", "nodes", ...).
        self.stats: Counter[str] = Counter()
        book = _plan_book(self.tables)
        self._plan = book.plan
        self._infer = book.infer
        self._terminals = book.terminals
        self._preterminals = book.preterminals
        outputs = self.tables.symbol(self.grammar.start, modes, self.limits.max_depth)
        roots = {out: p for out, p in outputs.items() if len(out) == 1}
        self._roots = [self._plan((self.grammar.start, modes, self.limits.max_depth, out)) for out in roots]
        self._root_weights = list(accumulate(roots.values()))
        self._nodes = 0
        self._params = 0
        self._operations = 0
        self._max_nodes = self.limits.max_nodes

    def sample(self) -> Node:
        """One tree, or SamplingError when the grammar derives nothing valid here, or when every one
        of `limits.max_attempts * DRAFTS_PER_ATTEMPT` drafts was rejected."""
        limits = self.limits
        if not self._roots:
            raise SamplingError(
                f"the grammar derives no tree of {self.grammar.start} for input {describe(self.input)} "
                f"within max_depth={limits.max_depth}: no derivation's guards, modes and branch counts fit"
            )
        if len(self._infer) > _CACHE_LIMIT:
            self._infer.clear()
        drafts = limits.max_attempts * DRAFTS_PER_ATTEMPT
        before = dict(self.stats)
        previous = sys.getrecursionlimit()
        frames = _FRAMES_PER_LEVEL * limits.max_depth + 100
        if previous < frames + _CALLER_FRAMES:  # else the callers would need more frames than is plausible
            sys.setrecursionlimit(max(previous, frames + _stack_depth()))
        try:
            with cyclic_gc_paused():
                for _ in range(drafts):
                    tree = self._draft()
                    if tree is not None:
                        return tree
        finally:
            sys.setrecursionlimit(previous)
        rejected = self.stats - Counter(before)
        reasons = ", ".join(f"{n} by {r}" for r, n in rejected.items() if r != "drafts")
        raise SamplingError(
            f"all {drafts} drafts of a tree for input {describe(self.input)} were rejected ({reasons}) "
            f"within {limits.describe()}; the limits may be too tight"
        )

    # ------------------------------------------------------------------ drawing

    def _draft(self) -> Node | None:
        stats = self.stats
        stats["drafts"] += 1
        self._nodes = self._params = self._operations = 0
        weights = self._root_weights
        plan = self._roots[bisect(weights, self.rng.random() * weights[-1]) if len(weights) > 1 else 0]
        try:
            tree = self._expand(plan, self.input, 1)[0]
        except _Rejected as rejection:
            stats[rejection.args[0]] += 1
            return None
        if self.limits.min_depth and tree_depth(tree) < self.limits.min_depth:
            stats["min_depth"] += 1
            return None
        violation = self._cost_violation(tree)
        if violation:
            stats[violation] += 1
            return None
        stats["accepted"] += 1
        return tree

    def _expand(self, plan: _SymbolPlan, signal: Signal, copies: int) -> tuple[Node, Signal]:
        self._nodes += 1
        if self._nodes > self._max_nodes:
            raise _Rejected("nodes")
        cumulative = plan.cumulative
        if len(cumulative) == 1:
            steps = plan.options[0]
        else:
            steps = plan.options[bisect(cumulative, self.rng.random() * cumulative[-1])]
        if len(steps) == 1 and steps[0].kind == _OP:  # a pre-terminal such as (C linear(d=16))
            terminal, signal = self._op(steps[0].target, steps[0].plan, signal, copies)
            key = (plan.name, id(terminal))
            node = self._preterminals.get(key)
            if node is None:
                node = self._preterminals[key] = Nonterminal(plan.name, (terminal,))
            return node, signal
        kids = []
        for step in steps:
            kind = step.kind
            if kind == _SYMBOL:
                child = step.plan
                if child is None:
                    child = step.plan = self._plan(step.target)
                kid, signal = self._expand(child, signal, copies)
            elif kind == _OP:
                kid, signal = self._op(step.target, step.plan, signal, copies)
            else:
                kid, signal = self._step(step, signal, copies)
            kids.append(kid)
        return Nonterminal(plan.name, tuple(kids)), signal

    def _step(self, step: _Step, signal: Signal, copies: int) -> tuple[Node, Signal]:
        kind = step.kind
        if kind == _SYMBOL:
            plan = step.plan
            if plan is None:
                plan = step.plan = self._plan(step.target)
            return self._expand(plan, signal, copies)
        if kind == _OP:
            return self._op(step.target, step.plan, signal, copies)
        if kind == _PARALLEL:
            kids, outs = [], []
            for k, branch in enumerate(step.plan):
                kid, out = self._step(branch, signal[k : k + 1], copies)
                kids.append(kid)
                outs.extend(out)
            return Parallel(tuple(kids)), tuple(outs)
        first = signal[0]
        for state in signal:
            if state != first:
                raise _Rejected("shapes")
        times = len(signal)
        kid, out = self._step(step.plan, signal[:1], copies * times)
        return Repeat(kid, times), out * times

    def _op(self, name: str, choices: tuple[Args, ...], signal: Signal, copies: int) -> tuple[Node, Signal]:
        self._nodes += 1
        if self._nodes > self._max_nodes:
            raise _Rejected("nodes")
        self._operations += copies
        if self.limits.max_operations is not None and self._operations > self.limits.max_operations:
            raise _Rejected("max_operations")
        # floor(u * n) is uniform over the n grid points up to float rounding (n / 2**53)
        args = choices[int(self.rng.random() * len(choices))] if len(choices) > 1 else choices[0]
        key = (name, args, signal)
        result = self._infer.get(key, False)
        if result is False:
            result = self._infer[key] = _apply(name, args, signal)
        if result is None:
            raise _Rejected("shapes")
        out, params = result
        if params:
            self._params += params * copies
            if self.limits.max_params is not None and self._params > self.limits.max_params:
                raise _Rejected("params")
        terminal = self._terminals.get((name, args))
        if terminal is None:  # nodes are immutable values: equal leaves are one shared object
            terminal = self._terminals[(name, args)] = Terminal(name, args)
        return terminal, out


def _apply(op_name: str, args: Args, signal: Signal) -> tuple[Signal, int] | None:
    """Output signal and parameter count of an operation, None if its shapes do not fit. A result
    that contradicts the operation's own `abstract` contract is an error: the tables relied on it."""
    op = get_op(op_name)
    kwargs = dict(args)
    try:
        out = op.transfer(signal, kwargs)
    except Infeasible:
        return None
    predicted = op.abstract(signal[0].mode, len(signal), kwargs)
    if predicted != (out[0].mode, len(out)) or any(
        s.mode != out[0].mode or len(s.shape) != RANK_OF_MODE[s.mode] for s in out
    ):
        raise SamplingError(
            f"operation {op_name} with {kwargs} on {describe(signal)} gives {describe(out)}, which its "
            f"abstract() contract does not predict ({predicted}); the exact sampling mode relies on it"
        )
    return out, op.param_count(signal, kwargs)


def _stack_depth() -> int:
    """Frames already on the stack, to leave room above them."""
    depth = 0
    frame = sys._getframe()
    while frame is not None:
        depth += 1
        frame = frame.f_back
    return depth

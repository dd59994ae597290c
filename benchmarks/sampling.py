"""Sampling benchmark: throughput of the sampler and mutation, and the paper's Table 6 sweep.

    python benchmarks/sampling.py [--quick] [--seed 0]

1. Throughput at p(M -> C) = 0.32 (the grammar's default) with the default Limits, for 3x32x32
   and 3x64x64 inputs: trees/s, nodes/s, ms per tree and per mutation, time in Python's
   garbage collector, and the fraction of sampled trees that check (asserted to be 100%). Each
   draw is repeated with the collector disabled, which must give identical trees (same seed).
2. The sweep of the paper's Table 6 (App. C.2): sizes and branching factors of 2000 trees per
   p(M -> C), printed beside the paper's numbers, (a) with the default limits and (b) with much
   looser ones. A loose row stops after a time budget (an interval timer interrupts the sample
   in flight); the rows say how many samples were drawn. The sampler is built from recursive
   generators, so the loose run raises Python's recursion limit; a RecursionError surfaces as a
   SamplingError and is counted, as is a sampler that gives up.
3. Relative cost, measured in the same run since absolute times on shared machines mean
   little: sampling time per node against one `check_tree` pass over the same trees, and
   against compiling a subset of them to torch modules (`compile_backbone`).

This is a measurement, not a test; it asserts only that every sampled or mutated tree checks.
"""

from __future__ import annotations

import argparse
import gc
import random
import signal
import sys
import time
from dataclasses import dataclass, field

import numpy as np

import einspace as es
from einspace.errors import SamplingError, VariationError
from einspace.state import describe
from einspace.variation import limit_violation

# Table 6 of the paper (Ericsson et al., NeurIPS 2024, App. C.2): 2000 sampled architectures per
# p(M -> C). Per quantity and p: (min, median, mean, std, max).
PAPER_TABLE_6: dict[str, dict[float, tuple[float, float, float, float, float]]] = {
    "terminals": {
        0.9: (2, 3.00, 3.87, 2.84, 28),
        0.8: (2, 4.00, 5.34, 6.32, 54),
        0.7: (2, 4.00, 6.72, 11.22, 118),
        0.6: (2, 4.00, 8.65, 16.73, 202),
        0.5: (2, 5.00, 40.22, 303.65, 4779),
        0.4: (2, 8.00, 100.15, 749.61, 12026),
        0.3: (2, 9.00, 6070.77, 64863.45, 878122),
    },
    "nonterminals": {
        0.9: (2, 3.00, 3.63, 3.45, 42),
        0.8: (2, 3.00, 5.04, 6.91, 64),
        0.7: (2, 3.00, 6.00, 9.21, 81),
        0.6: (2, 4.00, 7.74, 13.61, 165),
        0.5: (2, 5.00, 39.03, 325.18, 5219),
        0.4: (2, 8.00, 88.58, 649.44, 10417),
        0.3: (2, 8.00, 4588.13, 50203.87, 734497),
    },
    "branching_factor": {
        0.9: (1, 1.00, 1.75, 1.63, 7.61),
        0.8: (1, 1.00, 2.05, 1.95, 7.73),
        0.7: (1, 1.00, 2.05, 1.91, 7.83),
        0.6: (1, 1.00, 2.17, 1.96, 7.73),
        0.5: (1, 1.00, 2.34, 2.00, 7.88),
        0.4: (1, 1.75, 2.81, 2.14, 7.87),
        0.3: (1, 1.75, 2.80, 2.13, 7.96),
    },
}
SWEEP = (0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3)
LOOSE = es.Limits(max_depth=200, max_nodes=100_000, max_steps=1_000_000)
LOOSE_RECURSION_LIMIT = 20_000
COMPILE_MAX_PARAMS = 1_000_000  # compile only trees this small: weight initialisation is not the point


class GcClock:
    """Time spent in Python's cyclic garbage collector, via gc.callbacks."""

    def __init__(self) -> None:
        self.total = 0.0
        self.longest = 0.0
        self._start = 0.0

    def __call__(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._start = time.perf_counter()
            return
        pause = time.perf_counter() - self._start
        self.total += pause
        self.longest = max(self.longest, pause)

    def __enter__(self) -> GcClock:
        gc.callbacks.append(self)
        return self

    def __exit__(self, *exc: object) -> None:
        gc.callbacks.remove(self)


class _RowTimeout(Exception):
    """The time budget of a sweep row ran out while a sample was in flight."""


def _on_alarm(signum: int, frame: object) -> None:
    raise _RowTimeout


@dataclass
class Draw:
    """Trees drawn by one sampler, with the time each took and what went wrong."""

    trees: list[es.CheckedTree] = field(default_factory=list)
    seconds: list[float] = field(default_factory=list)
    too_deep: int = 0  # SamplingError from a RecursionError
    gave_up: int = 0  # SamplingError after max_attempts
    interrupted: bool = False  # the row's time budget cut a sample short
    wall: float = 0.0

    @property
    def attempts(self) -> int:
        return len(self.trees) + self.too_deep + self.gave_up + self.interrupted


def draw(sampler: es.Sampler, n: int, budget: float | None = None) -> Draw:
    """Sample up to `n` trees (each timed alone), checking every one outside the timing.

    With a `budget` in seconds, stop when it is spent, interrupting the sample in flight.
    """
    out = Draw()
    use_timer = budget is not None and hasattr(signal, "setitimer")
    previous = signal.signal(signal.SIGALRM, _on_alarm) if use_timer else None
    start = time.perf_counter()
    deadline = start + budget if budget is not None else float("inf")
    try:
        while len(out.trees) + out.too_deep + out.gave_up < n:
            remaining = deadline - time.perf_counter()
            if remaining <= 0:
                break
            try:
                if use_timer:
                    signal.setitimer(signal.ITIMER_REAL, remaining)
                t0 = time.perf_counter()
                try:
                    tree = sampler.sample()
                finally:
                    elapsed = time.perf_counter() - t0
                    if use_timer:
                        signal.setitimer(signal.ITIMER_REAL, 0)
            except _RowTimeout:
                out.interrupted = True
                break
            except SamplingError as exc:
                if "too deep" in str(exc):
                    out.too_deep += 1
                else:
                    out.gave_up += 1
                continue
            checked = es.check_tree(tree, sampler.grammar, sampler.input)  # raises if invalid
            violation = limit_violation(checked, sampler.limits)
            assert violation is None, f"sampled tree breaks the limits: {violation}\n{es.to_text(tree)}"
            out.trees.append(checked)
            out.seconds.append(elapsed)
    finally:
        if use_timer:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)
    out.wall = time.perf_counter() - start
    return out


def nodes(checked: es.CheckedTree) -> int:
    stats = es.statistics(checked)
    return int(stats["terminals"]) + int(stats["nonterminals"])


def ms(seconds: float) -> str:
    return f"{seconds * 1e3:.2f}"


def describe_limits(limits: es.Limits) -> str:
    return (
        f"max_depth={limits.max_depth}, max_nodes={limits.max_nodes}, "
        f"max_steps={limits.max_steps}, max_attempts={limits.max_attempts}"
    )


# ---------------------------------------------------------------------- 1. throughput


def throughput(grammar, shapes, n_trees: int, n_mutations: int, seed: int) -> dict[tuple, Draw]:
    print(f"== 1. Throughput: p(M -> C) = 0.32, default limits ({describe_limits(es.Limits())}) ==")
    print(
        f"{'input':<9} {'gc':<3} {'trees':>6} {'trees/s':>8} {'nodes/s':>8} {'mean n':>7} {'med ms':>7} "
        f"{'p90 ms':>7} {'max ms':>8} {'GC ms':>7} {'GC max':>7} {'errors':>6} {'checked':>8}"
    )
    draws = {}
    for shape in shapes:
        x = es.input_state(shape)
        for collect in (True, False):
            gc.collect()
            if not collect:
                gc.disable()
            try:
                with GcClock() as clock:
                    d = draw(es.Sampler(grammar, x, random_seed=seed), n_trees)
            finally:
                gc.enable()
            total = sum(d.seconds)
            counts = [nodes(c) for c in d.trees]
            checked = len(d.trees) / d.attempts
            assert checked == 1.0, f"{d.attempts - len(d.trees)} of {d.attempts} samples failed"
            print(
                f"{'x'.join(map(str, shape)) if collect else '':<9} {'on' if collect else 'off':<3} "
                f"{len(d.trees):>6} {len(d.trees) / total:>8.0f} {sum(counts) / total:>8.0f} "
                f"{np.mean(counts):>7.1f} {ms(np.median(d.seconds)):>7} "
                f"{ms(np.percentile(d.seconds, 90)):>7} {ms(max(d.seconds)):>8} {ms(clock.total):>7} "
                f"{ms(clock.longest):>7} "
                f"{d.too_deep + d.gave_up:>6} {checked:>8.1%}"
            )
            if collect:
                draws[shape] = d
            else:  # the same seed must give the same trees
                assert [c.tree for c in d.trees] == [c.tree for c in draws[shape].trees]
    print(
        "(gc on: as a user runs it; GC ms: time in Python's cyclic collector during the draw, included in\n"
        " the sampling times; gc off: the same draw (same seed, identical trees) with the collector disabled)"
    )

    print(f"\nMutation (Variation.mutate) of {n_mutations} sampled trees per input:")
    print(f"{'input':<9} {'n':>5} {'med ms':>7} {'p90 ms':>7} {'max ms':>8} {'failed':>6} {'checked':>8}")
    for shape in shapes:
        x = es.input_state(shape)
        variation = es.Variation(grammar, x, rng=random.Random(seed))
        times, failed, good = [], 0, 0
        for checked in draws[shape].trees[:n_mutations]:
            t0 = time.perf_counter()
            try:
                child = variation.mutate(checked.tree)
            except VariationError:
                failed += 1
                continue
            finally:
                times.append(time.perf_counter() - t0)
            child_checked = es.check_tree(child, grammar, x)
            assert limit_violation(child_checked, variation.limits) is None
            assert child != checked.tree
            good += 1
        print(
            f"{'x'.join(map(str, shape)):<9} {len(times):>5} {ms(np.median(times)):>7} "
            f"{ms(np.percentile(times, 90)):>7} {ms(max(times)):>8} {failed:>6} {good / len(times):>8.1%}"
        )
    print("(failed: VariationError, e.g. a minimal tree; checked: children that check and keep the limits)")
    return draws


# ---------------------------------------------------------------------- 2. Table 6


def summary(values: list[float]) -> tuple[float, float, float, float, float]:
    a = np.asarray(values, dtype=float)  # std: population (ddof=0); the paper does not say which
    return a.min(), float(np.median(a)), a.mean(), a.std(), a.max()


def fmt(row: tuple[float, ...], width: int = 8) -> str:
    return " ".join(f"{v:>{width}.2f}" if v != int(v) or v >= 1e6 else f"{int(v):>{width}}" for v in row)


def sweep(grammar, n: int, limits: es.Limits, budget: float | None, seed: int, label: str) -> None:
    x = es.input_state((3, 32, 32))
    cap = f", at most {budget:g} s per row" if budget is not None else ""
    print(f"\n== 2{label}. Table 6 sweep, 3x32x32, {n} samples per row{cap}; {describe_limits(limits)} ==")
    rows: dict[float, Draw] = {}
    clocks: dict[float, GcClock] = {}
    t0 = time.perf_counter()
    for p in SWEEP:
        sampler = es.Sampler(grammar.with_probability("M", 3, p), x, limits, random_seed=seed)
        gc.collect()
        with GcClock() as clocks[p]:
            rows[p] = draw(sampler, n, budget)
    wall = time.perf_counter() - t0
    print(
        f"{'p':>4} {'drawn':>6} {'too deep':>8} {'gave up':>7} {'cut':>4} {'row s':>7} {'GC s':>6} "
        f"{'med ms':>7} {'max ms':>9} {'depth':>6}"
    )
    for p, d in rows.items():
        depth = max((int(es.statistics(c)["depth"]) for c in d.trees), default=0)
        median = ms(np.median(d.seconds)) if d.seconds else "-"
        longest = ms(max(d.seconds)) if d.seconds else "-"
        print(
            f"{p:>4} {len(d.trees):>6} {d.too_deep:>8} {d.gave_up:>7} {int(d.interrupted):>4} "
            f"{d.wall:>7.2f} {clocks[p].total:>6.2f} {median:>7} {longest:>9} {depth:>6}"
        )
    print(
        f"sweep wall time {wall:.1f} s. drawn: trees returned; too deep: RecursionError; gave up: "
        "SamplingError;\ncut: the row's time budget interrupted a sample; row s: wall time of the row "
        "(sampling and checking);\nGC s: of which in the garbage collector; depth: deepest tree"
    )
    head = f"{'min':>8} {'median':>8} {'mean':>8} {'std':>8} {'max':>8}"
    for quantity in ("terminals", "nonterminals", "branching_factor"):
        print(f"\n{quantity:<16}  {'ours':^44} | {'paper (Table 6)':^44}")
        print(f"{'p':>4} {'n':>6}      {head} | {head}")
        for p, d in rows.items():
            values = [float(es.statistics(c)[quantity]) for c in d.trees]
            ours = fmt(summary(values)) if values else "-"
            print(f"{p:>4} {len(values):>6}      {ours} | {fmt(PAPER_TABLE_6[quantity][p])}")


# ---------------------------------------------------------------------- 3. relative cost


def relative_cost(grammar, d: Draw, n_compile: int) -> None:
    """Sampling time per node against check_tree and compile_backbone on the same trees (gc on)."""
    x = d.trees[0].input
    print(f"\n== 3. Relative cost per node, {describe(x)}, p(M -> C) = 0.32, default limits, gc on ==")
    counts = np.array([nodes(c) for c in d.trees], dtype=float)
    sample = np.array(d.seconds)
    gc.collect()
    check = []
    for c in d.trees:
        t0 = time.perf_counter()
        es.check_tree(c.tree, grammar, x)
        check.append(time.perf_counter() - t0)
    check = np.array(check)
    subset = [i for i, c in enumerate(d.trees) if c.params <= COMPILE_MAX_PARAMS][:n_compile]
    gc.collect()
    build = []
    for i in subset:
        t0 = time.perf_counter()
        es.compile_backbone(d.trees[i])
        build.append(time.perf_counter() - t0)
    build = np.array(build)
    sub_counts, sub_sample = counts[subset], sample[subset]

    def line(label: str, seconds: np.ndarray, n: np.ndarray) -> None:
        print(
            f"{label:<17} {len(n):>5} trees, {int(n.sum()):>6} nodes: "
            f"{n.sum() / seconds.sum():>8.0f} nodes/s, {1e6 * np.median(seconds / n):>7.1f} us/node median"
        )

    line("sampling", sample, counts)
    line("check_tree", check, counts)
    line("sampling (subset)", sub_sample, sub_counts)
    line("compile_backbone", build, sub_counts)
    print(
        f"(subset: the first {len(subset)} trees with <= {COMPILE_MAX_PARAMS:,} parameters; a compile "
        "builds one\n module per copy of a repeated subtree, so nested (M) * b make it superlinear in "
        "tree nodes)"
    )
    print(
        f"sampling costs {sample.sum() / check.sum():.2f}x a check pass, "
        f"{sub_sample.sum() / build.sum():.2f}x a torch compile per node (totals);\n"
        f"per tree, median: {np.median(sample / check):.2f}x a check pass, "
        f"{np.median(sub_sample / build):.2f}x a torch compile"
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer samples, for a smoke run (< 30 s)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.quick:
        n_trees, n_mutations, n_sweep, budget, n_compile = 200, 100, 200, 1.0, 30
    else:
        n_trees, n_mutations, n_sweep, budget, n_compile = 2000, 500, 2000, 60.0, 200

    start = time.perf_counter()
    grammar = es.load_grammar("einspace")
    version = sys.version.split()[0]
    print(f"einspace sampling benchmark: python {version}, seed {args.seed}, quick={args.quick}\n")
    draws = throughput(grammar, [(3, 32, 32), (3, 64, 64)], n_trees, n_mutations, args.seed)
    kept = draws.pop((3, 32, 32))
    del draws  # keep the heap (and so the collector's work) small for what follows
    sweep(grammar, n_sweep, es.Limits(), None, args.seed, "a")
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, LOOSE_RECURSION_LIMIT))
    print(f"\n(recursion limit raised from {limit} to {sys.getrecursionlimit()} for the loose sweep)")
    try:
        sweep(grammar, n_sweep, LOOSE, budget, args.seed, "b")
    finally:
        sys.setrecursionlimit(limit)
    relative_cost(grammar, kept, n_compile)
    print(f"\ntotal {time.perf_counter() - start:.1f} s")


if __name__ == "__main__":
    main()

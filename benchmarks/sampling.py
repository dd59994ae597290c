"""Sampling benchmark: both sampling modes' throughput and distribution, and the paper's Table 6 sweep.

    python benchmarks/sampling.py [--quick] [--seed 0]

Modes: `paper` (backtracking, einspace.sampling.paper) and `exact` (the PCFG conditioned on validity,
einspace.sampling.exact). Every sampled tree is checked (outside the timings) and must keep the limits.

1. Throughput at p(M -> C) = 0.32 for 3x32x32 and 3x64x64 inputs, with the default limits and with
   loose ones: trees/s and nodes/s by wall clock and by this process's CPU time (the machine may be
   shared), median / p90 / max ms per tree, exact-mode drafts per tree, and the time Python's cyclic
   collector ran during `sample()` calls, included in those times (both samplers pause it while they
   draw; what remains starts in the allocations before the pause). A row whose time budget ran out
   (`CUT`) counts the time of the sample it interrupted, so its rates are not biased toward quick
   trees. Then the time to mutate trees (mutation uses the paper mode's derivations in either mode).
2. Distribution at 3x32x32, default limits: each mode against blind rejection sampling (the PCFG's
   draws that happen to be valid, einspace.sampling.rejection): permutation p-values for root
   productions, branching factors, operation frequencies and sizes (einspace.testing.distribution), and
   the share of trees with a skip connection and with a convolution (im2col ... col2im).
3. Relative cost per node: sampling against one `check_tree` pass and against `compile_backbone`.
4. The sweep of the paper's Table 6 (App. C.2), sizes and branching factors over p(M -> C), for both
   modes, (a) with the default limits and (b) with loose ones, printed beside the paper's numbers
   *counted the way the paper's code counts*: terminals and modules (its "non-terminals": S and M
   nodes) with every copy of a repeated branch counted, and the branching factor as the mean over
   terminals of the branches in flight where each runs. Our own counts follow (each node once,
   every non-terminal: S, M, B, Branches, A, R1, R2 and C). A row whose time budget ran out is
   marked CUT: the tree in flight is dropped, so such a row keeps only trees that finished in
   time, biased toward small ones.

A measurement, not a test: it asserts only that every tree checks and keeps the limits.
"""

from __future__ import annotations

import argparse
import gc
import random
import signal
import sys
import time
from collections import Counter
from dataclasses import dataclass, field

import numpy as np

import einspace as es
from einspace.errors import SamplingError, VariationError
from einspace.sampling.rejection import RejectionSampler
from einspace.sampling.variation import limit_violation
from einspace.testing.distribution import FEATURES, compare_samples, features
from einspace.tree import Nonterminal, Parallel, Terminal

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
MODES = ("paper", "exact")
LOOSE = es.Limits(max_depth=200, max_nodes=100_000, max_steps=1_000_000)
LIMITS = {"default": es.Limits(), "loose": LOOSE}
RECURSION_LIMIT = 20_000  # the paper mode recurses through generators, deeply with loose limits
COMPILE_MAX_PARAMS = 1_000_000  # compile only trees this small: weight initialisation is not the point
MODULE_SYMBOLS = ("S", "M")  # the paper's code counts modules (one per S or M expansion) as non-terminals


class GcClock:
    """Time Python's cyclic garbage collector spends while `active` is set (via gc.callbacks)."""

    def __init__(self) -> None:
        self.total = 0.0
        self.active = False
        self._start = 0.0

    def __call__(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._start = time.perf_counter()
        elif self.active:
            self.total += time.perf_counter() - self._start

    def __enter__(self) -> GcClock:
        gc.callbacks.append(self)
        return self

    def __exit__(self, *exc: object) -> None:
        gc.callbacks.remove(self)


class _RowTimeout(Exception):
    """The time budget of a row ran out while a sample was in flight."""


def _on_alarm(signum: int, frame: object) -> None:
    raise _RowTimeout


@dataclass
class Draw:
    """Trees drawn by one sampler: per tree the wall and CPU seconds its `sample()` took; totals
    include the sample a time budget interrupted, if any."""

    trees: list[es.CheckedTree] = field(default_factory=list)
    wall: list[float] = field(default_factory=list)
    cpu: list[float] = field(default_factory=list)
    wall_total: float = 0.0
    cpu_total: float = 0.0
    gc_seconds: float = 0.0
    too_deep: int = 0  # SamplingError from a RecursionError (paper mode)
    gave_up: int = 0  # SamplingError after the attempts ran out
    cut: bool = False  # the time budget ended the draw before it had its trees


def draw(sampler, n: int, budget: float | None = None) -> Draw:
    """Sample up to `n` trees, each timed alone, each checked outside the timing; with a `budget`
    in seconds, stop when it is spent, interrupting the sample in flight."""
    out = Draw()
    use_timer = budget is not None and hasattr(signal, "setitimer")
    previous = signal.signal(signal.SIGALRM, _on_alarm) if use_timer else None
    gc.collect()
    deadline = time.perf_counter() + budget if budget is not None else float("inf")
    try:
        with GcClock() as clock:
            while len(out.trees) + out.too_deep + out.gave_up < n:
                remaining = deadline - time.perf_counter()
                if remaining <= 0:  # (an alarm that fires inside a gc callback is lost: caught here)
                    out.cut = True
                    break
                if use_timer:
                    signal.setitimer(signal.ITIMER_REAL, remaining)
                clock.active = True
                w0, c0 = time.perf_counter(), time.process_time()
                try:
                    tree = sampler.sample()
                except _RowTimeout:
                    out.cut = True
                    break
                except SamplingError as exc:
                    out.too_deep += "too deep" in str(exc)
                    out.gave_up += "too deep" not in str(exc)
                    continue
                finally:
                    wall, cpu = time.perf_counter() - w0, time.process_time() - c0
                    clock.active = False
                    out.wall_total += wall
                    out.cpu_total += cpu
                    if use_timer:
                        signal.setitimer(signal.ITIMER_REAL, 0)
                checked = es.check_tree(tree, sampler.grammar, sampler.input)  # raises if invalid
                violation = limit_violation(checked, sampler.limits)
                assert violation is None, f"sampled tree breaks the limits: {violation}\n{es.to_text(tree)}"
                out.trees.append(checked)
                out.wall.append(wall)
                out.cpu.append(cpu)
            out.gc_seconds = clock.total
    finally:
        if use_timer:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)
    return out


def paper_counts(checked: es.CheckedTree) -> tuple[int, int, float]:
    """(terminals, modules, branching factor) counted as the paper's code counts for Table 6: every
    copy of a repeated branch counted; modules = S and M nodes; the branching factor is the mean,
    over terminals, of the branches in flight where the terminal runs (the branches of the
    innermost enclosing branching module; its aggregation sees them all, its branching op not yet)."""
    terminals = modules = 0
    in_flight = 0.0
    stack: list[tuple] = [(checked.tree, (), 1, 1)]  # node, path, copies, branches in flight
    while stack:
        node, path, copies, branches = stack.pop()
        if isinstance(node, Terminal):
            terminals += copies
            b = len(checked.facts[path].input)
            in_flight += copies * (b if b > 1 else branches)
        elif isinstance(node, Nonterminal):
            modules += copies * (node.symbol in MODULE_SYMBOLS)
            stack.extend((kid, (*path, i), copies, branches) for i, kid in enumerate(node.children))
        elif isinstance(node, Parallel):
            width = len(node.children)
            stack.extend((kid, (*path, i), copies, width) for i, kid in enumerate(node.children))
        else:
            stack.append((node.child, (*path, 0), copies * node.times, node.times))
    return terminals, modules, in_flight / terminals


def ms(seconds: float) -> str:
    return f"{seconds * 1e3:.2f}"


def _rate(count: float, seconds: float) -> str:
    return f"{count / seconds:.0f}" if seconds > 0 else "-"


def _stat(function, values: list[float], scale: float = 1.0, spec: str = ".2f") -> str:
    """`function(values) * scale` formatted with `spec`, or '-' for no values."""
    return format(function(values) * scale, spec) if len(values) else "-"


def _p90(values: list[float]) -> float:
    return float(np.percentile(values, 90))


def describe_limits(limits: es.Limits) -> str:
    return (
        f"max_depth={limits.max_depth}, max_nodes={limits.max_nodes}, "
        f"max_steps={limits.max_steps}, max_attempts={limits.max_attempts}"
    )


# ---------------------------------------------------------------------- 1. throughput


def throughput(grammar, shapes, n: int, budget: float, seed: int) -> dict[tuple, Draw]:
    """Both modes, both limit sets; returns the default-limit draws by (mode, shape)."""
    print(f"== 1. Throughput: p(M -> C) = 0.32, {n} trees per row (at most {budget:g} s) ==")
    for name, limits in LIMITS.items():
        print(f"{name} limits: {describe_limits(limits)}")
    print(
        f"{'limits':<8} {'input':<9} {'mode':<6} {'trees':>6} {'cut':>4} {'trees/s':>8} {'nodes/s':>8} "
        f"{'CPU n/s':>8} {'mean n':>7} {'med ms':>7} {'p90 ms':>7} {'max ms':>8} {'drafts':>6} {'GC ms':>6} "
        f"{'errors':>6}"
    )
    kept = {}
    for limits_name, limits in LIMITS.items():
        for shape in shapes:
            x = es.input_state(shape)
            for mode in MODES:
                sampler = es.make_sampler(grammar, x, limits, mode, seed)
                d = draw(sampler, n, budget)
                counts = [c.stats.nodes for c in d.trees]
                stats = getattr(sampler, "stats", None)
                drafts = f"{stats['drafts'] / max(1, stats['accepted']):.2f}" if stats else "-"
                print(
                    f"{limits_name:<8} {'x'.join(map(str, shape)):<9} {mode:<6} {len(d.trees):>6} "
                    f"{'CUT' if d.cut else '':>4} {_rate(len(d.trees), d.wall_total):>8} "
                    f"{_rate(sum(counts), d.wall_total):>8} {_rate(sum(counts), d.cpu_total):>8} "
                    f"{_stat(np.mean, counts, spec='.1f'):>7} {_stat(np.median, d.wall, 1e3):>7} "
                    f"{_stat(_p90, d.wall, 1e3):>7} {_stat(max, d.wall, 1e3):>8} "
                    f"{drafts:>6} {ms(d.gc_seconds):>6} {d.too_deep + d.gave_up:>6}"
                )
                if limits_name == "default":
                    kept[(mode, shape)] = d
    print(
        "trees/s, nodes/s: by wall clock over the sampling calls (nodes: terminals + non-terminals of the\n"
        "trees returned); CPU n/s: nodes per second of this process's CPU time (what the machine's other\n"
        "load does not change); ms: wall per tree; drafts: exact-mode drafts per tree returned (the rest\n"
        "were rejected); GC ms: collector time during sample() calls; errors: samplers that gave up;\n"
        "CUT: the time budget ended the row (its rates count the interrupted sample's time)"
    )
    return kept


def mutation(grammar, draws: dict[tuple, Draw], shapes, n: int, seed: int) -> None:
    print(f"\nMutation (Variation.mutate, paper-mode derivations) of {n} sampled trees per input:")
    print(f"{'input':<9} {'trees of':<8} {'n':>5} {'med ms':>7} {'p90 ms':>7} {'max ms':>8} {'failed':>6}")
    for shape in shapes:
        x = es.input_state(shape)
        for mode in MODES:
            variation = es.Variation(grammar, x, rng=random.Random(seed))
            times, failed = [], 0
            for checked in draws[(mode, shape)].trees[:n]:
                t0 = time.perf_counter()
                try:
                    child = variation.mutate(checked.tree)
                except VariationError:
                    failed += 1
                    continue
                finally:
                    times.append(time.perf_counter() - t0)
                child_checked = es.check_tree(child, grammar, x)
                assert limit_violation(child_checked, variation.limits) is None and child != checked.tree
            print(
                f"{'x'.join(map(str, shape)):<9} {mode:<8} {len(times):>5} {ms(np.median(times)):>7} "
                f"{ms(np.percentile(times, 90)):>7} {ms(max(times)):>8} {failed:>6}"
            )
    print("(failed: VariationError, e.g. a minimal tree; every child checks and keeps the limits)")


# ---------------------------------------------------------------------- 2. distribution


def distribution(grammar, draws: dict[tuple, Draw], n: int, seed: int) -> None:
    x = es.input_state((3, 32, 32))
    print(f"\n== 2. Distribution, {x}, p(M -> C) = 0.32, default limits ==")
    reference = RejectionSampler(grammar, x, es.Limits(), random_seed=seed + 1)
    t0 = time.process_time()
    samples = {"rejection": [features(es.check_tree(reference.sample(), grammar, x)) for _ in range(n)]}
    cpu = time.process_time() - t0
    kept = reference.stats["accepted"] / reference.stats["drafts"]
    print(
        f"reference: blind rejection sampling, {n} trees in {cpu:.1f} s CPU ({kept:.1%} of its drafts valid)"
    )
    for mode in MODES:
        samples[mode] = [features(c) for c in draws[(mode, x.shape)].trees[:n]]
    roots = ("M M", "B Branches A", "R1 M R2")
    print(
        f"{'sampler':<10} {'n':>5} "
        + " ".join(f"{r:>12}" for r in roots)
        + f" {'b=2 share':>9} {'med n':>6} "
        f"{'p90 n':>6} {'max n':>6} {'skip':>6} {'conv':>6}"
    )
    for name, fs in samples.items():
        root = Counter(f.root for f in fs)
        branching = sum((f.branching for f in fs), Counter())
        sizes = [f.nodes for f in fs]
        print(
            f"{name:<10} {len(fs):>5} "
            + " ".join(f"{root[r] / len(fs):>12.3f}" for r in roots)
            + f" {branching[2] / max(1, sum(branching.values())):>9.3f} {np.median(sizes):>6.0f} "
            f"{np.percentile(sizes, 90):>6.0f} {max(sizes):>6} {np.mean([f.skip for f in fs]):>6.1%} "
            f"{np.mean([f.convolution for f in fs]):>6.1%}"
        )
    print("permutation p-values against the reference (1000 permutations; 0.001 is the smallest possible):")
    print(f"{'mode':<10} " + " ".join(f"{f:>18}" for f in FEATURES))
    for mode in MODES:
        p = compare_samples(samples[mode], samples["rejection"], random_seed=seed)
        print(f"{mode:<10} " + " ".join(f"{p[f]:>18.3f}" for f in FEATURES))
    print(
        "root shares: fraction of trees per root production; b=2 share: of all branching operations;\n"
        "n: nodes; skip: trees with a clone(b=2) ... add module one of whose branches is only identity;\n"
        "conv: trees with an im2col ... col2im routing module"
    )


# ---------------------------------------------------------------------- 3. relative cost


def relative_cost(grammar, draws: dict[tuple, Draw], n_compile: int) -> None:
    """Sampling time per node against check_tree and compile_backbone on the same trees."""
    x = es.input_state((3, 32, 32))
    print(f"\n== 3. Relative cost per node (wall), {x}, p(M -> C) = 0.32, default limits ==")
    for mode in MODES:
        d = draws[(mode, x.shape)]
        counts = np.array([c.stats.nodes for c in d.trees], dtype=float)
        sample = np.array(d.wall)
        check = []
        for c in d.trees:
            t0 = time.perf_counter()
            es.check_tree(c.tree, grammar, x)
            check.append(time.perf_counter() - t0)
        subset = [i for i, c in enumerate(d.trees) if c.params <= COMPILE_MAX_PARAMS][:n_compile]
        build = []
        for i in subset:
            t0 = time.perf_counter()
            es.compile_backbone(d.trees[i])
            build.append(time.perf_counter() - t0)
        print(
            f"{mode:<6} sampling {counts.sum() / sample.sum():>8.0f} nodes/s, check_tree "
            f"{counts.sum() / sum(check):>8.0f} nodes/s: sampling costs {sample.sum() / sum(check):.2f}x a "
            f"check pass; on {len(subset)} trees, {sample[subset].sum() / sum(build):.2f}x a torch compile"
        )


# ---------------------------------------------------------------------- 4. Table 6


def summary(values: list[float]) -> tuple[float, float, float, float, float]:
    a = np.asarray(values, dtype=float)  # std: population (ddof=0); the paper does not say which
    return a.min(), float(np.median(a)), a.mean(), a.std(), a.max()


def fmt(row: tuple[float, ...], width: int = 8) -> str:
    """Integers as integers, large numbers without decimals, the rest with two."""
    return " ".join(f"{v:>{width}.0f}" if v == int(v) or v >= 1e4 else f"{v:>{width}.2f}" for v in row)


def sweep(grammar, n: int, limits_name: str, budget: float, seed: int) -> None:
    limits = LIMITS[limits_name]
    x = es.input_state((3, 32, 32))
    section = "4a" if limits_name == "default" else "4b"
    print(f"\n== {section}. Table 6 sweep, 3x32x32, {n} samples per row, at most {budget:g} s per row ==")
    print(f"{limits_name} limits: {describe_limits(limits)}")
    rows: dict[tuple[str, float], Draw] = {}
    print(
        f"{'mode':<6} {'p':>4} {'drawn':>6} {'cut':>4} {'errors':>6} {'CPU s':>7} {'med ms':>7} "
        f"{'max ms':>9} {'depth':>6}"
    )
    for mode in MODES:
        for p in SWEEP:
            sampler = es.make_sampler(grammar.with_probability("M", 3, p), x, limits, mode, seed)
            d = rows[(mode, p)] = draw(sampler, n, budget)
            depth = max((c.stats.depth for c in d.trees), default=0)
            median = ms(np.median(d.wall)) if d.wall else "-"
            longest = ms(max(d.wall)) if d.wall else "-"
            print(
                f"{mode:<6} {p:>4} {len(d.trees):>6} {'CUT' if d.cut else '':>4} "
                f"{d.too_deep + d.gave_up:>6} {d.cpu_total:>7.2f} {median:>7} {longest:>9} {depth:>6}"
            )
    print(
        "CUT: the budget ran out and the row stopped; its trees are those that finished in\n"
        "time, biased toward small ones. errors: samplers that gave up; depth: deepest tree"
    )
    head = " ".join(f"{h:>8}" for h in ("min", "median", "mean", "std", "max"))
    quantities = (("terminals", 0), ("nonterminals", 1), ("branching_factor", 2))
    print("\nCounted as the paper's code counts (copies of repeated branches; non-terminals = modules):")
    for quantity, column in quantities:
        print(f"\n{quantity}\n{'':>4} | {'paper (Table 6)':^44} | {'paper mode':^44} | {'exact mode':^44}")
        print(f"{'p':>4} | {head} | {head} | {head} | rows cut short")
        for p in SWEEP:
            ours = {}
            for mode in MODES:
                values = [paper_counts(c)[column] for c in rows[(mode, p)].trees]
                ours[mode] = fmt(summary(values)) if values else "-"
            cut = [f"{m} CUT at {len(rows[(m, p)].trees)}" for m in MODES if rows[(m, p)].cut]
            print(
                f"{p:>4} | {fmt(PAPER_TABLE_6[quantity][p])} | {ours['paper']} | {ours['exact']} | "
                + ", ".join(cut)
            )
    print("\nOur own counts (each node once, every non-terminal), median / mean / max:")
    print(
        f"{'p':>4} | "
        + " | ".join(f"{mode + ' ' + q:^28}" for mode in MODES for q in ("terminals", "non-terminals"))
    )
    for p in SWEEP:
        cells = []
        for mode in MODES:
            for key in ("terminals", "nonterminals"):
                values = [float(getattr(c.stats, key)) for c in rows[(mode, p)].trees]
                cells.append(
                    f"{np.median(values):>8.1f} {np.mean(values):>9.2f} {max(values):>8.0f}"
                    if values
                    else "-"
                )
        print(f"{p:>4} | " + " | ".join(f"{c:^28}" for c in cells))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--quick", action="store_true", help="fewer samples, for a smoke run (about a minute)"
    )
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.quick:
        n_trees, n_mutations, n_sweep, budget, n_compile = 200, 50, 200, 2.0, 20
    else:
        n_trees, n_mutations, n_sweep, budget, n_compile = 2000, 500, 2000, 60.0, 200

    start = time.perf_counter()
    grammar = es.load_grammar("einspace")
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, RECURSION_LIMIT))
    version = sys.version.split()[0]
    print(f"einspace sampling benchmark: python {version}, seed {args.seed}, quick={args.quick}\n")
    shapes = [(3, 32, 32), (3, 64, 64)]
    try:
        draws = throughput(grammar, shapes, n_trees, budget, args.seed)
        mutation(grammar, draws, shapes, n_mutations, args.seed)
        distribution(grammar, draws, n_trees, args.seed)
        relative_cost(grammar, draws, n_compile)
        del draws  # keep the heap small for what follows
        for limits_name in LIMITS:
            sweep(grammar, n_sweep, limits_name, budget, args.seed)
    finally:
        sys.setrecursionlimit(limit)
    print(f"\ntotal {time.perf_counter() - start:.1f} s")


if __name__ == "__main__":
    main()

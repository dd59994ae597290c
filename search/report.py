"""What a run found: the best architectures with their statistics, what the run spent (compute, the
share wasted on failures), fitness over time and against compute (PNGs), a CSV export."""

from __future__ import annotations

import csv
import itertools
import math
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any, BinaryIO

from einspace.errors import EinspaceError
from einspace.search import compute
from einspace.search.columns import Columns, as_columns
from einspace.search.loop import SearchRun
from einspace.search.store import Record, Status
from einspace.search.strategy import Strategy
from einspace.search.successive_halving import PROMOTION

#: What the report's functions read: a history's columns, or its records (tests, small runs).
History = Columns | Sequence[Record]

__all__ = [
    "History",
    "best_records",
    "compute_rows",
    "final_summary",
    "fitness_series",
    "node_counts",
    "plot_compute",
    "plot_fitness",
    "promotions",
    "record_tags",
    "report",
    "step_points",
    "write_csv",
]


def best_records(history: History, k: int) -> list[Record]:
    """The k best successful evaluations, ranked as the incumbent is chosen (`einspace.search.compute`:
    the highest fidelity first, then fitness), one per distinct tree: its best-ranked evaluation (a
    cached copy, or a promoted tree's lower rungs, is not another architecture)."""
    h = as_columns(history)
    ranked = []
    for i, (status, fitness, fidelity, id) in enumerate(
        zip(h.status, h.fitness, h.fidelity, h.id, strict=True)
    ):
        if status == Status.OK and fitness is not None:
            level, score = compute.level(fidelity, fitness)
            ranked.append((-level, -score, id, i))
    ranked.sort()
    best: dict[str, int] = {}  # hash -> the tree's best-ranked row, in rank order
    for *_, i in ranked:
        best.setdefault(h.hash[i], i)
        if len(best) == k:
            break
    return [h.record(i) for i in list(best.values())[:k]]


def promotions(history: History) -> int:
    """Evaluations of an architecture at a higher fidelity (successive halving's promotions): the
    rest are the new architectures a strategy's budget counts."""
    return as_columns(history).origin.count(PROMOTION)


def record_tags(r: Record) -> list[str]:
    """What sets a record's result apart from a plain one: its fidelity, a score cut short."""
    tags = []
    if r.fidelity is not None:
        tags.append(f"fidelity {r.fidelity}")
    if r.partial:
        tags.append("partial (time budget)")
    return tags


def _measures(h: Columns) -> str:
    """Which seconds the compute adds up (`Cost.compute_seconds`): GPU, CPU, or wall where nothing
    more was measured (a killed worker, a store older than compute accounting); joined when mixed."""
    kinds = {
        "wall" if kind is None else kind
        for kind, status in zip(h.measures, h.status, strict=True)
        if status != Status.CACHED
    }
    return "+".join(kind for kind in ("GPU", "CPU", "wall") if kind in kinds)


def compute_rows(
    history: History, checkpoint: dict[str, Any] | None = None
) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """What the whole run spent as (what, how much): in all, on failures, partial results kept and
    when the incumbent was found; then, for a multi-fidelity run, each fidelity's evaluations, for
    one with weight inheritance the share inherited, and for a surrogate-screened one (its
    strategy `checkpoint`), how well the surrogate ranked."""
    h = as_columns(history)
    s = compute.summarise(h)
    evaluations = sum(n for n, _ in s.by_fidelity.values())
    rows = [
        ("total", f"{s.total:.1f} s ({_measures(h)}), {evaluations} evaluated"),
        ("wasted on failures", f"{s.wasted:.1f} s ({s.wasted_share:.1%})"),
    ]
    if s.partial:
        rows.append(("partial results kept (time budget)", str(s.partial)))
    if s.incumbent_at is not None:
        rows.append(("best found after", f"{s.incumbent_at:.1f} s"))
    details = _inheritance_rows(h) + _surrogate_rows(checkpoint) + _restart_rows(checkpoint)
    if set(s.by_fidelity) <= {None}:
        return rows, details
    fidelities, top = [], max(f for f in s.by_fidelity if f is not None)
    for fidelity in sorted(s.by_fidelity, key=lambda f: math.inf if f is None else f):
        n, seconds = s.by_fidelity[fidelity]
        label = "the evaluator's own" if fidelity is None else fidelity
        spent = f"{n} evaluated, {seconds:.1f} s"
        if fidelity is not None and fidelity != top:  # the top rung promotes none
            promoted = s.promoted_from.get(fidelity, 0)
            spent += f"; {promoted} promoted ({promoted / n:.0%})"
        fidelities.append((f"fidelity {label}", spent))
    if s.resumable:
        fidelities.append(("promotions continued from a saved state", f"{s.continued} of {s.resumable}"))
    top_rung = _top_rung_rows(h, s.incumbent, checkpoint)
    return rows, fidelities + top_rung + _agreement_rows(s.promotion_pairs) + details


def _top_rung_rows(h: Columns, best: int | None, checkpoint: dict[str, Any] | None) -> list[tuple[str, str]]:
    """Where successive halving's top rung holds no scored result yet (`best`: the incumbent's
    row): the best is a snapshot of a lower rung, which a short search with a large eta per rung
    may never get past."""
    from einspace.search.strategy import saved_state

    rungs = (saved_state(checkpoint, "rungs") or {}).get("rungs")
    if not rungs or best is None or h.fidelity[best] == rungs[-1]:
        return []
    return [
        (
            "top rung",
            f"{rungs[-1]} not reached: the best is a result at fidelity {h.fidelity[best]}, before full "
            "training (more compute, or promote more of the upper rungs: a list of etas)",
        )
    ]


def _agreement_rows(pairs: dict[tuple[int, int], list[tuple[float, float]]]) -> list[tuple[str, str]]:
    """How well each rung foretold the next: the rank correlation between promoted trees' results
    at both, and their means (a rung that ranks trees unlike the one above it only costs)."""
    from einspace.search.surrogate import rank_correlation

    rows = []
    for (lower, upper), results in sorted(pairs.items()):
        rho = rank_correlation(results)
        if math.isnan(rho):
            continue
        before, after = (sum(r) / len(results) for r in zip(*results, strict=True))
        rows.append(
            (
                f"fidelity {lower} -> {upper}",
                f"Spearman {rho:.2f} between {len(results)} promoted trees' results at both; "
                f"mean {before:.3f} at {lower}, {after:.3f} at {upper}",
            )
        )
    return rows


def _inheritance_rows(h: Columns) -> list[tuple[str, str]]:
    """The share of parameters children inherited from their parents (weight inheritance), and
    how many found no parent weights and trained from a fresh initialisation."""
    children = [h.metrics_of(i) for i in h.having("inherited_share") if h.status[i] != Status.CACHED]
    if not children:
        return []
    share = sum(m["inherited_share"] for m in children) / len(children)
    missing = sum(m.get("inheritance_missing", 0.0) > 0 for m in children)
    text = f"{share:.0%} of parameters on average over {len(children)} children"
    if missing:
        text += f"; {missing} found no parent weights (fresh initialisation)"
    return [("weights inherited", text)]


def _restart_rows(checkpoint: dict[str, Any] | None) -> list[tuple[str, str]]:
    """How often evolution restarted its population (`restart_after`), where it may."""
    from einspace.search.strategy import saved_state

    restart = (saved_state(checkpoint, "restart") or {}).get("restart")
    if not restart or not restart.get("after"):
        return []
    text = f"{restart['restarts']} (after {restart['after']:g} x population results without a new best"
    text += f", keeping the best {restart['keep']})" if restart.get("keep") else ")"
    if restart["restarts"]:
        text += f"; population now {restart['population']}, tournament {restart['tournament']}"
    return [("population restarts", text)]


def _surrogate_rows(checkpoint: dict[str, Any] | None) -> list[tuple[str, str]]:
    """The surrogate's rank correlation on the results it screened before they were trained, and
    its cost model's where cost counted."""
    from einspace.search.surrogate import screened_pairs

    pairs = screened_pairs(checkpoint)
    if pairs is None:
        return []
    rows = [("surrogate rank correlation (Spearman, screened results)", _correlation(pairs))]
    cost = screened_pairs(checkpoint, seconds=True)
    if cost is not None:
        rows.append(("its cost model's rank correlation (Spearman, seconds)", _correlation(cost)))
    return rows


def _correlation(pairs: list[tuple[float, float]]) -> str:
    from einspace.search.surrogate import rank_correlation

    rho = rank_correlation(pairs)
    value = "not yet (fewer than 3 screened results)" if math.isnan(rho) else f"{rho:.2f}"
    return f"{value} over {len(pairs)}"


def _stats(tree: str, run: SearchRun) -> str:
    try:
        return run.check(tree).stats.summary()
    except EinspaceError as exc:
        return f"(statistics unavailable: {str(exc).splitlines()[0]})"  # the header says why at length


def failure_reasons(history: History) -> list[tuple[str, int]]:
    """(first line of the reason, count) of the failed evaluations, most frequent first."""
    h = as_columns(history)
    reasons: dict[str, int] = {}
    for status, error in zip(h.status, h.error, strict=True):
        if status == Status.FAILED:
            reason = (error or "?").splitlines()[0][:100]
            reasons[reason] = reasons.get(reason, 0) + 1
    return sorted(reasons.items(), key=lambda item: -item[1])


def node_counts(history: History) -> list[tuple[str, int]]:
    """(Ray node id, evaluations that ran there) over the evaluations run on Ray, most first: how
    a search spread over a cluster (cached copies and in-process evaluations ran on no node)."""
    counts = Counter(node for node in as_columns(history).node if node is not None)
    return sorted(counts.items(), key=lambda item: (-item[1], item[0]))


def succeeded(history: History) -> bool:
    """Whether any evaluation of a run (or a cached copy of one) has a fitness."""
    h = as_columns(history)
    return any(
        status != Status.FAILED and fitness is not None
        for status, fitness in zip(h.status, h.fitness, strict=True)
    )


def metric_lines(metrics: dict[str, float]) -> list[str]:
    """The plain metrics on one line; then a line per group of `group/name` metrics (auxiliary
    loss terms, a network loss's report, each trainable module's effective architecture)."""
    plain = [f"{k} {v:.6g}" for k, v in sorted(metrics.items()) if "/" not in k and k != "fitness"]
    groups: dict[str, list[str]] = {}
    for key, value in sorted(metrics.items()):
        group, _, name = key.rpartition("/")
        if group:
            groups.setdefault(group, []).append(f"{name} {value:.6g}")
    lines = ["  ".join(plain)] if plain else []
    return lines + [f"{group}: {'  '.join(values)}" for group, values in groups.items()]


def _strategy(run: SearchRun) -> Strategy | None:
    """The run's strategy, or None where it cannot be built here (say, its grammar file is gone)."""
    try:
        return run.strategy
    except EinspaceError:
        return None


#: evaluations.csv's columns, in order.
_CSV_COLUMNS = (
    "seq",
    "id",
    "status",
    "fitness",
    "origin",
    "parents",
    "cached_from",
    "hash",
    "seconds",
    "fidelity",
    "partial",
    "compute_seconds",
    "cpu_seconds",
    "gpu_seconds",
    "epochs",
    "steps",
    "worker",
    "node",
    "error",
    "metrics",
    "tree",
)


def write_csv(history: History, path: Path) -> None:
    """evaluations.csv, written column by column: parents as ids separated by spaces, metrics as
    the JSON text the store wrote (`json.dumps` of them, "{}" where none was stored)."""
    h = as_columns(history)
    columns = {
        "parents": h.parent_ids,
        "partial": list(map(bool, h.partial)),
        "compute_seconds": h.compute,
        **{name: h.cost_field(name) for name in ("cpu_seconds", "gpu_seconds", "epochs", "steps")},
        "metrics": [m or "{}" for m in h.metrics],
    }
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(_CSV_COLUMNS)
        writer.writerows(
            zip(
                *(columns[name] if name in columns else getattr(h, name) for name in _CSV_COLUMNS),
                strict=True,
            )
        )


def step_points(xs: Sequence[float], ys: Sequence[float]) -> tuple[list[float], list[float]]:
    """The points of a post-step curve where its value changes, and its last point: drawn with
    `where="post"` they give the same curve as all of them (a best-so-far curve over 100,000
    results changes a few hundred times)."""
    keep = [i for i in range(len(ys)) if i == 0 or ys[i] != ys[i - 1] or i == len(ys) - 1]
    return [xs[i] for i in keep], [ys[i] for i in keep]


def fitness_series(history: History) -> dict[str, tuple[list[float], list[float]]]:
    """What fitness.png draws: each scored evaluation (finishing order, fitness), the best so far
    (as `step_points`), and the failures along the bottom (below the lowest fitness, or at 0)."""
    h = as_columns(history)
    ok = [(q, f) for q, s, f in zip(h.seq, h.status, h.fitness, strict=True) if compute.scored(s, f)]
    seqs, fitnesses = [float(q) for q, _ in ok], [f for _, f in ok]
    failed = [float(q) for q, s in zip(h.seq, h.status, strict=True) if s == Status.FAILED]
    low = min(fitnesses, default=0.0)
    return {
        "evaluation": (seqs, fitnesses),
        "best so far": step_points(seqs, list(itertools.accumulate(fitnesses, max))),
        "failed": (failed, [low] * len(failed)),
    }


def plot_fitness(history: History, path: Path | BinaryIO, title: str) -> None:
    """Each evaluation's fitness in finishing order, failures marked along the bottom, and the
    best so far. Points are line markers, not a scatter collection: Agg draws one marker image
    many times, which keeps 100,000 points to a fraction of a second."""
    from matplotlib.figure import Figure

    series = fitness_series(history)
    fig = Figure(figsize=(8, 4.5), dpi=100)
    ax = fig.add_subplot()
    if series["evaluation"][0]:
        ax.plot(*series["evaluation"], "o", ms=math.sqrt(6), mew=1, alpha=0.5, color="C0", label="evaluation")
        ax.step(*series["best so far"], where="post", color="C3", label="best so far")
    if series["failed"][0]:
        ax.plot(*series["failed"], "x", ms=math.sqrt(12), color="grey", label="failed")
    ax.set_xlabel("evaluation (finishing order)")
    ax.set_ylabel("fitness")
    ax.set_title(title)
    _legend(ax, loc="lower right")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, format="png")


def _legend(ax: Any, **options: Any) -> None:
    """A legend when something is labelled (matplotlib warns to the user's terminal otherwise)."""
    if ax.get_legend_handles_labels()[0]:
        ax.legend(**options)


def plot_compute(history: History, path: Path | BinaryIO, title: str) -> None:
    """The incumbent's fitness against the compute spent so far, and along the bottom the stretch
    of compute each failure took: how much of the run bought nothing."""
    from matplotlib.figure import Figure

    h = as_columns(history)
    points = compute.best_so_far(h)
    fig = Figure(figsize=(8, 4.5), dpi=100)
    ax = fig.add_subplot()
    best = [(seconds, fitness) for seconds, fitness in points if fitness is not None]
    if best:
        xs, ys = step_points([x for x, _ in best], [y for _, y in best])
        ax.step(xs, ys, where="post", color="C3", label="best so far")
    starts = [0.0] + [seconds for seconds, _ in points]
    failed = [(starts[i], h.compute[i]) for i, status in enumerate(h.status) if status == Status.FAILED]
    if failed:
        # x in seconds, y in axes fractions: a strip along the bottom whatever the fitness scale
        ax.broken_barh(failed, (0, 0.04), transform=ax.get_xaxis_transform(), color="grey", label="failed")
    ax.set_xlabel(f"compute spent ({_measures(h)} seconds, cumulative, finishing order)")
    ax.set_ylabel("best fitness so far")
    ax.set_title(title)
    _legend(ax, loc="best")  # failures lie along the bottom
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, format="png")


def _score(r: Record) -> str:
    """A record's validation accuracy where its evaluator reports one, else its fitness."""
    if "valid_accuracy" in r.metrics:
        return f"validation accuracy {r.metrics['valid_accuracy']:.4f}"
    return f"fitness {r.fitness:.6g}"


def final_summary(run_dir: str | Path) -> str:
    """What `einspace search` prints at the end: the best tree (text and statistics), how it
    compares with each seed's own evaluation (the record of origin `seed:<name>` that was
    evaluated, not a cached copy), and where the report goes."""
    run_dir = Path(run_dir)
    with SearchRun.open(run_dir) as run:
        history = run.store.columns()
        lines = _best_lines(history, run) + _seed_lines(history)
    lines.append(
        f"report: `einspace report {run_dir}` prints the top architectures and writes "
        f"{run_dir / 'fitness.png'}, {run_dir / 'compute.png'} and {run_dir / 'evaluations.csv'}"
    )
    return "\n".join(lines)


def _best_lines(history: Columns, run: SearchRun) -> list[str]:
    """The best evaluation's score, statistics and tree; or, when all failed, why."""
    best = best_records(history, 1)
    if best:
        b = best[0]
        return [
            f"best: {_score(b)} (id {b.id}, {b.origin}"
            + (f" of {', '.join(map(str, b.parents))}" if b.parents else "")
            + f", evaluation {b.seq} of {len(history)})",
            f"  {_stats(b.tree, run)}",
            f"  {b.tree}",
        ]
    lines = [f"best: no successful evaluation; all {len(history)} failed:"]
    return lines + [f"  x{n}: {reason}" for reason, n in failure_reasons(history)[:5]]


def _seed_lines(history: Columns) -> list[str]:
    """Each seed's own evaluation (not a cached copy) against the best."""
    lines = []
    best = best_records(history, 1)
    seeds: dict[str, int] = {}
    for i, (origin, status) in enumerate(zip(history.origin, history.status, strict=True)):
        if origin.startswith("seed:") and status != Status.CACHED:
            seeds.setdefault(origin[len("seed:") :], i)
    for name, i in seeds.items():
        r = history.record(i)
        if r.status == Status.FAILED or r.fitness is None:
            lines.append(f"seed {name}: failed ({(r.error or '?').splitlines()[0][:100]})")
            continue
        gain = ""
        if best and "valid_accuracy" in r.metrics and "valid_accuracy" in best[0].metrics:
            delta = best[0].metrics["valid_accuracy"] - r.metrics["valid_accuracy"]
            gain = f"; the best is {delta:+.4f}"
        elif best:
            gain = f"; the best is {best[0].fitness - r.fitness:+.6g} in fitness"  # type: ignore[operator]
        lines.append(f"seed {name}: {_score(r)} (id {r.id}){gain}")
    return lines


def report(
    run_dir: str | Path, top: int = 5, plot: bool = True, full: bool = False, trust_plugins: bool = False
) -> str:
    """The report text; also writes RUN_DIR/evaluations.csv, RUN_DIR/fitness.png and
    RUN_DIR/compute.png. Trees are printed folded (see `einspace.pictures.folding`), or as their
    full one-line text (`full`). The run's plugins are imported only when `trust_plugins`."""
    from einspace.search.pareto_report import front_lines

    run_dir = Path(run_dir)
    with SearchRun.open(run_dir, trust_plugins) as run:
        history = run.store.columns()
        lines = _header_lines(run, history) + front_lines(run, history) + [""]
        lines += _top_lines(run, best_records(history, top), full)
    write_csv(history, run_dir / "evaluations.csv")
    lines.append("")
    lines.append(f"wrote {run_dir / 'evaluations.csv'}")
    if plot and history:
        name = run.experiment.name if run.experiment else run_dir.name
        for draw, file in ((plot_fitness, "fitness.png"), (plot_compute, "compute.png")):
            draw(history, run_dir / file, name)
            lines.append(f"wrote {run_dir / file}")
    return "\n".join(lines)


def _header_lines(run: SearchRun, history: Columns) -> list[str]:
    """Strategy and evaluator, progress against the budget, what the whole run spent (compute),
    the mean where the strategy's result is one (random sampling), and the commonest failures."""
    e, strategy = run.experiment, _strategy(run)
    budget = strategy.evaluations if strategy else "?"
    tally = Counter(history.status)
    counts = {s: tally[s] for s in Status}
    strategy_name, evaluator_name = (e.strategy.name, e.evaluator.name) if e else ("?", None)
    promoted, finished = promotions(history), f"{len(history)} of {budget}"
    if promoted:  # a multi-fidelity run: the budget counts new architectures
        finished = f"{len(history) - promoted} of {budget} architectures and {promoted} promotions"
    lines = [
        f"run {run.directory}: strategy {strategy_name}, evaluator {evaluator_name}",
        f"finished {finished} (ok {counts['ok']}, failed {counts['failed']}, cached duplicates "
        f"{counts['cached']}); running/queued at last stop: {len(run.store.running())}"
        + ("  [complete]" if strategy and strategy.done else ""),
    ]
    if run.plugin_note():
        lines.append(f"plugins: {run.plugin_note()}")
    if nodes := node_counts(history):
        lines.append("evaluations per Ray node: " + ", ".join(f"{node[:12]} {n}" for node, n in nodes))
    if history:
        overall, fidelities = compute_rows(history, run.store.load_checkpoint())
        lines.append("compute: " + "; ".join(f"{what} {much}" for what, much in overall))
        lines += [f"  {what}: {much}" for what, much in fidelities]
    fitnesses = [
        f
        for s, f in zip(history.status, history.fitness, strict=True)
        if s != Status.FAILED and f is not None
    ]
    if fitnesses and strategy and strategy.reports_mean:
        mean = sum(fitnesses) / len(fitnesses)
        sd = math.sqrt(sum((f - mean) ** 2 for f in fitnesses) / max(1, len(fitnesses) - 1))
        label = strategy.name.replace("_", " ")
        lines.append(f"{label}: mean fitness {mean:.6g} (sd {sd:.3g}, n {len(fitnesses)})")
    return lines + [f"  failed x{n}: {reason}" for reason, n in failure_reasons(history)[:5]]


def _top_lines(run: SearchRun, best: list[Record], full: bool) -> list[str]:
    """Each of the best records: rank, fitness, origin, metrics, statistics and tree."""
    from einspace.search.html_report import console_tree

    lines = []
    for rank, r in enumerate(best, 1):
        lines.append(
            f"#{rank}  fitness {r.fitness:.6g}  id {r.id}  {r.origin}"
            + (f" of {', '.join(map(str, r.parents))}" if r.parents else "")
            + "".join(f"  {tag}" for tag in record_tags(r))
            + (f"  seconds {r.seconds:.2f}" if r.seconds is not None else "")
        )
        lines.extend(f"    {line}" for line in metric_lines(r.metrics))
        lines.append(f"    {_stats(r.tree, run)}")
        lines.extend(f"    {line}" for line in console_tree(r.tree, run, full).splitlines())
    return lines

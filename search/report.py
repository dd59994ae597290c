"""What a run found: the best architectures with their statistics, fitness over time (PNG), a CSV export."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path
from typing import BinaryIO

from einspace.errors import EinspaceError
from einspace.search.loop import SearchRun
from einspace.search.store import Record
from einspace.search.strategy import Strategy

__all__ = ["best_records", "final_summary", "plot_fitness", "report", "write_csv"]


def best_records(history: list[Record], k: int) -> list[Record]:
    """The k fittest successful evaluations, one per distinct tree (cached copies are not new)."""
    ok = [r for r in history if r.status == "ok" and r.fitness is not None]
    return sorted(ok, key=lambda r: (-r.fitness, r.id))[:k]  # type: ignore[operator]


def _stats(tree: str, run: SearchRun) -> str:
    try:
        return run.check(tree).stats.summary()
    except EinspaceError as exc:
        return f"(statistics unavailable: {exc})"


def failure_reasons(history: list[Record]) -> list[tuple[str, int]]:
    """(first line of the reason, count) of the failed evaluations, most frequent first."""
    reasons: dict[str, int] = {}
    for r in history:
        if r.status == "failed":
            reason = (r.error or "?").splitlines()[0][:100]
            reasons[reason] = reasons.get(reason, 0) + 1
    return sorted(reasons.items(), key=lambda item: -item[1])


def succeeded(history: list[Record]) -> bool:
    """Whether any evaluation of a run (or a cached copy of one) has a fitness."""
    return any(r.status != "failed" and r.fitness is not None for r in history)


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


def write_csv(history: list[Record], path: Path) -> None:
    columns = [
        "seq",
        "id",
        "status",
        "fitness",
        "origin",
        "parents",
        "cached_from",
        "hash",
        "seconds",
        "worker",
        "error",
        "metrics",
        "tree",
    ]
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(columns)
        for r in history:
            writer.writerow(
                [
                    r.seq,
                    r.id,
                    r.status,
                    r.fitness,
                    r.origin,
                    " ".join(map(str, r.parents)),
                    r.cached_from,
                    r.hash,
                    r.seconds,
                    r.worker,
                    r.error,
                    json.dumps(r.metrics),
                    r.tree,
                ]
            )


def plot_fitness(history: list[Record], path: Path | BinaryIO, title: str) -> None:
    """Each evaluation's fitness in finishing order, failures marked along the bottom, and the best so far."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=100)
    ok = [
        (r.seq, r.fitness)
        for r in history
        if r.status != "failed" and r.fitness is not None and math.isfinite(r.fitness)
    ]
    failed = [r.seq for r in history if r.status == "failed"]
    best, line = -math.inf, []
    for seq, fitness in ok:
        best = max(best, fitness)
        line.append((seq, best))
    if ok:
        ax.scatter(*zip(*ok, strict=True), s=6, alpha=0.5, label="evaluation")
        ax.step(*zip(*line, strict=True), where="post", color="C3", label="best so far")
        if failed:
            low = min(f for _, f in ok)
            ax.scatter(failed, [low] * len(failed), marker="x", s=12, color="grey", label="failed")
    ax.set_xlabel("evaluation (finishing order)")
    ax.set_ylabel("fitness")
    ax.set_title(title)
    ax.legend(loc="lower right")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


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
        history = run.store.history()
        lines = _best_lines(history, run) + _seed_lines(history)
    lines.append(
        f"report: `einspace report {run_dir}` prints the top architectures and writes "
        f"{run_dir / 'fitness.png'} and {run_dir / 'evaluations.csv'}"
    )
    return "\n".join(lines)


def _best_lines(history: list[Record], run: SearchRun) -> list[str]:
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


def _seed_lines(history: list[Record]) -> list[str]:
    """Each seed's own evaluation (not a cached copy) against the best."""
    lines = []
    best = best_records(history, 1)
    seeds: dict[str, Record] = {}
    for r in history:
        if r.origin.startswith("seed:") and r.status != "cached":
            seeds.setdefault(r.origin[len("seed:") :], r)
    for name, r in seeds.items():
        if r.status == "failed" or r.fitness is None:
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


def report(run_dir: str | Path, top: int = 5, plot: bool = True, full: bool = False) -> str:
    """The report text; also writes RUN_DIR/evaluations.csv and RUN_DIR/fitness.png. Trees are
    printed folded (see `einspace.pictures.folding`), or as their full one-line text (`full`)."""
    run_dir = Path(run_dir)
    with SearchRun.open(run_dir) as run:
        history = run.store.history()
        lines = _header_lines(run, history) + [""]
        lines += _top_lines(run, best_records(history, top), full)
    write_csv(history, run_dir / "evaluations.csv")
    lines.append("")
    lines.append(f"wrote {run_dir / 'evaluations.csv'}")
    if plot and history:
        name = run.experiment.name if run.experiment else run_dir.name
        plot_fitness(history, run_dir / "fitness.png", name)
        lines.append(f"wrote {run_dir / 'fitness.png'}")
    return "\n".join(lines)


def _header_lines(run: SearchRun, history: list[Record]) -> list[str]:
    """Strategy and evaluator, progress against the budget, the mean where the strategy's result
    is one (random sampling), and the commonest failures."""
    e, strategy = run.experiment, _strategy(run)
    budget = strategy.evaluations if strategy else "?"
    counts = {s: sum(r.status == s for r in history) for s in ("ok", "failed", "cached")}
    strategy_name, evaluator_name = (e.strategy.name, e.evaluator.name) if e else ("?", None)
    lines = [
        f"run {run.directory}: strategy {strategy_name}, evaluator {evaluator_name}",
        f"finished {len(history)} of {budget} (ok {counts['ok']}, failed {counts['failed']}, "
        f"cached duplicates {counts['cached']}); running/queued at last stop: {len(run.store.running())}"
        + ("  [complete]" if strategy and len(history) >= strategy.evaluations else ""),
    ]
    fitnesses = [r.fitness for r in history if r.status != "failed" and r.fitness is not None]
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
            + (f"  seconds {r.seconds:.2f}" if r.seconds is not None else "")
        )
        lines.extend(f"    {line}" for line in metric_lines(r.metrics))
        lines.append(f"    {_stats(r.tree, run)}")
        lines.extend(f"    {line}" for line in console_tree(r.tree, run, full).splitlines())
    return lines

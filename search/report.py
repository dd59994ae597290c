"""What a run found: the best architectures with their statistics, fitness over time (PNG), a CSV export."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path
from typing import Any, BinaryIO

from einspace.errors import EinspaceError
from einspace.plugins import load_plugins
from einspace.search.loop import STORE_NAME
from einspace.search.store import Record, SQLiteStore

__all__ = ["best_records", "final_summary", "open_run", "plot_fitness", "report", "write_csv"]


def open_run(run_dir: str | Path) -> tuple[SQLiteStore, dict[str, Any]]:
    """The store of an existing run and its experiment config, with the run's plugins loaded (an
    error if there is no run there)."""
    path = Path(run_dir) / STORE_NAME
    if not path.is_file():
        raise EinspaceError(f"{run_dir} is not a search run directory (no {STORE_NAME} in it)")
    store = SQLiteStore(path)
    config = json.loads(store.get_meta("config") or "{}")
    try:
        load_plugins(config.get("plugins", []))  # the run's own operations and evaluators
    except EinspaceError as exc:
        store.close()
        raise EinspaceError(f"{run_dir} was searched with plugins that no longer load: {exc}") from None
    return store, config


def best_records(history: list[Record], k: int) -> list[Record]:
    """The k fittest successful evaluations, one per distinct tree (cached copies are not new)."""
    ok = [r for r in history if r.status == "ok" and r.fitness is not None]
    return sorted(ok, key=lambda r: (-r.fitness, r.id))[:k]  # type: ignore[operator]


def _stats(tree: str, config: dict[str, Any]) -> str:
    from einspace.bundled import load
    from einspace.checker import check_tree, statistics
    from einspace.state import input_state
    from einspace.tree import parse_tree

    try:
        state = input_state(tuple(config["input"]["shape"]), config["input"]["mode"])
        s = statistics(check_tree(parse_tree(tree), load(config["grammar"]), state))
    except (EinspaceError, KeyError) as exc:
        return f"(statistics unavailable: {exc})"
    return (
        f"params {s['params']:,}  FLOPs {s['flops']:,}  depth {s['depth']}  "
        f"terminals {s['terminals']}  output {s['output']}"
    )


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


def _default_budget(name: str) -> int | str:
    """The strategy's default `evaluations` when the experiment left it out ("?" if unknown)."""
    import inspect

    from einspace.search.strategy import _STRATEGIES, list_strategies

    if name not in list_strategies():
        return "?"
    return inspect.signature(_STRATEGIES[name]).parameters["evaluations"].default


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
    store, config = open_run(run_dir)
    try:
        history = store.history()
    finally:
        store.close()
    lines = []
    best = best_records(history, 1)
    if best:
        b = best[0]
        lines += [
            f"best: {_score(b)} (id {b.id}, {b.origin}"
            + (f" of {', '.join(map(str, b.parents))}" if b.parents else "")
            + f", evaluation {b.seq} of {len(history)})",
            f"  {_stats(b.tree, config)}",
            f"  {b.tree}",
        ]
    else:
        lines.append(f"best: no successful evaluation; all {len(history)} failed:")
        lines.extend(f"  x{n}: {reason}" for reason, n in failure_reasons(history)[:5])
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
    lines.append(
        f"report: `einspace report {run_dir}` prints the top architectures and writes "
        f"{run_dir / 'fitness.png'} and {run_dir / 'evaluations.csv'}"
    )
    return "\n".join(lines)


def report(run_dir: str | Path, top: int = 5, plot: bool = True, full: bool = False) -> str:
    """The report text; also writes RUN_DIR/evaluations.csv and RUN_DIR/fitness.png. Trees are
    printed folded (see `einspace.pictures.folding`), or as their full one-line text (`full`)."""
    from einspace.search.html_report import console_tree

    run_dir = Path(run_dir)
    store, config = open_run(run_dir)
    try:
        history = store.history()
        running = store.running()
    finally:
        store.close()
    strategy = config.get("strategy", {})
    budget = strategy.get("settings", {}).get("evaluations") or _default_budget(strategy.get("name", ""))
    counts = {s: sum(r.status == s for r in history) for s in ("ok", "failed", "cached")}
    evaluator = config.get("evaluator", {}).get("name")
    lines = [
        f"run {run_dir}: strategy {strategy.get('name', '?')}, evaluator {evaluator}",
        f"finished {len(history)} of {budget} (ok {counts['ok']}, failed {counts['failed']}, "
        f"cached duplicates {counts['cached']}); running/queued at last stop: {len(running)}"
        + ("  [complete]" if isinstance(budget, int) and len(history) >= budget else ""),
    ]
    fitnesses = [r.fitness for r in history if r.status != "failed" and r.fitness is not None]
    if fitnesses and strategy.get("name") == "random_sampling":
        mean = sum(fitnesses) / len(fitnesses)
        sd = math.sqrt(sum((f - mean) ** 2 for f in fitnesses) / max(1, len(fitnesses) - 1))
        lines.append(f"random sampling: mean fitness {mean:.6g} (sd {sd:.3g}, n {len(fitnesses)})")
    lines.extend(f"  failed x{n}: {reason}" for reason, n in failure_reasons(history)[:5])
    lines.append("")
    for rank, r in enumerate(best_records(history, top), 1):
        lines.append(
            f"#{rank}  fitness {r.fitness:.6g}  id {r.id}  {r.origin}"
            + (f" of {', '.join(map(str, r.parents))}" if r.parents else "")
            + (f"  seconds {r.seconds:.2f}" if r.seconds is not None else "")
        )
        lines.extend(f"    {line}" for line in metric_lines(r.metrics))
        lines.append(f"    {_stats(r.tree, config)}")
        lines.extend(f"    {line}" for line in console_tree(r.tree, config, full).splitlines())
    write_csv(history, run_dir / "evaluations.csv")
    lines.append("")
    lines.append(f"wrote {run_dir / 'evaluations.csv'}")
    if plot and history:
        plot_fitness(history, run_dir / "fitness.png", f"{config.get('name', run_dir.name)}")
        lines.append(f"wrote {run_dir / 'fitness.png'}")
    return "\n".join(lines)

"""A run as one self-contained HTML page: fitness, compute, failures, sizes, operations, diversity, the
best trees.

Every image is embedded (PNG plots, SVG pictures of architectures), so the page opens in any
browser, offline, with nothing beside it. Also the folded console form of a record's tree.
"""

from __future__ import annotations

import base64
import html
import io
import json
import math
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, BinaryIO

from matplotlib.figure import Figure

from einspace.checker import CheckedTree
from einspace.errors import EinspaceError
from einspace.outputs import writable, write_output
from einspace.search.columns import Columns
from einspace.search.config import Experiment
from einspace.search.loop import SearchRun
from einspace.search.store import Record, Status

__all__ = ["console_tree", "diversity", "operation_shares", "write_html_report"]


def console_tree(tree: str, run: SearchRun, full: bool = False) -> str:
    """A record's tree for the console: folded and indented, or (`full`, or when it cannot be
    checked against the run's grammar) its one-line text as stored."""
    from einspace.pictures.folding import folded_text

    if full:
        return tree
    try:
        return folded_text(run.check(tree))
    except EinspaceError:
        return tree


@dataclass(frozen=True)
class _Evaluated:
    """What the report needs of one evaluated (not cached) record's tree."""

    record: Record
    params: int
    flops: int
    depth: int
    ops: Counter


def _evaluated(history: list[Record], run: SearchRun) -> list[_Evaluated]:
    out = []
    for r in history:
        if r.status == Status.CACHED:
            continue
        try:
            checked = run.check(r.tree)
        except EinspaceError:
            continue  # a tree the run's grammar no longer accepts has no sizes; it is still counted
        s = checked.stats
        ops = Counter(op for op in _terminal_ops(checked))
        out.append(_Evaluated(r, s.params, s.flops, s.depth, ops))
    return out


def _terminal_ops(checked: CheckedTree) -> list[str]:
    from einspace.tree import Terminal, walk

    return [node.op for _, node in walk(checked.tree) if isinstance(node, Terminal)]


def operation_shares(trees: list[Counter]) -> dict[str, float]:
    """Each operation's share of all terminal nodes in `trees` (one count per derivation node)."""
    total = Counter()
    for ops in trees:
        total.update(ops)
    n = sum(total.values())
    return {op: count / n for op, count in total.items()} if n else {}


def _distance(a: Counter, b: Counter) -> float:
    """Total variation distance between two trees' operation profiles, in [0, 1]."""
    na, nb = sum(a.values()), sum(b.values())
    if not na or not nb:
        return float(na != nb)
    return 0.5 * sum(abs(a[k] / na - b[k] / nb) for k in set(a) | set(b))


def diversity(history: list[Record], ops: dict[str, Counter], window: int) -> list[tuple[int, float, float]]:
    """After each evaluation (finishing order, `seq`), over the last `window` trees told to the
    strategy (regularised evolution's population): the fraction of distinct trees, and the mean
    pairwise distance of their operation profiles (`ops` by hash; trees without one are skipped)."""
    out = []
    for i in range(len(history)):
        recent = history[max(0, i + 1 - window) : i + 1]
        hashes = [r.hash for r in recent]
        profiles = [ops[h] for h in hashes if h in ops]
        pairs = [(a, b) for j, a in enumerate(profiles) for b in profiles[j + 1 :]]
        spread = sum(_distance(a, b) for a, b in pairs) / len(pairs) if pairs else 0.0
        out.append((history[i].seq or i + 1, len(set(hashes)) / len(hashes), spread))
    return out


# ----------------------------------------------------------------------------- figures


def _png(fig: Figure) -> str:
    from einspace.pictures.files import data_uri

    return data_uri(fig, "png")


def _report_png(draw: Callable[[Columns, BinaryIO, str], None], history: Columns, title: str) -> str:
    """One of the console report's plots (`plot_fitness`, `plot_compute`) as a data URI."""
    buffer = io.BytesIO()
    draw(history, buffer, title)
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


def _failures_png(reasons: Counter) -> str:
    fig = Figure(figsize=(8, 0.6 + 0.35 * len(reasons)), dpi=100)
    ax = fig.add_subplot()
    labels = [r if len(r) <= 70 else r[:67] + "..." for r in reasons]
    ax.barh(range(len(reasons)), list(reasons.values()), color="#e57373")
    ax.set_yticks(range(len(reasons)), labels, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("failed evaluations")
    fig.tight_layout()
    return _png(fig)


def _sizes_png(evaluated: list[_Evaluated]) -> str:
    fig = Figure(figsize=(11, 3.2), dpi=100)
    measures = (("parameters", "params", True), ("FLOPs", "flops", True), ("depth", "depth", False))
    for i, (title, field, log) in enumerate(measures):
        ax = fig.add_subplot(1, 3, i + 1)
        series = []
        for status, colour in ((Status.OK, "#64b5f6"), (Status.FAILED, "#e57373")):
            values = [getattr(e, field) for e in evaluated if e.record.status == status]
            series.append(([math.log10(max(v, 1)) for v in values] if log else values, colour, status))
        ax.hist(
            [s[0] for s in series],
            bins=20,
            stacked=True,
            color=[s[1] for s in series],
            label=[s[2] for s in series],
        )
        ax.set_xlabel(f"log10 {title}" if log else title)
        ax.set_ylabel("trees")
        ax.legend(fontsize=8)
    fig.tight_layout()
    return _png(fig)


def _operations_png(all_shares: dict[str, float], top_shares: dict[str, float], k: int) -> str:
    from einspace.ops.registry import get_op, has_op
    from einspace.pictures.dot import GROUP_COLOURS

    ops = sorted(all_shares, key=lambda op: -max(all_shares[op], top_shares.get(op, 0.0)))
    fig = Figure(figsize=(8, 0.8 + 0.28 * len(ops)), dpi=100)
    ax = fig.add_subplot()
    colours = [GROUP_COLOURS.get(get_op(op).group if has_op(op) else None, "#999999") for op in ops]
    y = list(range(len(ops)))
    ax.barh(
        [v - 0.2 for v in y],
        [all_shares[op] for op in ops],
        0.4,
        color=colours,
        alpha=0.4,
        label="all evaluated",
    )
    ax.barh(
        [v + 0.2 for v in y], [top_shares.get(op, 0.0) for op in ops], 0.4, color=colours, label=f"top {k}"
    )
    ax.set_yticks(y, ops, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("share of terminal nodes")
    ax.legend()
    fig.tight_layout()
    return _png(fig)


def _diversity_png(points: list[tuple[int, float, float]], window: int) -> str:
    fig = Figure(figsize=(8, 3.5), dpi=100)
    ax = fig.add_subplot()
    seqs = [p[0] for p in points]
    ax.plot(seqs, [p[1] for p in points], label="distinct trees (fraction)")
    ax.plot(seqs, [p[2] for p in points], label="mean operation-profile distance")
    ax.set_ylim(0, 1.05)
    ax.set_xlabel("evaluation (finishing order)")
    ax.set_title(f"over the last {window} evaluations", fontsize=9)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return _png(fig)


# ----------------------------------------------------------------------------- the page


def _img(src: str, alt: str) -> str:
    return f'<img alt="{html.escape(alt)}" src="{src}">'


def _table(rows: list[tuple[str, Any]]) -> str:
    body = "".join(f"<tr><th>{html.escape(k)}</th><td>{html.escape(str(v))}</td></tr>" for k, v in rows)
    return f"<table>{body}</table>"


def _window(experiment: Experiment | None) -> int:
    """Regularised evolution's population size; for other strategies a window of the same default."""
    population = experiment.strategy.settings.get("population") if experiment else None
    return int(population) if population else 16


def _settings_rows(experiment: Experiment | None) -> list[tuple[str, Any]]:
    """The run's grammar, input, strategy and evaluator, for the table at the top."""
    if experiment is None:
        return [("grammar", "?"), ("input", "null"), ("strategy", "? {}"), ("evaluator", "?")]
    strategy = experiment.strategy
    return [
        ("grammar", experiment.grammar),
        ("input", json.dumps(asdict(experiment.input), sort_keys=True)),
        ("strategy", f"{strategy.name} {json.dumps(strategy.settings)}"),
        ("evaluator", experiment.evaluator.name),
    ]


def _compute_section(history: Columns, name: str, checkpoint: dict[str, Any] | None) -> list[str]:
    """The best so far against the compute spent, and a table of where the compute went."""
    from einspace.search.report import compute_rows, plot_compute

    if not history:
        return []
    overall, fidelities = compute_rows(history, checkpoint)
    return [
        "<h2>Best so far against compute</h2>",
        "<p>The best fitness found against the compute spent to find it (GPU seconds where a GPU "
        "trained, else CPU seconds), evaluations in finishing order, cached duplicates free; for a "
        "multi-fidelity run the best at the highest fidelity reached. Grey along the bottom: the "
        "compute of evaluations that failed.</p>",
        _img(_report_png(plot_compute, history, name), "best so far against compute"),
        _table(overall + fidelities),
    ]


def write_html_report(
    run_dir: str | Path, path: str | Path | None = None, top: int = 5, trust_plugins: bool = False
) -> Path:
    """Write the run's report page (default RUN_DIR/report.html) and return its path (the run's
    plugins imported only when `trust_plugins`)."""
    from einspace.pictures.files import page, tree_section
    from einspace.search.pareto_report import pareto_section
    from einspace.search.report import best_records, metric_lines, plot_fitness, record_tags

    run_dir = Path(run_dir)
    with SearchRun.open(run_dir, trust_plugins) as run:  # what it read stays readable once closed
        history, columns, checkpoint = run.store.history(), run.store.columns(), run.store.load_checkpoint()
    path = writable(path if path is not None else run_dir / "report.html")  # before drawing
    name = run.experiment.name if run.experiment else run_dir.name
    window = _window(run.experiment)
    evaluated = _evaluated(history, run)
    counts = Counter(r.status for r in history)
    best = best_records(columns, top)
    parts = [
        f"<h1>einspace run {html.escape(name)}</h1>",
        _table(
            [
                ("run directory", run_dir),
                *_settings_rows(run.experiment),
                (
                    "evaluations",
                    f"{len(history)} (ok {counts['ok']}, failed {counts['failed']}, "
                    f"cached duplicates {counts['cached']})",
                ),
                ("best fitness", f"{best[0].fitness:.6g} (id {best[0].id})" if best else "none"),
            ]
        ),
        "<h2>Fitness over evaluations</h2>",
        "<p>Each evaluation's fitness in finishing order, the best so far, failures along the bottom.</p>",
        _img(_report_png(plot_fitness, columns, name), "fitness over evaluations")
        if history
        else "<p>no evaluations</p>",
        *_compute_section(columns, name, checkpoint),
        *pareto_section(run, history),
        "<h2>Failures by reason</h2>",
    ]
    reasons = Counter((r.error or "?").splitlines()[0][:200] for r in history if r.status == Status.FAILED)
    if reasons:
        parts.append(_img(_failures_png(reasons), "failures by reason"))
        parts.append(_table([(reason, f"{n} evaluations") for reason, n in reasons.most_common()]))
    else:
        parts.append("<p>No evaluation failed.</p>")
    parts.append("<h2>Sizes of the evaluated trees</h2>")
    if evaluated:
        parts.append(
            f"<p>{len(evaluated)} distinct evaluated trees (cached duplicates not counted again).</p>"
        )
        parts.append(_img(_sizes_png(evaluated), "sizes of the evaluated trees"))
        ops = {e.record.hash: e.ops for e in evaluated}
        top_ops = [ops[r.hash] for r in best if r.hash in ops]
        parts += [
            f"<h2>Operations in the top {len(top_ops)} versus all evaluated trees</h2>",
            "<p>Each operation's share of the terminal nodes (coloured by group, as in the pictures).</p>",
            _img(
                _operations_png(
                    operation_shares([e.ops for e in evaluated]), operation_shares(top_ops), len(top_ops)
                ),
                "operation frequencies",
            ),
            "<h2>Population diversity over time</h2>",
            f"<p>Over the last {window} evaluations at each point (regularised evolution's "
            "population): "
            "the fraction of distinct trees and the mean total-variation distance between their operation "
            "profiles (0: the same operations in the same proportions, 1: none in common).</p>",
            _img(_diversity_png(diversity(history, ops, window), window), "diversity"),
        ]
    else:
        parts.append("<p>No tree could be checked against the run's grammar.</p>")
    parts.append(f"<h2>The top {len(best)} architectures</h2>")
    for rank, r in enumerate(best, 1):
        parents = f" of {', '.join(map(str, r.parents))}" if r.parents else ""
        what = ", ".join([r.origin + parents, *record_tags(r)])
        parts.append(f"<h3>#{rank}: fitness {r.fitness:.6g}, id {r.id}, {html.escape(what)}</h3>")
        details = metric_lines(r.metrics)
        try:
            checked = run.check(r.tree)
        except EinspaceError as exc:
            parts.append(
                f"<p>cannot draw this tree: {html.escape(str(exc))}</p><pre>{html.escape(r.tree)}</pre>"
            )
            continue
        details.insert(0, checked.stats.summary())
        parts.append(f"<pre>{html.escape(chr(10).join(details))}</pre>")
        parts.append(tree_section(checked, f"#{rank} (id {r.id})"))
    return write_output(path, page(f"einspace run {name}", "\n".join(parts)))

"""The Pareto front of a multi-objective run, for `einspace report`: a table of the non-dominated
feasible results, and for the HTML page scatter plots (pairwise for more than two objectives) with
the front highlighted, the hypervolume over compute against the reference point, and the front's
trees drawn."""

from __future__ import annotations

import html
import itertools
from collections.abc import Sequence

from matplotlib.figure import Figure

from einspace.errors import EinspaceError
from einspace.search.columns import Columns, as_records
from einspace.search.loop import SearchRun
from einspace.search.multi_objective import Objectives
from einspace.search.store import Record

__all__ = ["front_lines", "objectives_of", "pareto_section"]

#: Front members drawn on the HTML page (a large front would make the page huge).
DRAWN = 12


def objectives_of(run: SearchRun) -> Objectives | None:
    """The run's objectives, or None for a single-objective run (or one whose experiment is unread)."""
    if run.experiment is None or not run.experiment.multi_objective.enabled:
        return None
    return Objectives.of(run.experiment.multi_objective, run.grammar, run.input)


def _reference_note(objectives: Objectives) -> str:
    if objectives.reference is None:
        return "hypervolume: set multi_objective.reference to report it"
    return f"reference point ({', '.join(f'{r:g}' for r in objectives.reference)})"


def front_lines(run: SearchRun, history: Columns | Sequence[Record]) -> list[str]:
    """The Pareto front as a text table (rank, id, each objective), with the final hypervolume
    (records are made of the columns only for a multi-objective run)."""
    objectives = objectives_of(run)
    if objectives is None:
        return []
    history = as_records(history)
    front = objectives.front(history)
    directions = ", ".join(f"{t.label} ({t.direction})" for t in objectives.terms)
    lines = ["", f"Pareto front: {len(front)} non-dominated feasible results over {directions}"]
    curve = objectives.hypervolume_over_compute(history)
    if curve:
        lines.append(f"hypervolume {curve[-1][1]:.6g} against the {_reference_note(objectives)}")
    else:
        lines.append(_reference_note(objectives))
    width = max(12, *(len(label) for label in objectives.labels))
    lines.append("  " + f"{'id':>6}  " + "  ".join(f"{label:>{width}}" for label in objectives.labels))
    for r, values in front:
        lines.append("  " + f"{r.id:>6}  " + "  ".join(f"{v:>{width}.6g}" for v in values))
    return lines


def _scatter_png(objectives: Objectives, history: list[Record]) -> str:
    """Every feasible result (grey), infeasible ones (red crosses) and the front (blue) for each
    pair of objectives."""
    from einspace.search.html_report import _png

    points = [(r, objectives.values(r), objectives.violation(r)) for r in history]
    points = [(r, v, x) for r, v, x in points if v is not None]
    front = {r.id for r, _ in objectives.front(history)}
    pairs = list(itertools.combinations(range(len(objectives.terms)), 2))
    fig = Figure(figsize=(4.2 * min(len(pairs), 3), 3.8 * ((len(pairs) + 2) // 3)), dpi=100)
    for k, (a, b) in enumerate(pairs):
        ax = fig.add_subplot((len(pairs) + 2) // 3, min(len(pairs), 3), k + 1)
        for label, keep, style in (
            ("feasible", lambda r, x: x == 0 and r.id not in front, {"c": "#bbbbbb", "s": 12}),
            ("infeasible", lambda r, x: x > 0, {"c": "#e57373", "marker": "x", "s": 14}),
            ("Pareto front", lambda r, x: r.id in front, {"c": "#1e88e5", "s": 30, "edgecolors": "k"}),
        ):
            chosen = [v for r, v, x in points if keep(r, x)]
            if chosen:
                ax.scatter([v[a] for v in chosen], [v[b] for v in chosen], label=label, **style)
        ax.set_xlabel(f"{objectives.labels[a]} ({objectives.terms[a].direction})")
        ax.set_ylabel(f"{objectives.labels[b]} ({objectives.terms[b].direction})")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    return _png(fig)


def _hypervolume_png(curve: list[tuple[float, float]]) -> str:
    from einspace.search.html_report import _png

    fig = Figure(figsize=(8, 3.5), dpi=100)
    ax = fig.add_subplot()
    ax.step([c for c, _ in curve], [h for _, h in curve], where="post")
    ax.set_xlabel("compute seconds (cumulative, finishing order)")
    ax.set_ylabel("hypervolume")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return _png(fig)


def pareto_section(run: SearchRun, history: list[Record]) -> list[str]:
    """The HTML page's multi-objective part (nothing for a single-objective run)."""
    from einspace.pictures.files import tree_section
    from einspace.search.html_report import _img, _table

    objectives = objectives_of(run)
    if objectives is None:
        return []
    front = objectives.front(history)
    parts = ["<h2>Pareto front</h2>"]
    if len(objectives.terms) > 1 and front:
        parts += [
            "<p>Each successful result by its objectives, two at a time; the non-dominated feasible "
            "ones in blue, results breaking a limit as red crosses (trees refused before training, and "
            "failures, have no point).</p>",
            _img(_scatter_png(objectives, history), "Pareto front"),
        ]
    curve = objectives.hypervolume_over_compute(history)
    if curve:
        parts += [
            f"<p>Hypervolume of the feasible results so far against the {_reference_note(objectives)}, "
            "over the compute spent.</p>",
            _img(_hypervolume_png(curve), "hypervolume over compute"),
        ]
    else:
        parts.append(f"<p>{html.escape(_reference_note(objectives))}</p>")
    rows = [
        (f"id {r.id}", ", ".join(f"{t}: {v:.6g}" for t, v in zip(objectives.labels, values, strict=True)))
        for r, values in front
    ]
    parts.append(_table(rows))
    for r, values in front[:DRAWN]:
        try:
            checked = run.check(r.tree)
        except EinspaceError as exc:
            parts.append(f"<p>id {r.id}: cannot draw this tree: {html.escape(str(exc))}</p>")
            continue
        title = ", ".join(f"{t} {v:.6g}" for t, v in zip(objectives.labels, values, strict=True))
        parts.append(f"<h3>front: id {r.id} ({html.escape(title)})</h3>")
        parts.append(tree_section(checked, f"front id {r.id}"))
    if len(front) > DRAWN:
        parts.append(f"<p>{len(front) - DRAWN} more front members are in the table above.</p>")
    return parts

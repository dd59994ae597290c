"""`einspace learn-probabilities RUN --out FILE.pcfg`: a grammar whose rule probabilities are
estimated from a search run's fittest trees (`einspace.grammar.learning`), written as a grammar file."""

from __future__ import annotations

import argparse
from pathlib import Path

from einspace.errors import EinspaceError
from einspace.grammar.learning import LearnedGrammar, learn_probabilities
from einspace.grammar.model import Grammar, format_alternative
from einspace.grammar.writer import format_grammar
from einspace.outputs import writable, write_output

__all__ = ["add_command", "learn_from_run"]


def add_command(sub: argparse._SubParsersAction) -> None:
    from einspace.search.cli import add_trust_plugins

    learn = sub.add_parser(
        "learn-probabilities",
        help="estimate rule probabilities from a run's fittest trees and write them as a grammar file",
        description="Counts, per rule (symbol and guard), which alternatives the fittest evaluated trees "
        "of a run chose, and writes the run's grammar with probabilities (n + s*p) / (N + s), shrunk toward "
        "the original where needed to keep the spectral radius below --max-rho.",
    )
    learn.add_argument("run_dir", help="the run directory (holds search.sqlite)")
    learn.add_argument("--out", required=True, metavar="FILE", help="the grammar file to write (.pcfg)")
    learn.add_argument(
        "--top",
        type=int,
        default=None,
        metavar="K",
        help="learn from the K fittest distinct trees (default: a quarter)",
    )
    learn.add_argument(
        "--prior-strength",
        type=float,
        default=10.0,
        metavar="S",
        help="pseudo-counts of the original (default 10)",
    )
    learn.add_argument(
        "--max-rho", type=float, default=0.99, help="largest spectral radius allowed (default 0.99)"
    )
    learn.add_argument(
        "--force",
        action="store_true",
        help="allow --out to replace a grammar file the run reads (the run then cannot resume)",
    )
    add_trust_plugins(learn)
    learn.set_defaults(run=_cmd)


def _cmd(args: argparse.Namespace) -> int:
    print(
        learn_from_run(
            args.run_dir,
            args.out,
            args.top,
            args.prior_strength,
            args.max_rho,
            args.force,
            args.trust_plugins,
        )
    )
    return 0


def learn_from_run(
    run_dir: str | Path,
    out: str | Path,
    top: int | None = None,
    prior_strength: float = 10.0,
    max_rho: float = 0.99,
    force: bool = False,
    trust_plugins: bool = False,
) -> str:
    """Learn from the `top` fittest distinct trees of a run, write the grammar to `out`, and return
    a summary of what changed. `out` may replace a grammar file the run reads only when `force`:
    the run's identity covers its grammar, so it could never resume. The run's plugins are
    imported only when `trust_plugins`."""
    from einspace.search.loop import SearchRun
    from einspace.search.report import best_records
    from einspace.tree import parse_tree

    with SearchRun.open(run_dir, trust_plugins) as run:
        history = run.store.history()
    out = writable(out)
    if not force and out.exists() and out.resolve() in _grammar_files(run.grammar):
        raise EinspaceError(
            f"--out {out} is a grammar file of the run in {run_dir}; replacing it would stop the run "
            "from resuming. Choose another file, or pass --force."
        )
    ok = best_records(history, len(history))
    if not ok:
        raise EinspaceError(f"{run_dir} has no successful evaluation to learn from")
    k = max(1, len(ok) // 4) if top is None else top
    if k < 1:
        raise EinspaceError(f"--top must be at least 1, got {k}")
    best = ok[:k]
    grammar, trees = run.grammar, [parse_tree(r.tree) for r in best]
    learned = learn_probabilities(grammar, run.input, trees, prior_strength, max_rho)
    radii = ", ".join(f"{mode} {rho:.4f}" for mode, rho in learned.spectral_radius.items())
    header = "\n".join(
        [
            f"Learned by `einspace learn-probabilities` from the run in {run_dir}:",
            f"its {len(best)} fittest of {len(ok)} distinct successful evaluations "
            f"(fitness {best[-1].fitness:.6g} to {best[0].fitness:.6g}).",
            "Per rule (symbol and guard), p = (n + s * p0) / (N + s): n the choices those trees made,",
            f"p0 the probabilities of {grammar.path}, s = {prior_strength:g}; shrunk {learned.shrink:.3f} "
            f"of the way back to p0",
            f"to keep rho <= {max_rho:g} (rho: {radii}). Argument grids stay uniform.",
        ]
    )
    write_output(out, format_grammar(learned.grammar, header))
    return (
        f"wrote {out}\n"
        + "\n".join(f"# {line}" for line in header.splitlines())
        + "\n"
        + _changes(grammar, learned)
    )


def _grammar_files(grammar: Grammar) -> set[Path]:
    """Every file the grammar was read from: its own and those it extends."""
    items = [x for r in grammar.rules for x in (r, *r.alternatives)]
    paths = [grammar.path, *(x.location.path for x in items if x.location)]
    return {Path(p).resolve() for p in paths if p and Path(p).is_file()}


def _changes(original: Grammar, learned: LearnedGrammar) -> str:
    """One line per rule the trees used: each alternative's probability, before -> after (counts)."""
    lines = ["rule: alternative old -> new (times chosen)"]
    for rule, new, counts in zip(original.rules, learned.grammar.rules, learned.counts, strict=True):
        if not sum(counts):
            continue
        guard = f" if {' and '.join(map(str, rule.guard))}" if rule.guard else ""
        parts = [
            f"{format_alternative(a)} {a.probability:.3f} -> {b.probability:.3f} ({n})"
            for a, b, n in zip(rule.alternatives, new.alternatives, counts, strict=True)
        ]
        lines.append(f"  {rule.symbol}{guard}: " + "; ".join(parts))
    return "\n".join(lines)

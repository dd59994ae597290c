"""`einspace search` and `einspace report`: the subcommands this package adds to the `einspace` command."""

from __future__ import annotations

import argparse
import signal
import sys
import time
from typing import Any

from einspace.search.store import Record
from einspace.search.strategy import Strategy


def add_commands(sub: argparse._SubParsersAction) -> None:
    """Called by `einspace.cli` to register this package's subcommands."""
    search = sub.add_parser(
        "search",
        help="run (or resume) the search an experiment file describes",
        description="Run a search; rerunning the same experiment resumes it. Ctrl-C stops cleanly.",
    )
    search.add_argument("experiment", help="experiment file (YAML)")
    search.add_argument(
        "--ray-address",
        default=None,
        help="join an existing Ray cluster ('auto' for the local one started by `ray start`)",
    )
    search.add_argument("--run-dir", default=None, help="override the experiment's run_dir")
    search.add_argument(
        "--evaluations",
        type=int,
        default=None,
        metavar="N",
        help="evaluate until the run has N in all (extends a finished search; overrides the file)",
    )
    search.add_argument("--quiet", action="store_true", help="no progress output")
    search.set_defaults(run=cmd_search)

    rep = sub.add_parser("report", help="summarise a run: best architectures, fitness.png, evaluations.csv")
    rep.add_argument("run_dir", help="the run directory (holds search.sqlite)")
    rep.add_argument("--top", type=int, default=5, help="how many of the best architectures to show")
    rep.add_argument("--no-plot", action="store_true", help="skip fitness.png")
    rep.add_argument("--full", action="store_true", help="print each tree's full one-line text, not folded")
    rep.add_argument(
        "--html",
        nargs="?",
        const="",
        metavar="FILE",
        help="also write a self-contained HTML report with pictures (default FILE: RUN_DIR/report.html)",
    )
    rep.set_defaults(run=cmd_report)

    from einspace.search import learn

    learn.add_command(sub)  # learn-probabilities


class _Progress:
    """One updating line on a terminal; a line every 5% otherwise (logs stay readable)."""

    def __init__(self, budget: int, done: int, quiet: bool):
        self.budget, self.done, self.quiet = budget, done, quiet
        self.tty = sys.stderr.isatty()
        self.best = float("-inf")
        self.failed = self.cached = 0
        self.started = time.monotonic()
        self.session = 0
        self.every = max(1, budget // 20)

    def __call__(self, record: Record, strategy: Strategy) -> None:
        self.done += 1
        self.session += 1
        self.failed += record.status == "failed"
        self.cached += record.status == "cached"
        if record.status != "failed" and record.fitness is not None:
            self.best = max(self.best, record.fitness)
        if self.quiet or not (self.tty or self.done % self.every == 0 or self.done == self.budget):
            return
        rate = self.session / max(1e-9, time.monotonic() - self.started)
        width = 30
        filled = int(width * min(1.0, self.done / max(1, self.budget)))
        text = (
            f"[{'#' * filled}{'.' * (width - filled)}] {self.done}/{self.budget}  best {self.best:.5g}  "
            f"failed {self.failed}  cached {self.cached}  {rate:.2f} eval/s"
        )
        print(("\r" + text) if self.tty else text, end="" if self.tty else "\n", file=sys.stderr, flush=True)

    def close(self) -> None:
        if self.tty and not self.quiet:
            print(file=sys.stderr)


def cmd_search(args: argparse.Namespace) -> int:
    from pathlib import Path

    from einspace.search.config import Experiment, load_experiment
    from einspace.search.loop import open_store, run_search
    from einspace.search.report import final_summary, succeeded

    experiment = load_experiment(args.experiment)
    changes: dict[str, Any] = {"run_dir": args.run_dir} if args.run_dir else {}
    if args.evaluations is not None:
        strategy = experiment["strategy"]
        settings = {**strategy["settings"], "evaluations": args.evaluations}
        changes["strategy"] = {**strategy, "settings": settings}
    if args.plugin:  # the workers load them too
        given = [str(Path(p).resolve()) if p.endswith(".py") else p for p in args.plugin]
        changes["plugins"] = [*experiment["plugins"], *(p for p in given if p not in experiment["plugins"])]
    if changes:
        experiment = Experiment({**experiment.data, **changes}, experiment.source)
    experiment.check_evaluator()
    run_dir = Path(experiment.run_dir)
    store = open_store(experiment, run_dir)
    strategy = experiment.strategy()
    history = store.history()
    if len(history) >= strategy.evaluations:
        store.close()
        if not args.quiet:
            print(f"{run_dir} is complete ({len(history)} evaluations)", file=sys.stderr)
            print(final_summary(run_dir))
        return 0 if succeeded(history) else 1
    done = len(history)
    progress = _Progress(strategy.evaluations, done, args.quiet)
    if not args.quiet:
        verb = "resuming" if done else "starting"
        print(
            f"{verb} {experiment['name']} in {run_dir} ({done} of {strategy.evaluations} done)",
            file=sys.stderr,
        )
    stop = {"requested": False}

    def on_signal(signum: int, frame: Any) -> None:
        if stop["requested"]:  # a second Ctrl-C: stop now (the store is consistent after every write)
            raise KeyboardInterrupt
        stop["requested"] = True
        print(
            "\nstopping: cancelling evaluations in flight (rerun to resume; Ctrl-C again to force)",
            file=sys.stderr,
            flush=True,
        )

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    executor = None
    try:
        executor = experiment.executor(args.ray_address)
        summary = run_search(
            experiment, executor, store, strategy, on_result=progress, should_stop=lambda: stop["requested"]
        )
    except KeyboardInterrupt:
        summary = None
    finally:
        progress.close()
        for s, handler in previous.items():
            signal.signal(s, handler)
        if executor is not None:
            executor.shutdown()
        store.close()
    if summary is None or not summary.finished:
        print(f"stopped; run `einspace search {args.experiment}` again to resume", file=sys.stderr)
        return 130
    if not args.quiet:
        per = 1000 * summary.driver_seconds / max(1, summary.evaluated + summary.cached + summary.replayed)
        print(
            f"done: {summary.evaluated} evaluated, {summary.cached} cached, {summary.failed} failed this "
            f"session; driver overhead {per:.1f} ms per result.",
            file=sys.stderr,
        )
        print(final_summary(run_dir))
    if _run_succeeded(run_dir):
        return 0
    if args.quiet:
        print(final_summary(run_dir), file=sys.stderr)
    return 1


def _run_succeeded(run_dir: Any) -> bool:
    """Whether any evaluation of the run has a fitness (a search where all failed exits 1)."""
    from einspace.search.report import open_run, succeeded

    store, _ = open_run(run_dir)
    try:
        return succeeded(store.history())
    finally:
        store.close()


def cmd_report(args: argparse.Namespace) -> int:
    from einspace.search.report import report

    print(report(args.run_dir, args.top, not args.no_plot, args.full))
    if args.html is not None:
        from einspace.search.html_report import write_html_report

        print(f"wrote {write_html_report(args.run_dir, args.html or None, args.top)}")
    return 0

"""`einspace search` and `einspace report`: the subcommands this package adds to the `einspace` command."""

from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from einspace.search.store import Record

if TYPE_CHECKING:
    from einspace.search.config import Experiment
    from einspace.search.loop import RunSummary, SearchRun
    from einspace.search.progress import SearchProgress


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
    search.add_argument(
        "--warm-start",
        nargs="+",
        default=None,
        metavar="RUN",
        help="start the surrogate from these runs' results (overrides the file's warm_start)",
    )
    search.add_argument("--quiet", action="store_true", help="no progress output")
    search.set_defaults(run=cmd_search)

    rep = sub.add_parser(
        "report",
        help="summarise a run: best architectures, compute, fitness.png, compute.png, evaluations.csv",
    )
    rep.add_argument("run_dir", help="the run directory (holds search.sqlite)")
    rep.add_argument("--top", type=int, default=5, help="how many of the best architectures to show")
    rep.add_argument("--no-plot", action="store_true", help="skip fitness.png and compute.png")
    rep.add_argument("--full", action="store_true", help="print each tree's full one-line text, not folded")
    rep.add_argument(
        "--html",
        nargs="?",
        const="",
        metavar="FILE",
        help="also write a self-contained HTML report with pictures (default FILE: RUN_DIR/report.html)",
    )
    add_trust_plugins(rep)
    rep.set_defaults(run=cmd_report)

    from einspace.search import learn

    learn.add_command(sub)  # learn-probabilities


class _StopOnSignal:
    """While installed, SIGINT and SIGTERM ask the search to stop (it cancels what is in flight);
    a second one stops at once. Called, it says whether a stop was asked for."""

    def __init__(self) -> None:
        self.requested = False
        self._previous = {s: signal.signal(s, self._on_signal) for s in (signal.SIGINT, signal.SIGTERM)}

    def _on_signal(self, signum: int, frame: Any) -> None:
        if self.requested:  # a second Ctrl-C: stop now (the store is consistent after every write)
            raise KeyboardInterrupt
        self.requested = True
        print(
            "\nstopping: cancelling evaluations in flight (rerun to resume; Ctrl-C again to force)",
            file=sys.stderr,
            flush=True,
        )

    def __call__(self) -> bool:
        return self.requested

    def restore(self) -> None:
        for s, handler in self._previous.items():
            signal.signal(s, handler)


def add_trust_plugins(parser: argparse.ArgumentParser) -> None:
    """The consent a command reading a run directory needs before it imports the run's plugins."""
    parser.add_argument(
        "--trust-plugins",
        action="store_true",
        help="import the plugins the run was searched with (this runs their code: only for runs you trust)",
    )


def cmd_search(args: argparse.Namespace) -> int:
    from einspace.search.config import load_experiment
    from einspace.search.loop import SearchRun
    from einspace.search.progress import SearchProgress

    experiment = _with_options(load_experiment(args.experiment), args)
    experiment.check_evaluator()
    experiment.check_executor()
    experiment.check_tracking()
    with SearchRun.start(experiment) as run:
        budget, complete = run.strategy.evaluations, run.strategy.done
        if not complete:
            start = run.store.tally()  # summed by the store: a resumed run is not read record by record
            progress = SearchProgress(budget, start, args.quiet)
            if not args.quiet:
                verb = "resuming" if start.ids else "starting"
                where = f"{experiment.name} in {run.directory} ({progress.done} of {budget} done)"
                print(f"{verb} {where}", file=sys.stderr)
            summary = _search(run, experiment, args.ray_address, progress)
        history = run.store.history()
    if complete:
        if not args.quiet:
            print(f"{run.directory} is complete ({len(history)} evaluations)", file=sys.stderr)
        return _conclude(run.directory, history, args.quiet)
    if summary is None or not summary.finished:
        print(f"stopped; run `einspace search {args.experiment}` again to resume", file=sys.stderr)
        return 130
    if not args.quiet:
        per = 1000 * summary.driver_seconds / max(1, summary.results)
        print(
            f"done: {summary.evaluated} evaluated, {summary.cached} cached, {summary.failed} failed this "
            f"session; driver overhead {per:.1f} ms per result.",
            file=sys.stderr,
        )
    return _conclude(run.directory, history, args.quiet)


def _with_options(experiment: Experiment, args: argparse.Namespace) -> Experiment:
    """The experiment with the command line's --run-dir, --evaluations, --plugin and --warm-start
    applied."""
    from dataclasses import replace

    from einspace.errors import EinspaceError
    from einspace.search.config import ConfigError
    from einspace.search.warm_start import check_warm_start

    if args.run_dir:
        experiment = replace(experiment, run_dir=args.run_dir)
    if args.evaluations is not None:
        experiment = replace(experiment, strategy=experiment.strategy.with_evaluations(args.evaluations))
    if args.plugin:  # the workers load them too
        given = [str(Path(p).resolve()) if p.endswith(".py") else p for p in args.plugin]
        plugins = (*experiment.plugins, *(p for p in given if p not in experiment.plugins))
        experiment = replace(experiment, plugins=plugins)
    if args.warm_start is not None:
        experiment = replace(experiment, warm_start=tuple(str(Path(r).resolve()) for r in args.warm_start))
        try:
            check_warm_start(experiment, experiment.make_strategy())
        except EinspaceError as exc:
            raise ConfigError(f"--warm-start: {exc}") from None
    return experiment


def _search(
    run: SearchRun, experiment: Experiment, ray_address: str | None, progress: SearchProgress
) -> RunSummary | None:
    """Search until done or stopped by a signal; None when forced to stop by a second one. The
    executor is shut down whatever happens."""
    stop = _StopOnSignal()
    executor = None
    try:
        executor = experiment.make_executor(ray_address)
        progress.executor = executor
        return run.run(executor, on_result=progress, should_stop=stop)
    except KeyboardInterrupt:
        return None
    finally:
        progress.close()
        stop.restore()
        if executor is not None:
            executor.shutdown()


def _conclude(run_dir: Path, history: list[Record], quiet: bool) -> int:
    """After a search: print the run's summary (when quiet, to stderr and only if it failed); exit
    status 0 if any evaluation of the run has a fitness, else 1 (a search where all failed)."""
    from einspace.search.report import final_summary, succeeded

    ok = succeeded(history)
    if not quiet:
        print(final_summary(run_dir))
    elif not ok:
        print(final_summary(run_dir), file=sys.stderr)
    return 0 if ok else 1


def cmd_report(args: argparse.Namespace) -> int:
    from einspace.outputs import writable
    from einspace.search.report import report

    if args.html:
        writable(args.html)  # before the report is printed
    print(report(args.run_dir, args.top, not args.no_plot, args.full, args.trust_plugins))
    if args.html is not None:
        from einspace.search.html_report import write_html_report

        print(f"wrote {write_html_report(args.run_dir, args.html or None, args.top, args.trust_plugins)}")
    return 0

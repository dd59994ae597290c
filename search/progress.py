"""The progress display of `einspace search`, drawn with rich: a live bar on a terminal; on anything
else (CI logs, captured output, a notebook) plain lines, one every 5% of the budget and one at the
end, with no control characters.

rich rather than tqdm: its Console decides once whether the stream is a terminal (and handles
Jupyter, NO_COLOR and TERM=dumb), and writes no escape codes to one that is not, while tqdm writes
carriage returns to any stream; and its bar takes our own fields, the ETA included, as columns.

Each line counts the whole run: what the store held when the search started, then each result told,
once (a result replayed on resume is already in the store). The ETA comes from the compute
accounting: the evaluations left times the run's mean compute per evaluation, over the compute this
session gets through per second of wall time (before its first result: the executor's slots).
"""

from __future__ import annotations

import sys
import time
from datetime import timedelta
from typing import IO, TYPE_CHECKING

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn
from rich.table import Column

from einspace.search.compute import Tally, compute_of, incumbent
from einspace.search.store import Record

if TYPE_CHECKING:
    from einspace.search.executors import Executor
    from einspace.search.strategy import Strategy

__all__ = ["SearchProgress"]


class SearchProgress:
    """Called with each result the strategy is told (the loop's `on_result`); `close` ends the
    display. `executor`, once set, says how many evaluations are in flight."""

    def __init__(self, budget: int, start: Tally, quiet: bool, stream: IO[str] | None = None):
        """`start`: what the store held when the search started (`Store.tally`)."""
        self.budget, self.quiet = budget, quiet
        self.console = Console(file=stream or sys.stderr, highlight=False)
        self.live = self.console.is_terminal
        self.executor: Executor | None = None
        self.counted: set[int] = set()
        self.done = self.promoted = self.failed = self.cached = 0
        self.compute = self.wasted = 0.0
        self.session_compute = 0.0
        self.best: Record | None = None
        self._add(start)
        self.started = time.monotonic()
        self.session = 0
        self.every = max(1, budget // 20)
        self.bar: Progress | None = None
        if self.live and not quiet:
            self.bar = Progress(
                BarColumn(bar_width=30),
                MofNCompleteColumn(),
                TextColumn("{task.fields[info]}", table_column=Column(overflow="fold")),  # narrow: wraps
                console=self.console,
            )
            self.task = self.bar.add_task("search", total=budget, completed=self.done, info=self.fields())
            self.bar.start()

    def _add(self, tally: Tally) -> None:
        self.counted |= tally.ids
        self.promoted += tally.promoted
        self.done += tally.done  # architectures, as the budget counts them
        self.failed += tally.failed
        self.cached += tally.cached
        self.compute += tally.compute
        self.wasted += tally.wasted
        self.best = incumbent([r for r in (self.best, tally.best) if r is not None])  # ties: the earlier

    def __call__(self, record: Record, strategy: Strategy) -> None:
        if record.id not in self.counted:  # not a result replayed on resume (already in the store)
            self.session_compute += compute_of(record)
            self._add(Tally.of([record]))
        self.session += 1
        if self.quiet:
            return
        if self.bar is not None:
            self.bar.update(self.task, completed=self.done, info=self.fields())
        elif len(self.counted) % self.every == 0 or strategy.done:
            self.console.print(f"{self.done}/{self.budget} {self.fields()}", soft_wrap=True, markup=False)

    def rate(self) -> float:
        """Results per second of wall time, this session."""
        return self.session / max(1e-9, time.monotonic() - self.started)

    def eta(self) -> float | None:
        """Seconds until the budget is spent, from the compute accounting (None: nothing to go on)."""
        left = max(0, self.budget - self.done)
        if left == 0:
            return 0.0
        if not self.done:
            return None
        per_evaluation = self.compute / self.done
        elapsed = time.monotonic() - self.started
        if self.session_compute > 0 and elapsed > 0:
            throughput = self.session_compute / elapsed  # compute seconds per wall second
        elif self.session == 0:
            throughput = float(self.executor.max_in_flight if self.executor else 1)
        else:
            throughput = 0.0
        if per_evaluation > 0 and throughput > 0:
            return left * per_evaluation / throughput
        rate = self.rate()
        return left / rate if self.session and rate > 0 else None

    def fields(self) -> str:
        """What each line says after `done/budget`."""
        in_flight = self.executor.in_flight if self.executor is not None else 0
        promoted = f" +{self.promoted} promoted" if self.promoted else ""
        best = f"{self.best.fitness:.5g}" if self.best and self.best.fitness is not None else "-"
        share = self.wasted / self.compute if self.compute else 0.0
        eta = self.eta()
        when = "?" if eta is None else str(timedelta(seconds=round(eta)))
        return (
            f"done{promoted}  in flight {in_flight}  failed {self.failed}  cached {self.cached}  "
            f"best {best}  compute {self.compute:.1f} s (wasted {share:.1%})  "
            f"{self.rate():.2f} eval/s  ETA {when}"
        )

    def close(self) -> None:
        if self.bar is not None:
            self.bar.update(self.task, completed=self.done, info=self.fields())
            self.bar.stop()

"""The progress display of `einspace search`: a live bar on a terminal, plain lines without control
characters elsewhere, the same fields in both; the ETA from the compute accounting; --quiet."""

from __future__ import annotations

import io
import re
from types import SimpleNamespace

import yaml
from search_helpers import BASE, experiment, merge

from einspace.cli import main
from einspace.evaluators.base import Cost
from einspace.search.compute import Tally
from einspace.search.loop import SearchRun
from einspace.search.progress import SearchProgress
from einspace.search.store import Record

FIELDS = ("done", "in flight", "failed", "cached", "best", "compute", "eval/s", "ETA")


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def _search(tmp_path, stream: io.StringIO) -> list[Record]:
    """A search of 40 evaluations, two at once, shown on `stream`; its history."""
    e = experiment(tmp_path, seeds=["resnet18", "resnet18"], executor={"max_in_flight": 2})
    with SearchRun.start(e) as run:
        progress = SearchProgress(run.strategy.evaluations, run.store.tally(), False, stream)
        executor = e.make_executor()
        progress.executor = executor
        try:
            assert run.run(executor, on_result=progress).finished
            return run.store.history()
        finally:
            progress.close()
            executor.shutdown()


def test_a_non_terminal_gets_plain_periodic_lines_with_every_field(tmp_path):
    stream = io.StringIO()
    history = _search(tmp_path, stream)
    text = stream.getvalue()
    assert "\x1b" not in text and "\r" not in text  # no escape codes, no carriage returns
    lines = text.splitlines()
    assert 20 <= len(lines) <= 21  # one every 5% of 40 evaluations (and the last)
    assert all(field in line for line in lines for field in FIELDS)
    assert lines[0].startswith("2/40 done") and lines[-1].startswith("40/40 done")
    cached = sum(r.status == "cached" for r in history)
    assert "ETA 0:00:00" in lines[-1] and f"failed 0  cached {cached}  " in lines[-1]
    assert re.search(r"in flight [0-2] ", lines[5])


def test_a_terminal_gets_a_live_bar_with_the_same_fields(tmp_path, monkeypatch):
    monkeypatch.setenv("COLUMNS", "250")  # wide enough for one line
    stream = _Terminal()
    _search(tmp_path, stream)
    text = stream.getvalue()
    assert "\x1b[" in text  # drawn in place
    final = re.sub(r"\x1b\[[0-9;?]*[a-zA-Z]", "", text).replace("\r", "\n").strip().splitlines()[-1]
    assert "40/40 done" in final and all(field in final for field in FIELDS)


def _spent(id: int, seconds: float) -> Record:
    cost = Cost(cpu_seconds=seconds, wall_seconds=seconds).to_json()
    return Record(id, f"(S t{id})", f"h{id}", "sampled", status="ok", fitness=0.5, cost=cost)


def test_the_eta_is_the_evaluations_left_at_the_runs_compute_per_evaluation(monkeypatch):
    clock = SimpleNamespace(now=100.0)
    monkeypatch.setattr("einspace.search.progress.time.monotonic", lambda: clock.now)
    progress = SearchProgress(10, Tally.of([_spent(0, 10.0), _spent(1, 10.0)]), quiet=True)  # resumed: 2 done
    progress.executor = SimpleNamespace(max_in_flight=4, in_flight=4)
    assert progress.eta() == 8 * 10.0 / 4  # before a result of its own: the executor's slots
    clock.now += 5.0
    progress(_spent(2, 10.0), SimpleNamespace(done=False))  # 10 compute seconds in 5 s: 2 at once
    assert progress.eta() == 7 * 10.0 / 2
    assert "in flight 4" in progress.fields() and "ETA 0:00:35" in progress.fields()


def test_quiet_is_quiet(tmp_path, capsys):
    raw = merge(BASE, {"run_dir": str(tmp_path / "run")})
    raw["strategy"]["settings"]["evaluations"] = 12
    (tmp_path / "exp.yaml").write_text(yaml.safe_dump(raw))
    assert main(["search", str(tmp_path / "exp.yaml"), "--quiet"]) == 0
    assert capsys.readouterr() == ("", "")
    assert main(["search", str(tmp_path / "exp.yaml"), "--evaluations", "16"]) == 0  # captured: not a tty
    err = capsys.readouterr().err
    assert "\x1b" not in err and "16/16 done" in err

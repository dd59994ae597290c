"""What keeps a long search as fast at its 100,000th result as at its first (benchmarks/scale.py
measures it): the driver's store queries find rows through an index, never by scanning the
history; the strategy's state is bounded by its population. And how a run spread over a Ray
cluster is reported: evaluations per node."""

from __future__ import annotations

import csv
import sqlite3

from search_helpers import experiment

from einspace.search.loop import STORE_NAME, SearchRun
from einspace.search.report import node_counts, report
from einspace.search.store import Record, SQLiteStore, Store


def _plan(db: sqlite3.Connection, statement: str) -> str:
    return " | ".join(row[3] for row in db.execute(f"EXPLAIN QUERY PLAN {statement}"))


def test_the_loop_never_scans_the_history_per_result(tmp_path):
    """Every query the loop makes while searching (submit, cache look-up, finish, checkpoint) is an
    index search: its cost grows with log(history), not with history. Checked with SQLite's own
    query plans, so a per-result `history()` or an unindexed look-up fails here at once."""
    e = experiment(tmp_path, strategy={"settings": {"evaluations": 30, "population": 10, "tournament": 3}})
    statements: list[str] = []
    with SearchRun.start(e) as run:
        run.store._db.set_trace_callback(statements.append)  # type: ignore[attr-defined]
        summary = run.run(e.make_executor())
        run.store._db.set_trace_callback(None)  # type: ignore[attr-defined]
        queries = {s for s in statements if s.lstrip().upper().startswith("SELECT") and "evaluations" in s}
        assert summary.finished and summary.results == 30
        assert {"find_hash", "finish", "get"} <= {_kind(q) for q in queries}  # what was checked ran
        plans = {q: _plan(run.store._db, q) for q in queries}  # type: ignore[attr-defined]
        assert not [(q, p) for q, p in plans.items() if "SCAN evaluations" in p]
        # the strategy keeps its population, not its history: 30 told, 10 kept (trees parsed included)
        state = run.store.load_checkpoint()
        assert len(state["population"]) == 10 and len(run.strategy._trees) <= 10 + len(state["pending"])


def _kind(query: str) -> str:
    """Which store method issued a query (by its WHERE clause)."""
    if "MAX(seq)" in query:
        return "finish"
    if "hash = " in query:
        return "find_hash"
    return "get" if "id = " in query else "other"


def test_a_history_read_is_a_scan_so_the_check_above_can_fail(tmp_path):
    """The check's own control: `history()`, which a per-result loop must not call, scans."""
    store = SQLiteStore(tmp_path / STORE_NAME, writer=True)
    statements: list[str] = []
    store._db.set_trace_callback(statements.append)
    store.history()
    assert "SCAN evaluations" in _plan(store._db, statements[-1])
    store.close()


def _record(id: int, node: str | None, status: str = "ok") -> Record:
    return Record(id, f"(S t{id})", f"h{id}", "sampled", status=status, fitness=0.5, node=node)


def test_report_counts_evaluations_per_ray_node(tmp_path):
    """Each node's evaluations, most first; cached copies and in-process evaluations ran on none.
    The CSV has the full node id."""
    a, b = "a" * 56, "b" * 56
    records = [_record(0, a), _record(1, b), _record(2, a), _record(3, None, "cached"), _record(4, a)]
    store = SQLiteStore(tmp_path / STORE_NAME, writer=True)
    store.set_meta("config", "{}")
    for r in records:
        store.submit(r)
        store.finish(r)
    store.close()
    assert node_counts(records) == [(a, 3), (b, 1)]
    assert "evaluations per Ray node: aaaaaaaaaaaa 3, bbbbbbbbbbbb 1\n" in report(tmp_path, plot=False)
    with (tmp_path / "evaluations.csv").open() as f:
        assert [row["node"] for row in csv.DictReader(f)] == [a, b, a, "", a]


def test_a_run_without_ray_reports_no_nodes(tmp_path):
    assert node_counts([_record(0, None), _record(1, None)]) == []
    store = SQLiteStore(tmp_path / STORE_NAME, writer=True)
    store.set_meta("config", "{}")
    store.finish(_record(0, None))
    store.close()
    assert "per Ray node" not in report(tmp_path, plot=False)


def test_counting_finished_records_agrees_with_reading_them(tmp_path):
    """Resuming counts the run's finished evaluations (promotions left out, as a budget counts)
    with one COUNT, and gets what reading the whole history gives (the contract's default)."""
    store = SQLiteStore(tmp_path / STORE_NAME, writer=True)
    store.finish(_record(0, None))
    store.finish(Record(1, "(S t0)", "h0", "promotion", (0,), status="ok", fitness=0.6, fidelity=3))
    store.submit(_record(2, None))  # running: not finished
    store.finish(_record(3, None, "cached"))
    assert store.count_finished() == Store.count_finished(store) == 3
    assert store.count_finished("promotion") == Store.count_finished(store, "promotion") == 2
    store.close()

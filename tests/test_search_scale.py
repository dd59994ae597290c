"""What keeps a long search as fast at its 100,000th result as at its first (benchmarks/scale.py
measures it): the driver's store queries find rows through an index, never by scanning the
history; the strategy's state is bounded by its population. And how a run spread over a Ray
cluster is reported: evaluations per node."""

from __future__ import annotations

import csv
import io
import itertools
import math
import random
import sqlite3
import subprocess
import sys
from dataclasses import fields, replace

import pytest
from search_helpers import experiment

from einspace.evaluators.base import Cost
from einspace.search.compute import Tally
from einspace.search.loop import STORE_NAME, SearchRun
from einspace.search.report import fitness_series, node_counts, report, step_points
from einspace.search.store import Record, SQLiteStore, State, Status, Store


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


# ---------------------------------------------------------------- reading and reporting 100,000 results


def _varied_records() -> list[Record]:
    """Finished records exercising every column: parents, metrics, a measured cost or none, an
    error, a cached copy, a fidelity, a partial result, a node."""
    cost = Cost(cpu_seconds=2.0, gpu_seconds=0.5, wall_seconds=3.0, epochs=1.5, steps=7).to_json()
    times = {"submitted_at": 10.0, "finished_at": 12.5}
    return [
        Record(0, "(S t0)", "h0", "sampled", status=Status.OK, fitness=0.25, metrics={"acc": 0.5}, cost=cost,
               seconds=3.0, worker="w1", **times),  # fmt: skip
        Record(1, "(S t1)", "h1", "mutation", (0,), status=Status.FAILED, fitness=float("-inf"),
               error="boom\nat line 2", seconds=1.0, **times),  # fmt: skip
        Record(2, "(S t0)", "h0", "crossover", (0, 1), status=Status.CACHED, fitness=0.25, cached_from=0,
               metrics={"acc": 0.5}, seconds=0.0, **times),  # fmt: skip
        Record(3, "(S t3)", "h3", "promotion", (0,), status=Status.OK, fitness=0.75, fidelity=4, partial=True,
               cost=Cost(cpu_seconds=1.25).to_json(), node="n" * 56, **times),  # fmt: skip
    ]


def test_history_reads_back_every_field_of_every_record(tmp_path):
    """`history()` builds records without the dataclass's __init__ (a third of reading 100,000):
    each must still equal the record finished, every field set, its cost parsed on demand."""
    store = SQLiteStore(tmp_path / STORE_NAME, writer=True)
    records = _varied_records()
    for r in records:
        store.finish(r)
    history = store.history()
    store.close()
    assert history == [replace(r, state=State.FINISHED, seq=i + 1) for i, r in enumerate(records)]
    assert all(vars(h).keys() >= {f.name for f in fields(Record)} for h in history)
    assert [h.measured for h in history] == [Cost.from_json(r.cost) if r.cost else None for r in records]


def test_a_stored_cost_parses_as_the_slow_path_would():
    """`Cost.from_json`'s fast path (a cost as `to_json` wrote it) and its general one agree;
    unknown keys are dropped and missing or null ones take their defaults."""
    cost = Cost(cpu_seconds=2.0, gpu_seconds=0.5, wall_seconds=3.0, epochs=1.5, steps=7)
    assert Cost.from_json(cost.to_json()) == cost
    assert Cost.from_json({**cost.to_json(), "newer": 1.0}) == cost
    assert Cost.from_json({**cost.to_json(), "steps": None}) == replace(cost, steps=0)
    assert Cost.from_json({"cpu_seconds": 2.0}) == Cost(cpu_seconds=2.0)
    assert Cost.from_json(None) == Cost()


def test_the_csv_has_each_records_fields_under_their_column_names(tmp_path):
    """evaluations.csv, written a row tuple at a time, against the file written one column at a
    time by name (what the row builder replaced): byte for byte."""
    import json

    from einspace.search.compute import compute_of
    from einspace.search.report import _CSV_COLUMNS, write_csv

    def cell(r: Record, column: str) -> object:
        if column == "parents":
            return " ".join(map(str, r.parents))
        if column == "metrics":
            return json.dumps(r.metrics)
        if column == "compute_seconds":
            return compute_of(r)
        if column in Cost.__dataclass_fields__:
            return "" if r.measured is None else getattr(r.measured, column)
        return getattr(r, column)

    store = SQLiteStore(tmp_path / STORE_NAME, writer=True)
    for r in _varied_records():
        store.finish(r)
    history = store.history()
    store.close()
    write_csv(history, tmp_path / "evaluations.csv")
    expected = io.StringIO(newline="")
    writer = csv.writer(expected)
    writer.writerow(_CSV_COLUMNS)
    writer.writerows([cell(r, column) for column in _CSV_COLUMNS] for r in history)
    assert (tmp_path / "evaluations.csv").read_bytes() == expected.getvalue().encode()
    with (tmp_path / "evaluations.csv").open(newline="") as f:
        row = next(csv.DictReader(f))
    cells = [row[c] for c in ("status", "compute_seconds", "gpu_seconds", "steps")]
    assert cells == ["ok", "0.5", "0.5", "7"]


def _step_value(xs: list[float], ys: list[float], x: float) -> float:
    """A post-step curve's value at x: the y of the last point at or before it."""
    return ys[max(i for i in range(len(xs)) if xs[i] <= x)]


def test_a_step_curve_keeps_only_its_changes_and_its_end():
    assert step_points([1, 2, 3, 4, 5, 6], [1, 1, 2, 2, 2, 3]) == ([1, 3, 6], [1, 2, 3])
    assert step_points([1, 2, 3], [5, 5, 5]) == ([1, 3], [5, 5])  # the end: the line's extent
    assert step_points([7], [1]) == ([7], [1]) and step_points([], []) == ([], [])
    rng = random.Random(0)
    xs = sorted(rng.sample(range(10_000), 500))
    ys = list(itertools.accumulate((rng.choice([0.0, 0.0, 0.0, rng.random()]) for _ in xs), max))
    kept = step_points(xs, ys)
    assert len(kept[0]) < len(xs) / 4
    assert all(_step_value(*kept, x) == y for x, y in zip(xs, ys, strict=True))


def test_the_fitness_plot_draws_every_scored_result_the_best_so_far_and_the_failures():
    """What fitness.png draws, against a plain loop: scored results only (no failure, no
    missing or infinite fitness), the running best as its change points, failures at the lowest."""
    scores = [0.2, None, 0.1, 0.5, float("inf"), 0.5, 0.4, 0.9, 0.3]
    history = [
        Record(i, "(S t)", f"h{i}", "sampled", status=Status.OK if f is not None else Status.FAILED,
               fitness=f, seq=i + 1)  # fmt: skip
        for i, f in enumerate(scores)
    ]
    series = fitness_series(history)
    assert series["evaluation"] == ([1, 3, 4, 6, 7, 8, 9], [0.2, 0.1, 0.5, 0.5, 0.4, 0.9, 0.3])
    best, running = [], -math.inf
    for f in series["evaluation"][1]:
        running = max(running, f)
        best.append(running)
    assert series["best so far"] == step_points(series["evaluation"][0], best)
    assert series["best so far"] == ([1, 4, 8, 9], [0.2, 0.5, 0.9, 0.9])
    assert series["failed"] == ([2], [0.1])


def test_the_report_command_imports_neither_torch_nor_networkx(tmp_path):
    """Seconds of every `einspace report` (and of every command line) went to importing torch and
    networkx, which a report that trains and draws no graph never uses."""
    store = SQLiteStore(tmp_path / STORE_NAME, writer=True)
    store.set_meta("config", "{}")
    store.finish(_record(0, None))
    store.close()
    code = (
        "import sys\nfrom einspace.cli import main\n"
        f"assert main(['report', {str(tmp_path)!r}, '--no-plot']) == 0\n"
        "print(sorted(m for m in ('torch', 'networkx') if m in sys.modules))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.splitlines()[-1] == "[]"


def test_the_store_sums_a_run_for_the_progress_display_as_reading_it_would(tmp_path):
    """A resumed search's progress starts from `tally()`, summed in SQL: the same counts, compute
    (a cost's GPU, else CPU, else wall seconds; the seconds without a cost; nothing when cached),
    waste and incumbent (the top fidelity first; ties: the earlier) as the records read one by one."""
    gpu, wall = Cost(cpu_seconds=4.0, gpu_seconds=1.5).to_json(), Cost(wall_seconds=2.5).to_json()
    extra = [
        Record(4, "(S t4)", "h4", "sampled", status=Status.OK, fitness=0.75, seconds=6.0),  # no cost
        Record(5, "(S t5)", "h5", "sampled", status=Status.FAILED, fitness=float("-inf"), cost=gpu),
        Record(6, "(S t6)", "h6", "sampled", status=Status.OK, fitness=float("inf"), cost=wall),  # not finite
        Record(7, "(S t7)", "h7", "promotion", (3,), status=Status.OK, fitness=0.5, fidelity=8, cost=wall),
        Record(8, "(S t8)", "h8", "sampled", status=Status.OK, fitness=0.5, fidelity=8, cost=gpu),  # a tie
    ]
    store = SQLiteStore(tmp_path / STORE_NAME, writer=True)
    assert store.tally() == Store.tally(store) == Tally(best=None)
    for r in [*_varied_records(), *extra]:
        store.finish(r)
    store.submit(Record(9, "(S t9)", "h9", "sampled"))  # running: not counted
    fast, slow = store.tally(), Store.tally(store)
    store.close()
    assert replace(fast, compute=0.0, wasted=0.0) == replace(slow, compute=0.0, wasted=0.0)
    assert (fast.compute, fast.wasted) == (pytest.approx(slow.compute), pytest.approx(slow.wasted))
    spent = [0.5, 1.0, 0.0, 1.25, 6.0, 1.5, 2.5, 2.5, 1.5]  # by hand, record by record
    assert (fast.compute, fast.wasted) == (pytest.approx(sum(spent)), 2.5)
    assert fast.best is not None and fast.best.id == 4  # fidelity None (the evaluator's own) is the top
    assert (fast.done, fast.promoted, fast.failed, fast.cached, fast.ids) == (7, 2, 2, 1, set(range(9)))
    ranked = SQLiteStore(tmp_path / "ranked.sqlite", writer=True)  # fidelity 8 beats 4; ties: the earlier
    for r in (
        replace(extra[3], id=1, fitness=0.9, fidelity=4),
        replace(extra[3], id=2),
        replace(extra[4], id=3),
    ):
        ranked.finish(r)
    assert ranked.tally().best.id == Store.tally(ranked).best.id == 2  # type: ignore[union-attr]
    ranked.close()

"""`einspace report` reads the history as columns (`einspace.search.columns`), in one query, and
builds no record per row: the columns, the CSV and the report text must be what the records give
(a store built by hand with every kind of row), and the query count must stay one."""

from __future__ import annotations

import csv
import gc
import io
import json
import math
import sqlite3
from pathlib import Path

import pytest

from einspace.evaluators.base import Cost
from einspace.search import report as report_module
from einspace.search.columns import FIELDS, Columns
from einspace.search.compute import best_so_far, summarise
from einspace.search.loop import STORE_NAME
from einspace.search.report import best_records, failure_reasons, node_counts, report, write_csv
from einspace.search.store import Record, SQLiteStore


def _rows() -> list[Record]:
    """Every kind of finished row a report meets: ok, failed, cached; no parents, one, two; no
    cost, a cost with a key this einspace does not know, a GPU cost, whole-number costs; metrics
    with ints, NaN, infinity, non-ASCII and nested names; fidelities, a partial result, Ray nodes;
    ties in fitness between trees (the top is ranked by fidelity, then fitness, then id)."""
    cpu = Cost(cpu_seconds=1.25, wall_seconds=2.5, epochs=1.0, steps=10).to_json()
    return [
        Record(0, "(S a)", "ha", "sampled", status="ok", fitness=0.5, cost=cpu, node="n1", seconds=2.5),
        Record(1, "(S b, c)", "hb", "mutation", (0,), status="failed", fitness=-math.inf, error="boom\nmore",
               cost=cpu),
        Record(2, "(S a)", "ha", "mutation", (1,), status="cached", fitness=0.5, cached_from=0, seconds=0.0),
        Record(3, 'say "x"', "hc", "crossover", (0, 2), status="ok", fitness=0.75, fidelity=3, partial=True,
               metrics={"acc": 0.75, "n": 3, "bad": math.nan, "big": math.inf, "é/x": 1.0}, node="n2",
               cost={**cpu, "joules": 7.0}),
        Record(4, "(S d)", "hd", "promotion", (3,), status="ok", fitness=0.75, fidelity=3, seconds=4.0,
               metrics={"continued_from_epoch": 1},
               cost={"gpu_seconds": 3, "cpu_seconds": 2, "wall_seconds": 5}),
        Record(5, "(S e)", "he", "seed:resnet", status="ok", fitness=0.9, metrics={"inherited_share": 0.5},
               cost=Cost(gpu_seconds=0.5, cpu_seconds=1.0, wall_seconds=1.5).to_json(), node="n1"),
        Record(6, "(S f)", "hf", "sampled", status="failed", fitness=-math.inf, error=None, seconds=1.0),
    ]  # fmt: skip


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    store = SQLiteStore(tmp_path / STORE_NAME, writer=True)
    store.set_meta("config", "{}")
    for r in _rows():
        store.submit(r)
        store.finish(r)
    store.submit(Record(7, "(S g)", "hg", "sampled"))  # running at the last stop: not in the history
    store.close()
    return tmp_path


def _reference_csv(history: list[Record]) -> str:
    """evaluations.csv as it was written a record at a time (before the columns)."""
    out = io.StringIO(newline="")
    writer = csv.writer(out)
    writer.writerow(report_module._CSV_COLUMNS)
    for r in history:
        m = Cost.from_json(r.cost) if r.cost else None
        compute = 0.0 if r.status == "cached" else (r.seconds or 0.0) if m is None else m.compute_seconds
        cost = ("", "", "", "") if m is None else (m.cpu_seconds, m.gpu_seconds, m.epochs, m.steps)
        writer.writerow(
            (r.seq, r.id, r.status, r.fitness, r.origin, " ".join(map(str, r.parents)), r.cached_from, r.hash)
            + (r.seconds, r.fidelity, r.partial, compute, *cost, r.worker, r.node, r.error)
            + (json.dumps(r.metrics), r.tree)
        )
    return out.getvalue()


def test_columns_read_from_the_store_are_the_records_columns_and_give_back_its_records(run_dir):
    store = SQLiteStore(run_dir / STORE_NAME)
    history, columns = store.history(), store.columns()
    store.close()
    assert len(columns) == len(history) == 7
    made = Columns.of(history)
    for name in FIELDS:
        if name not in ("metrics", "cost"):  # JSON text: compared parsed (NaN is not equal to itself)
            assert getattr(columns, name) == getattr(made, name), name
    assert [columns.metrics_of(i).keys() for i in range(7)] == [r.metrics.keys() for r in history]
    costs = [Cost.from_json(r.cost) if r.cost else None for r in history]
    assert columns.measures == [None if m is None else m.measure for m in costs]
    assert columns.measures == ["CPU", "CPU", None, "CPU", "GPU", "GPU", None]
    assert columns.compute == [1.25, 1.25, 0.0, 1.25, 3, 0.5, 1.0]  # a cached copy is free; no cost: seconds
    for name in ("cpu_seconds", "gpu_seconds", "epochs", "steps"):
        expected = ["" if m is None else repr(getattr(m, name)) for m in costs]
        assert list(map(str, columns.cost_field(name))) == expected
    assert columns.parent_ids == ["", "0", "1", "0 2", "3", "", ""]
    for i, r in enumerate(history):
        record = columns.record(i)
        assert (record.id, record.parents, record.cost, record.status, record.partial) == (
            r.id, r.parents, r.cost, r.status, r.partial,
        )  # fmt: skip
        assert json.dumps(record.metrics) == json.dumps(r.metrics)
        if not any(isinstance(v, float) and math.isnan(v) for v in r.metrics.values()):
            assert record == r  # every field, submission and finishing times included
    assert columns.having("inherited_share") == [5]
    assert columns.having("continued_from_epoch") == [4]
    assert columns.having("acc") == [3] and columns.having("x") == []  # "é/x" holds x, is not it


def test_csv_from_the_columns_is_byte_for_byte_the_records_csv(run_dir, tmp_path):
    store = SQLiteStore(run_dir / STORE_NAME)
    history, columns = store.history(), store.columns()
    store.close()
    write_csv(columns, tmp_path / "columns.csv")
    write_csv(history, tmp_path / "records.csv")
    expected = _reference_csv(history).encode()
    assert (tmp_path / "columns.csv").read_bytes() == expected
    assert (tmp_path / "records.csv").read_bytes() == expected
    assert b'"say ""x"""' in expected and b"NaN" in expected and b"Infinity" in expected


def test_summaries_from_the_columns_match_a_walk_over_the_records(run_dir):
    store = SQLiteStore(run_dir / STORE_NAME)
    history, columns = store.history(), store.columns()
    store.close()
    # by hand: compute 1.25, 1.25 (failed), 0 (cached), 1.25, 3 (GPU), 0.5 (GPU), 1.0 (seconds)
    steps = [1.25, 2.5, 2.5, 3.75, 6.75, 7.25, 8.25]
    assert [x for x, _ in best_so_far(columns)] == steps
    # the incumbent: fidelity None is the top level, so 0.5 (row 0) and then 0.9 (row 5)
    assert [y for _, y in best_so_far(columns)] == [0.5, 0.5, 0.5, 0.5, 0.5, 0.9, 0.9]
    s = summarise(columns)
    assert (s.total, s.wasted, s.incumbent_at) == (8.25, 2.25, 7.25)
    assert (s.partial, s.promoted, s.continued) == (1, 1, 1)
    assert s.by_fidelity == {None: (4, 4.0), 3: (2, 4.25)}  # cached copies are not evaluations
    assert summarise(history) == s
    assert [r.id for r in best_records(columns, 10)] == [5, 0, 3, 4]  # 2 is a cached copy of 0
    assert [r.id for r in best_records(columns, 2)] == [5, 0] and best_records(columns, 0) == []
    assert failure_reasons(columns) == [("boom", 1), ("?", 1)]
    assert node_counts(columns) == [("n1", 2), ("n2", 1)]


def test_report_reads_the_history_in_one_query_and_makes_no_record_per_row(run_dir, monkeypatch):
    statements: list[str] = []
    connect = sqlite3.connect

    def traced(*args, **kwargs):
        db = connect(*args, **kwargs)
        db.set_trace_callback(statements.append)
        return db

    def refused(self):
        raise AssertionError("the report read the history as records")

    monkeypatch.setattr(sqlite3, "connect", traced)
    monkeypatch.setattr(SQLiteStore, "history", refused)
    text = report(run_dir, plot=False)
    finished = [s for s in statements if "FROM evaluations" in s and "'finished'" in s]
    assert len(finished) == 1, finished
    assert (
        "finished 6 of ? architectures and 1 promotions (ok 4, failed 2, cached duplicates 1); "
        "running/queued at last stop: 1"
    ) in text
    monkeypatch.undo()
    written = (run_dir / "evaluations.csv").read_bytes()
    store = SQLiteStore(run_dir / STORE_NAME)
    assert written == _reference_csv(store.history()).encode()
    store.close()


def test_the_report_text_is_the_same_from_the_columns_as_from_the_records(run_dir, monkeypatch):
    from_columns = report(run_dir, plot=False)
    monkeypatch.setattr(SQLiteStore, "columns", lambda self: Columns.of(self.history()))
    assert report(run_dir, plot=False) == from_columns
    assert "#1  fitness 0.9  id 5  seed:resnet" in from_columns
    assert "weights inherited: 50% of parameters on average over 1 children" in from_columns


def test_reading_columns_pauses_the_collector_and_restores_it(run_dir):
    store = SQLiteStore(run_dir / STORE_NAME)
    try:
        assert gc.isenabled()
        assert len(store.columns().measures) == 7
        assert gc.isenabled()
        gc.disable()
        assert len(store.columns().measures) == 7
        assert not gc.isenabled()  # a caller's own setting is kept
    finally:
        gc.enable()
        store.close()


def test_incumbents_match_the_incumbent_of_each_prefix_on_random_histories():
    """The running incumbent (decided at once for rows no better at its fidelity) against
    `incumbent` over every prefix: fidelities rising and falling, ties, None, NaN, -inf, failures."""
    import random

    from einspace.search.compute import incumbent, incumbents

    rng = random.Random(0)
    for _ in range(30):
        history = [
            Record(
                i, "(S a)", f"h{i}", "sampled",
                status=rng.choice(["ok", "ok", "cached", "failed"]),
                fitness=rng.choice([None, math.nan, -math.inf, 0.25, 0.5, 0.5, 0.75, rng.random()]),
                fidelity=rng.choice([None, 1, 3, 3]),
            )
            for i in range(25)
        ]  # fmt: skip
        expected = [incumbent(history[: i + 1]) for i in range(len(history))]
        assert [None if b is None else history[b] for b in incumbents(history)] == expected

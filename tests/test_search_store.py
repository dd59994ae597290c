"""The storage contract, run against every store implementation."""

from __future__ import annotations

import math
import sqlite3

import pytest

from einspace.search.store import SCHEMA_VERSION, Record, SQLiteStore, State, Status, StoreError

STORES = {"sqlite": lambda path: SQLiteStore(path / "search.sqlite")}


@pytest.fixture(params=sorted(STORES))
def open_store(request, tmp_path):
    return lambda: STORES[request.param](tmp_path)


def rec(i: int, h: str = "h", **kw) -> Record:
    return Record(i, f"(S (C t{i}))", h + str(i) if h == "h" else h, "sampled", (), **kw)


def test_running_then_finished_in_finishing_order(open_store):
    store = open_store()
    store.submit(rec(0))
    store.submit(rec(1))
    assert [r.id for r in store.running()] == [0, 1]
    store.finish(rec(1, status="ok", fitness=2.0, metrics={"fitness": 2.0, "acc": 0.5}))
    store.finish(rec(0, status="failed", fitness=-math.inf, error="boom"))
    history = store.history()
    assert [(r.id, r.seq, r.status) for r in history] == [(1, 1, "ok"), (0, 2, "failed")]
    assert history[0].metrics == {"fitness": 2.0, "acc": 0.5}
    assert history[1].fitness == -math.inf and history[1].error == "boom"
    assert store.running() == []


def test_finished_records_never_change(open_store):
    store = open_store()
    store.finish(rec(0, status="ok", fitness=1.0))
    with pytest.raises(StoreError, match="already finished"):
        store.finish(rec(0, status="ok", fitness=2.0))
    with pytest.raises(StoreError, match="already finished"):
        store.submit(rec(0))
    assert store.get(0).fitness == 1.0


def test_running_records_can_be_resubmitted(open_store):
    store = open_store()
    store.submit(rec(0))
    store.submit(rec(0))
    assert len(store.running()) == 1


def test_bad_status_is_refused(open_store):
    with pytest.raises(StoreError, match="status"):
        open_store().finish(rec(0, status="weird", fitness=1.0))


def test_find_hash_returns_the_evaluated_record_not_a_copy(open_store):
    store = open_store()
    store.finish(rec(0, h="same", status="ok", fitness=1.0))
    store.finish(rec(1, h="same", status="cached", fitness=1.0, cached_from=0))
    assert store.find_hash("same").id == 0
    assert store.find_hash("other") is None


def test_checkpoint_and_meta_round_trip_and_persist(open_store):
    store = open_store()
    assert store.load_checkpoint() is None
    store.save_checkpoint({"a": [1, 2], "b": None})
    store.save_checkpoint({"a": [3]})
    store.set_meta("k", "v")
    store.finish(rec(0, status="ok", fitness=0.5))
    store.close()
    again = open_store()
    assert again.load_checkpoint() == {"a": [3]}
    assert again.get_meta("k") == "v" and again.get(0).fitness == 0.5


def test_checkpoint_must_be_plain_json(open_store):
    with pytest.raises(ValueError):
        open_store().save_checkpoint({"x": float("nan")})


def test_newer_schema_is_refused(tmp_path):
    SQLiteStore(tmp_path / "s.sqlite").close()
    db = sqlite3.connect(tmp_path / "s.sqlite")
    db.execute("UPDATE meta SET value = ? WHERE key = 'schema_version'", (str(SCHEMA_VERSION + 1),))
    db.commit()
    db.close()
    with pytest.raises(StoreError, match="newer"):
        SQLiteStore(tmp_path / "s.sqlite")


def test_a_file_that_is_not_a_store_is_refused(tmp_path):
    (tmp_path / "s.sqlite").write_text("not a database, just text " * 100)
    with pytest.raises(StoreError, match="not an einspace results store"):
        SQLiteStore(tmp_path / "s.sqlite")


#: The tables of a version-1 store (einspace before compute accounting), as literal SQL.
_VERSION_1 = """
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE evaluations (
    id INTEGER PRIMARY KEY, state TEXT NOT NULL, status TEXT, tree TEXT NOT NULL, hash TEXT NOT NULL,
    origin TEXT NOT NULL, parents TEXT NOT NULL, fitness REAL, metrics TEXT, error TEXT,
    cached_from INTEGER, submitted_at REAL, finished_at REAL, seconds REAL, worker TEXT, seq INTEGER UNIQUE
);
CREATE TABLE checkpoint (
    id INTEGER PRIMARY KEY CHECK (id = 0), written_at REAL NOT NULL, state TEXT NOT NULL
);
INSERT INTO meta VALUES ('schema_version', '1');
INSERT INTO evaluations (id, state, status, tree, hash, origin, parents, fitness, metrics, seq)
VALUES (0, 'finished', 'ok', '(S (C relu))', 'abc', 'sampled', '[]', 0.25, '{}', 1);
"""


@pytest.mark.parametrize("writer", [False, True])
def test_version_1_store_is_upgraded_and_keeps_its_records(tmp_path, writer):
    """An old (version 1) store, built from literal SQL rather than this code, is upgraded in
    place: its records read back, with no fidelity, not partial, no recorded cost or node, and new
    records with those fields can be written."""
    db = sqlite3.connect(tmp_path / "old.sqlite")
    db.executescript(_VERSION_1)
    db.commit()
    db.close()
    store = SQLiteStore(tmp_path / "old.sqlite", writer=writer)
    [old] = store.history()
    assert (old.state, old.status) == (State.FINISHED, Status.OK) and type(old.status) is Status
    assert (old.id, old.fitness, old.tree, old.fidelity, old.partial, old.cost, old.node) == (
        0,
        0.25,
        "(S (C relu))",
        None,
        False,
        {},
        None,
    )
    assert store.get_meta("schema_version") == str(SCHEMA_VERSION)
    new = store.finish(
        Record(
            1,
            "t",
            "h",
            "promotion",
            (0,),
            status="ok",
            fitness=0.5,
            fidelity=3,
            partial=True,
            cost={"steps": 7},
            node="n1",
        )
    )
    assert (new.fidelity, new.partial, new.cost, new.node) == (3, True, {"steps": 7}, "n1")
    store.close()
    assert SQLiteStore(tmp_path / "old.sqlite").get(1) == new  # upgraded once: reopening is plain


def test_find_hash_is_per_fidelity(open_store):
    store = open_store()
    store.finish(Record(0, "t", "same", "sampled", status="ok", fitness=0.5, fidelity=1))
    store.finish(Record(1, "t", "same", "promotion", (0,), status="ok", fitness=0.7, fidelity=3))
    assert store.find_hash("same", 1).id == 0
    assert store.find_hash("same", 3).id == 1
    assert store.find_hash("same", 9) is None
    assert store.find_hash("same") is None  # the evaluator's own fidelity was never evaluated


def test_one_writer_per_run(tmp_path):
    writer = SQLiteStore(tmp_path / "s.sqlite", writer=True)
    with pytest.raises(StoreError, match="another search is running"):
        SQLiteStore(tmp_path / "s.sqlite", writer=True)
    reader = SQLiteStore(tmp_path / "s.sqlite")  # a report may read while a search writes
    reader.close()
    writer.close()
    SQLiteStore(tmp_path / "s.sqlite", writer=True).close()


def test_states_are_enums_stored_as_their_plain_words(open_store, tmp_path):
    """Records read back carry `State` and `Status`; the file holds the words older runs hold."""
    store = open_store()
    store.submit(rec(0))
    assert store.running()[0].state is State.RUNNING
    store.finish(rec(0, status=Status.CACHED, fitness=1.0))
    [r] = store.history()
    assert (r.state, r.status) == (State.FINISHED, Status.CACHED) == ("finished", "cached")
    store.close()
    rows = sqlite3.connect(tmp_path / "search.sqlite").execute("SELECT state, status FROM evaluations")
    assert rows.fetchall() == [("finished", "cached")]

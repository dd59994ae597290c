"""The results store: one SQLite file per run, holding every evaluation and the strategy checkpoint."""

from __future__ import annotations

import fcntl
import json
import math
import os
import sqlite3
import sys
import time
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import Enum
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

from einspace.errors import EinspaceError
from einspace.evaluators.base import Cost, Status

if TYPE_CHECKING:
    from einspace.search.columns import Columns
    from einspace.search.compute import Tally

__all__ = ["SCHEMA_VERSION", "Record", "SQLiteStore", "State", "Status", "Store", "StoreError"]

#: Bumped whenever the tables change; a store written by a newer einspace is refused, not guessed at,
#: and an older one is upgraded in place when it is opened (`_MIGRATIONS`).
SCHEMA_VERSION = 3


class StoreError(EinspaceError):
    """The store cannot be opened or was asked to break its contract."""


class State(str, Enum):
    """Where a record is in its life: `running` (submitted, or re-queued after a crash), then
    `finished`, once. Stored as the plain words, as older stores hold them."""

    RUNNING = "running"
    FINISHED = "finished"

    def __str__(self) -> str:
        return self.value


#: Stored words -> enum members, looked up per row without the Enum call's overhead.
_STATES = {s.value: s for s in State}
_STATUSES = {s.value: s for s in Status}
#: Parses the JSON columns: `raw_decode` skips `json.loads`'s two whitespace scans, which the
#: store's own `json.dumps` text never needs (a third of parsing a 100,000-record history).
_DECODER = json.JSONDecoder()


def _one_of(values: type[Enum]) -> str:
    """An SQL list of an enum's values: `'ok', 'failed', 'cached'`."""
    return ", ".join(f"'{v.value}'" for v in values)


@dataclass(frozen=True)
class Record:
    """One evaluation. `state` is running until `status` (a `Status`: ok, failed or cached) is set.
    `fidelity` is what the evaluation was asked to train for (None: the evaluator's own setting);
    `partial` marks an ok result scored before reaching it; `cost` is `Cost.to_json()`."""

    id: int
    tree: str
    hash: str
    origin: str
    parents: tuple[int, ...] = ()
    state: State = State.RUNNING
    status: Status | None = None
    fitness: float | None = None
    metrics: dict[str, float] = field(default_factory=dict)
    error: str | None = None
    cached_from: int | None = None
    submitted_at: float | None = None
    finished_at: float | None = None
    seconds: float | None = None
    worker: str | None = None
    seq: int | None = None  # finishing order, 1, 2, ...: the run's history
    fidelity: int | None = None
    partial: bool = False
    cost: dict[str, float] = field(default_factory=dict)
    node: str | None = None  # the Ray node it ran on (None: in-process, or a store older than v3)

    @property
    def finished(self) -> bool:
        return self.state == State.FINISHED

    @cached_property
    def measured(self) -> Cost | None:
        """`cost` as a `Cost` (None: none recorded), parsed once: reports read it several times
        per record, over histories of 100,000."""
        return Cost.from_json(self.cost) if self.cost else None


class Store(ABC):
    """The storage contract (every store passes the same contract tests):

    - Each write is one transaction; a reader never sees half of one, and a crash (kill -9)
      loses at most the write in progress.
    - A record goes `running` -> `finished`, once. Finished records never change; finishing one
      twice is an error. A running record may be re-submitted (after a crash it is re-queued).
    - `finish` is committed before the caller tells the strategy, so a result is never lost.
    - The checkpoint is a JSON document replaced atomically as a whole.
    - Nothing is pickled: trees are text, metrics and checkpoints JSON.
    - The store carries a schema version and refuses a newer one.
    - One writer at a time (a second search on the same run is refused); readers need no lock.
    """

    @abstractmethod
    def submit(self, record: Record) -> None:
        """Record a candidate as running (again, if it already is)."""

    @abstractmethod
    def finish(self, record: Record) -> Record:
        """Record a finished evaluation; returns it with its finishing order `seq`."""

    @abstractmethod
    def get(self, id: int) -> Record | None: ...

    @abstractmethod
    def find_hash(self, hash: str, fidelity: int | None = None) -> Record | None:
        """The evaluated (ok or failed, not cached) record of a tree with this hash at this
        fidelity, if any (the same tree trained for fewer epochs is another result)."""

    @abstractmethod
    def history(self) -> list[Record]:
        """Finished records in finishing order."""

    def columns(self) -> Columns:
        """The finished records as columns (`einspace.search.columns`), in finishing order: what a
        report computes from without a `Record` per row."""
        from einspace.search.columns import Columns

        return Columns.of(self.history())

    @abstractmethod
    def running(self) -> list[Record]: ...

    def count_finished(self, excluding_origin: str | None = None) -> int:
        """How many records are finished (those of `excluding_origin` left out), without reading
        them: resuming a long run counts its history before anything else."""
        return sum(r.origin != excluding_origin for r in self.history())

    def tally(self) -> Tally:
        """What the finished records add up to (`compute.Tally`): where a resumed search's
        progress display starts."""
        from einspace.search.compute import Tally

        return Tally.of(self.history())

    @abstractmethod
    def save_checkpoint(self, state: dict[str, Any]) -> None: ...

    @abstractmethod
    def load_checkpoint(self) -> dict[str, Any] | None: ...

    @abstractmethod
    def get_meta(self, key: str) -> str | None: ...

    @abstractmethod
    def set_meta(self, key: str, value: str) -> None: ...

    def close(self) -> None:  # noqa: B027 - optional
        pass


_SCHEMA = f"""
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS evaluations (
    id INTEGER PRIMARY KEY,
    state TEXT NOT NULL CHECK (state IN ({_one_of(State)})),
    status TEXT CHECK (status IN ({_one_of(Status)})),
    tree TEXT NOT NULL,
    hash TEXT NOT NULL,
    origin TEXT NOT NULL,
    parents TEXT NOT NULL,
    fitness REAL,
    metrics TEXT,
    error TEXT,
    cached_from INTEGER,
    submitted_at REAL,
    finished_at REAL,
    seconds REAL,
    worker TEXT,
    seq INTEGER UNIQUE,
    fidelity INTEGER,
    partial INTEGER NOT NULL DEFAULT 0,
    cost TEXT,
    node TEXT
);
CREATE INDEX IF NOT EXISTS evaluations_hash ON evaluations (hash, status);
CREATE TABLE IF NOT EXISTS checkpoint (
    id INTEGER PRIMARY KEY CHECK (id = 0), written_at REAL NOT NULL, state TEXT NOT NULL
);
"""

#: The stored fields, in the order `record_of_row` reads them.
COLUMN_NAMES = (
    "id", "tree", "hash", "origin", "parents", "state", "status", "fitness", "metrics", "error",
    "cached_from", "submitted_at", "finished_at", "seconds", "worker", "seq", "fidelity", "partial",
    "cost", "node",
)  # fmt: skip
_COLUMNS = ", ".join(COLUMN_NAMES)


def record_of_row(r: Sequence[Any]) -> Record:
    """A stored row, its fields in `_COLUMNS` order, as a `Record`: the one decoding of the JSON
    and enumerated columns (the store's queries and `einspace.search.columns` share it). Nothing
    here is per-row work that could be done once: histories run to 100,000 rows."""
    decode = _DECODER.raw_decode
    # Record's fields set at once, not through the frozen dataclass's __init__ (one
    # object.__setattr__ per field: a third of reading a history)
    record = object.__new__(Record)
    record.__dict__.update(
        id=r[0],
        tree=r[1],
        hash=r[2],
        origin=r[3],
        parents=() if not r[4] or r[4] == "[]" else tuple(decode(r[4])[0]),
        state=_STATES[r[5]],
        status=None if r[6] is None else _STATUSES[r[6]],
        fitness=r[7],
        metrics=decode(r[8])[0] if r[8] and r[8] != "{}" else {},
        error=r[9],
        cached_from=r[10],
        submitted_at=r[11],
        finished_at=r[12],
        seconds=r[13],
        worker=r[14],
        seq=r[15],
        fidelity=r[16],
        partial=bool(r[17]),
        cost=decode(r[18])[0] if r[18] else {},
        node=r[19],
    )
    return record


#: Statements that bring a store of version k (the key) to version k + 1.
_MIGRATIONS = {
    1: (
        "ALTER TABLE evaluations ADD COLUMN fidelity INTEGER",
        "ALTER TABLE evaluations ADD COLUMN partial INTEGER NOT NULL DEFAULT 0",
        "ALTER TABLE evaluations ADD COLUMN cost TEXT",
    ),
    2: ("ALTER TABLE evaluations ADD COLUMN node TEXT",),
}


#: `compute.compute_of` of a row, in SQL (for `SQLiteStore.tally`).
_COMPUTE = (
    "CASE WHEN status = 'cached' THEN 0.0 WHEN cost IS NULL OR cost = '{}' THEN COALESCE(seconds, 0.0) "
    "ELSE COALESCE(NULLIF(json_extract(cost, '$.gpu_seconds'), 0), "
    "NULLIF(json_extract(cost, '$.cpu_seconds'), 0), json_extract(cost, '$.wall_seconds'), 0.0) END"
)
#: The largest finite float: fitness within +-this is finite (SQLite keeps +-inf, and NaN as NULL).
_FINITE = sys.float_info.max


def _fitness_in(value: float | None) -> float | None:
    # SQLite stores -inf but turns NaN into NULL; failures are -inf, so keep them, NaN never gets here.
    return None if value is None or math.isnan(value) else float(value)


class SQLiteStore(Store):
    """`Store` on one SQLite file (WAL mode: a commit survives kill -9 of the writer)."""

    def __init__(self, path: str | Path, writer: bool = False):
        """`writer=True` takes the run's lock (released on close, or when the process dies, even
        by kill -9), so two searches can never write one run; readers (reports) need no lock."""
        self.path = Path(path)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except (FileExistsError, NotADirectoryError):
            raise StoreError(f"the run directory {self.path.parent} is a file, not a directory") from None
        if self.path.is_file() and self.path.stat().st_size == 0:
            raise StoreError(
                f"{self.path} is empty (0 bytes), which no einspace run leaves behind: the file was "
                "truncated or made by something else. Move it away to start a new run there"
            )
        self._lock: int | None = None
        if writer:
            self._lock = os.open(f"{self.path}.lock", os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(self._lock)
                raise StoreError(f"another search is running in {self.path.parent}") from None
        try:
            self._db = sqlite3.connect(self.path, isolation_level=None)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=NORMAL")
            version = self._version()
        except sqlite3.DatabaseError as exc:
            raise StoreError(f"{self.path} is not an einspace results store: {exc}") from None
        if version is None:
            with self._tx():
                for statement in _SCHEMA.split(";"):
                    if statement.strip():
                        self._db.execute(statement)
                self._db.execute("INSERT INTO meta VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),))
        elif version > SCHEMA_VERSION:
            raise StoreError(
                f"{self.path} has schema version {version}, newer than this einspace's {SCHEMA_VERSION}; "
                "upgrade einspace to read it"
            )
        elif version < SCHEMA_VERSION:
            self._upgrade(version)

    def _upgrade(self, version: int) -> None:
        """Bring an older store to SCHEMA_VERSION in one transaction (what it lacks gets defaults:
        no fidelity, not partial, no recorded cost or node)."""
        with self._tx():
            for step in range(version, SCHEMA_VERSION):
                for statement in _MIGRATIONS[step]:
                    self._db.execute(statement)
            self._db.execute("UPDATE meta SET value = ? WHERE key = 'schema_version'", (str(SCHEMA_VERSION),))

    def _version(self) -> int | None:
        exists = self._db.execute("SELECT name FROM sqlite_master WHERE name = 'meta'").fetchone()
        if not exists:
            return None
        row = self._db.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
        return int(row[0]) if row else None

    def _tx(self) -> _Transaction:
        return _Transaction(self._db)

    def submit(self, record: Record) -> None:
        with self._tx():
            old = self._db.execute("SELECT state FROM evaluations WHERE id = ?", (record.id,)).fetchone()
            if old and old[0] == State.FINISHED:
                raise StoreError(f"evaluation {record.id} is already finished; it cannot run again")
            self._db.execute(
                "INSERT OR REPLACE INTO evaluations "
                "(id, state, tree, hash, origin, parents, submitted_at, fidelity) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    record.id,
                    State.RUNNING,
                    record.tree,
                    record.hash,
                    record.origin,
                    json.dumps(list(record.parents)),
                    record.submitted_at if record.submitted_at is not None else time.time(),
                    record.fidelity,
                ),
            )

    def finish(self, record: Record) -> Record:
        if record.status not in set(Status):
            raise StoreError(f"evaluation {record.id}: status {record.status!r} is not ok, failed or cached")
        with self._tx():
            old = self._db.execute("SELECT state, submitted_at FROM evaluations WHERE id = ?", (record.id,))
            row = old.fetchone()
            if row and row[0] == State.FINISHED:
                raise StoreError(f"evaluation {record.id} is already finished; finished records never change")
            seq = self._db.execute("SELECT COALESCE(MAX(seq), 0) + 1 FROM evaluations").fetchone()[0]
            submitted = record.submitted_at if record.submitted_at is not None else (row[1] if row else None)
            finished_at = record.finished_at if record.finished_at is not None else time.time()
            self._db.execute(
                f"INSERT OR REPLACE INTO evaluations ({_COLUMNS}) VALUES ({', '.join('?' * 20)})",
                (
                    record.id,
                    record.tree,
                    record.hash,
                    record.origin,
                    json.dumps(list(record.parents)),
                    State.FINISHED,
                    record.status,
                    _fitness_in(record.fitness),
                    json.dumps(record.metrics),
                    record.error,
                    record.cached_from,
                    submitted,
                    finished_at,
                    record.seconds,
                    record.worker,
                    seq,
                    record.fidelity,
                    int(record.partial),
                    json.dumps(record.cost),
                    record.node,
                ),
            )
        return self.get(record.id)  # type: ignore[return-value]

    def _rows(self, where: str, args: tuple = ()) -> list[Record]:
        """The records a query selects (histories run to 100,000 rows)."""
        rows = self._db.execute(f"SELECT {_COLUMNS} FROM evaluations {where}", args).fetchall()
        return list(map(record_of_row, rows))

    def get(self, id: int) -> Record | None:
        rows = self._rows("WHERE id = ?", (id,))
        return rows[0] if rows else None

    def find_hash(self, hash: str, fidelity: int | None = None) -> Record | None:
        rows = self._rows(
            "WHERE hash = ? AND fidelity IS ? AND status IN (?, ?) ORDER BY seq LIMIT 1",
            (hash, fidelity, Status.OK, Status.FAILED),
        )
        return rows[0] if rows else None

    def history(self) -> list[Record]:
        return self._rows("WHERE state = ? ORDER BY seq", (State.FINISHED,))

    def columns(self) -> Columns:
        from einspace.search.columns import Columns

        return Columns.read(self._db)

    def running(self) -> list[Record]:
        return self._rows("WHERE state = ? ORDER BY id", (State.RUNNING,))

    def count_finished(self, excluding_origin: str | None = None) -> int:
        query = "SELECT COUNT(*) FROM evaluations WHERE state = ? AND origin IS NOT ?"
        return self._db.execute(query, (State.FINISHED, excluding_origin)).fetchone()[0]

    def tally(self) -> Tally:
        """`Store.tally` summed in SQL (resuming at 100,000 read every record for it): the compute of
        `compute.compute_of` (GPU, else CPU, else wall seconds of the stored cost; the record's
        seconds without one; nothing for a cached copy) and the incumbent of `compute.incumbent`
        (the highest fidelity, None the top, then fitness, finite only; ties: the earlier)."""
        from einspace.search.compute import Tally
        from einspace.search.successive_halving import PROMOTION

        finished = "FROM evaluations WHERE state = 'finished'"
        ids = {i for (i,) in self._db.execute(f"SELECT id {finished}")}
        row = self._db.execute(
            f"SELECT COALESCE(SUM(origin IS ?), 0), COALESCE(SUM(status = 'failed'), 0), "
            f"COALESCE(SUM(status = 'cached'), 0), COALESCE(SUM({_COMPUTE}), 0.0), "
            f"COALESCE(SUM(CASE WHEN status = 'failed' THEN {_COMPUTE} END), 0.0) {finished}",
            (PROMOTION,),
        ).fetchone()
        best = self._rows(
            "WHERE state = 'finished' AND status != 'failed' AND fitness BETWEEN ? AND ? "
            "ORDER BY fidelity IS NULL DESC, fidelity DESC, fitness DESC, seq LIMIT 1",
            (-_FINITE, _FINITE),
        )
        promoted, failed, cached, compute, wasted = row
        incumbent = best[0] if best else None
        return Tally(ids, len(ids) - promoted, promoted, failed, cached, compute, wasted, incumbent)

    def save_checkpoint(self, state: dict[str, Any]) -> None:
        text = json.dumps(state, allow_nan=False)
        with self._tx():
            self._db.execute("INSERT OR REPLACE INTO checkpoint VALUES (0, ?, ?)", (time.time(), text))

    def load_checkpoint(self) -> dict[str, Any] | None:
        row = self._db.execute("SELECT state FROM checkpoint WHERE id = 0").fetchone()
        return json.loads(row[0]) if row else None

    def get_meta(self, key: str) -> str | None:
        row = self._db.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return row[0] if row else None

    def set_meta(self, key: str, value: str) -> None:
        with self._tx():
            self._db.execute("INSERT OR REPLACE INTO meta VALUES (?, ?)", (key, value))

    def close(self) -> None:
        self._db.close()
        if self._lock is not None:
            os.close(self._lock)  # closing the descriptor releases the lock
            self._lock = None


class _Transaction:
    """BEGIN IMMEDIATE ... COMMIT, or ROLLBACK on an exception: one write, all or nothing."""

    def __init__(self, db: sqlite3.Connection):
        self.db = db

    def __enter__(self) -> None:
        self.db.execute("BEGIN IMMEDIATE")

    def __exit__(self, kind: object, *_: object) -> None:
        self.db.execute("ROLLBACK" if kind else "COMMIT")

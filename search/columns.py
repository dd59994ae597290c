"""A run's finished evaluations as columns: one list per stored field, in finishing order, read in
one query. `einspace report` computes its summary, curves and CSV from these at 100,000 results,
where building a `Record` per row (and parsing every JSON column of it) took a fifth of its time.
JSON columns stay as the text the store wrote: parents and metrics are written to the CSV as they
are, costs split into their numbers' text; a row's metrics, or a whole record, are parsed only
where a report needs them (the top records, a metric only a few runs have)."""

from __future__ import annotations

import gc
import json
import re
import sqlite3
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from einspace.evaluators.base import Cost, Status
from einspace.search.store import COLUMN_NAMES, Record, State, record_of_row

__all__ = ["COST_FIELDS", "FIELDS", "Columns", "as_columns", "as_records"]

#: The stored fields the columns hold: all but `state` (the columns hold finished evaluations only).
FIELDS = tuple(name for name in COLUMN_NAMES if name != "state")
_QUERY = f"SELECT {', '.join(FIELDS)} FROM evaluations WHERE state = ? ORDER BY seq"
_DECODE = json.JSONDecoder().raw_decode
#: `Cost`'s fields, in the order `Cost.to_json` gives them.
COST_FIELDS = tuple(Cost.__dataclass_fields__)
#: A number as `json.dumps` writes it (its `repr`: no leading zero, a lower-case exponent with its sign).
_NUMBER = r"(-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:e[-+][0-9]+)?)"
#: A cost as the store writes it, `json.dumps(Cost.to_json())` (the fields in order, finite numbers).
_COST_TEXT = re.compile("{" + ", ".join(f'"{name}": {_NUMBER}' for name in COST_FIELDS) + "}")


def _number(text: str) -> int | float:
    """A JSON number as `json` reads it: a float where it has a fraction or an exponent."""
    return float(text) if "." in text or "e" in text else int(text)


@contextmanager
def _collector_paused() -> Iterator[None]:
    """The cyclic garbage collector paused while 100,000s of objects that form no cycles are made
    (rows, parsed costs): each of its young collections would traverse them again, a quarter of
    the time it takes to make them."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


@dataclass(frozen=True, eq=False)
class Columns:
    """The history, one list per field, row i of each being the i-th finished evaluation.
    `status` holds the stored words ("ok", "failed", "cached"; equal to `Status` members),
    `partial` 0 or 1, and `parents`, `metrics` and `cost` the stored JSON text (None or "" where
    nothing was stored)."""

    seq: list[int]
    id: list[int]
    status: list[str]
    fitness: list[float | None]
    origin: list[str]
    parents: list[str]
    cached_from: list[int | None]
    hash: list[str]
    seconds: list[float | None]
    fidelity: list[int | None]
    partial: list[int]
    cost: list[str | None]
    worker: list[str | None]
    node: list[str | None]
    error: list[str | None]
    metrics: list[str | None]
    tree: list[str]
    submitted_at: list[float | None]
    finished_at: list[float | None]

    @classmethod
    def read(cls, db: sqlite3.Connection) -> Columns:
        """The finished evaluations of a store's database, in one query."""
        with _collector_paused():
            rows = db.execute(_QUERY, (State.FINISHED.value,)).fetchall()
            columns = list(zip(*rows, strict=True)) if rows else [()] * len(FIELDS)
            return cls(**{name: list(values) for name, values in zip(FIELDS, columns, strict=True)})

    @classmethod
    def of(cls, records: Sequence[Record]) -> Columns:
        """The columns of records already read (or made by hand), as the store would give them."""
        values: dict[str, list[Any]] = {name: [] for name in FIELDS}
        for r in records:
            row = {name: getattr(r, name) for name in FIELDS}
            row["status"] = None if r.status is None else Status(r.status).value
            row["parents"] = json.dumps(list(r.parents))
            row["partial"] = int(r.partial)
            row["cost"] = json.dumps(r.cost)
            row["metrics"] = json.dumps(r.metrics)
            for name in FIELDS:
                values[name].append(row[name])
        return cls(**values)

    def __len__(self) -> int:
        return len(self.id)

    @cached_property
    def _costs(self) -> tuple[list[float | None], list[str | None], list[tuple[object, ...] | None]]:
        """Each row's stored cost as its `Cost.compute_seconds`, its `Cost.measure` and its fields
        in `COST_FIELDS` order (None, None, None: no cost recorded). A cost as the store writes it
        is split, not parsed as JSON, and no `Cost` is made of it: its fields stay the text
        `json.dumps` wrote, their `repr`, which is what a CSV writer writes for them (parsing and
        writing them again took a fifth of a 100,000-row report)."""
        seconds: list[float | None] = []
        measures: list[str | None] = []
        fields: list[tuple[object, ...] | None] = []
        match = _COST_TEXT.fullmatch
        with _collector_paused():
            for text in self.cost:
                found = match(text) if text else None
                if found is not None:
                    numbers = found.groups()
                    cpu, gpu, wall = _number(numbers[0]), _number(numbers[1]), _number(numbers[2])
                    seconds.append(Cost.seconds_of(cpu, gpu, wall))
                    measures.append(Cost.measure_of(cpu, gpu))
                    fields.append(numbers)
                    continue
                data = _DECODE(text)[0] if text else None
                m = Cost.from_json(data) if data else None
                seconds.append(None if m is None else m.compute_seconds)
                measures.append(None if m is None else m.measure)
                fields.append(None if m is None else tuple(getattr(m, name) for name in COST_FIELDS))
        return seconds, measures, fields

    @property
    def measures(self) -> list[str | None]:
        """Which seconds each row's cost counts (`Cost.measure`: "GPU", "CPU", "wall"; None: no cost)."""
        return self._costs[1]

    def cost_field(self, name: str) -> list[object]:
        """One of `Cost`'s fields for each row ("" where no cost was recorded): the value, or where
        the cost is as the store writes it, the text of its `repr`."""
        j = COST_FIELDS.index(name)
        return ["" if f is None else f[j] for f in self._costs[2]]

    @cached_property
    def compute(self) -> list[float]:
        """Each row's compute seconds, as `compute.compute_of` gives a record's."""
        from einspace.search.compute import spent

        return list(map(spent, self.status, self._costs[0], self.seconds))

    @cached_property
    def parent_ids(self) -> list[str]:
        """Each row's parents as their ids separated by spaces ("" for none): the stored text is
        `json.dumps` of a list of ints, "[3, 14]", so its brackets and commas are dropped."""
        return [text[1:-1].replace(", ", " ") if text else "" for text in self.parents]

    def metrics_of(self, i: int) -> dict[str, Any]:
        """Row i's metrics, parsed (the report reads a few rows', never all)."""
        text = self.metrics[i]
        return _DECODE(text)[0] if text and text != "{}" else {}

    def parents_of(self, i: int) -> list[int]:
        """Row i's parents' ids, parsed."""
        text = self.parents[i]
        return list(_DECODE(text)[0]) if text else []

    def having(self, metric: str) -> list[int]:
        """The rows whose metrics hold `metric`: the text is searched for the key before any row
        is parsed (metrics such as a weight-inheritance share are in a few runs only)."""
        quoted = json.dumps(metric)
        return [
            i
            for i, text in enumerate(self.metrics)
            if text and quoted in text and metric in self.metrics_of(i)
        ]

    def record(self, i: int) -> Record:
        """Row i as a `Record`, equal to the store's (for the few records a report prints)."""
        row = [State.FINISHED.value if name == "state" else getattr(self, name)[i] for name in COLUMN_NAMES]
        return record_of_row(row)


def as_records(history: Columns | Sequence[Record]) -> Sequence[Record]:
    """`history` as records (what the few per-record computations, such as a Pareto front, read)."""
    return [history.record(i) for i in range(len(history))] if isinstance(history, Columns) else history


def as_columns(history: Columns | Sequence[Record]) -> Columns:
    """`history` as columns: the report's functions take either (tests and small runs hold records)."""
    return history if isinstance(history, Columns) else Columns.of(history)

"""The tables and writes of the replication tests (tests/test_tablet_replication*.py).

Three tables: an aggregation table (sum with retractions, last_value, string_agg, first_value),
the same with a row TTL judged by a clock the tests move, and a default-engine table (last row
wins). Writes are puts in AGGREGATE and OVERWRITE mode, full or partial (target columns),
retractions, full and partial deletes; the tests add idempotent writers and their retries.
Values are integers and strings only, so rows compare exactly (no NaN).
"""

from __future__ import annotations

import pyarrow as pa
from hypothesis import strategies as st

from aggfuncs import AggFunction
from merge_engine import Schema, TableDescriptor
from merge_engine.kv.tablet import KvTablet
from merge_engine.testing.ops import Delete, Put

KINDS = ("aggregation", "row-ttl", "last-row")
KEYS = tuple(range(6))  # few keys: writes keep hitting the same rows
TTL_SECONDS = 10


class Clock:
    """A clock the test moves (seconds, like time.time): times writes and judges the row TTL."""

    def __init__(self, now: float = 1_700_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def descriptor(kind: str, buffer_size: str | None = None) -> TableDescriptor:
    builder = Schema.builder().column("k", pa.int64(), nullable=False)
    properties = {"table.delete.behavior": "allow"}
    if kind == "last-row":
        builder = builder.column("a", pa.int64()).column("b", pa.string())
    else:
        builder = (builder.agg_column("qty", pa.int64(), AggFunction.SUM)
                   .agg_column("status", pa.string(), AggFunction.LAST_VALUE)
                   .agg_column("tags", pa.string(), AggFunction.STRING_AGG, delimiter=";")
                   .agg_column("first", pa.string(), AggFunction.FIRST_VALUE))
        properties["table.merge-engine"] = "aggregation"
        if kind == "row-ttl":
            properties["table.kv.row-ttl"] = f"{TTL_SECONDS}s"
    if buffer_size is not None:
        properties["table.kv.buffer-size"] = buffer_size
    return TableDescriptor(builder.primary_key("k").build(), properties=properties)


def value_columns(kind: str) -> tuple[str, ...]:
    return ("a", "b") if kind == "last-row" else ("qty", "status", "tags", "first")


def open_bucket(path, kind: str, clock: Clock, buffer_size: str | None = None,
                slice_rows: int | None = None) -> KvTablet:
    """Open a bucket; `slice_rows` small makes one write several changelog entries."""
    tablet = KvTablet.open(str(path), descriptor(kind, buffer_size), clock=clock)
    if slice_rows is not None:
        tablet.slice_rows = slice_rows
    return tablet


_VALUES = {
    "qty": st.one_of(st.none(), st.integers(-5, 9)),
    "a": st.one_of(st.none(), st.integers(-5, 9)),
    "status": st.one_of(st.none(), st.sampled_from(["new", "paid", "sent"])),
    "b": st.one_of(st.none(), st.sampled_from(["x", "y", ""])),
    "tags": st.one_of(st.none(), st.sampled_from(["a", "b", "cc"])),
    "first": st.one_of(st.none(), st.sampled_from(["p", "q"])),
}


@st.composite
def writes(draw, kind: str):
    """One Put or Delete of table `kind` (merge_engine.testing.ops), without a writer."""
    columns = value_columns(kind)
    targets = None
    if draw(st.booleans()):
        targets = ("k",) + tuple(draw(st.lists(st.sampled_from(columns), min_size=1,
                                               max_size=len(columns), unique=True)))
    keys = st.sampled_from(KEYS)
    pick = draw(st.integers(0, 9))
    if pick < 2:
        rows = tuple({"k": k} for k in draw(st.lists(keys, min_size=1, max_size=3)))
        return Delete(rows, target_columns=targets)
    if pick < 4 and kind != "last-row":
        # retractions: sums and string_agg take a contribution back (-U, -D)
        targets = ("k", "qty", "tags")
        rows = tuple({"k": draw(keys), "qty": draw(_VALUES["qty"]), "tags": draw(_VALUES["tags"]),
                      "_change_type": draw(st.sampled_from(["+I", "-U", "+U", "-D"]))}
                     for _ in range(draw(st.integers(1, 3))))
        return Put(rows, target_columns=targets)
    mode = "OVERWRITE" if kind == "last-row" or draw(st.booleans()) else "AGGREGATE"
    names = targets[1:] if targets else columns
    rows = tuple({"k": draw(keys), **{c: draw(_VALUES[c]) for c in names}}
                 for _ in range(draw(st.integers(1, 5))))
    return Put(rows, mode=mode, target_columns=targets)


def rows_of(tablet: KvTablet) -> list[dict]:
    """The rows a snapshot reads (no flush), in key order."""
    return sorted((row for batch in tablet.snapshot().batches() for row in batch.to_pylist()),
                  key=lambda row: row["k"])


def lookups_of(tablet: KvTablet) -> tuple[list[dict], list[bool]]:
    """lookup_many of every key with the hidden `_unwritten` column, and which keys have rows;
    a key without a row shows None (its row is meaningless)."""
    table, present = tablet.lookup_many([{"k": k} for k in KEYS], unwritten=True)
    return ([row if there else None for row, there in zip(table.to_pylist(), present.tolist())],
            present.tolist())


def stored_rows(tablet: KvTablet) -> list[bytes]:
    """Every row's stored bytes after a flush: the whole state, hidden parts included
    (written bits, contribution counts, last-write times)."""
    tablet.flush()
    return [value for chunk in tablet._store.scan_rows() for value in chunk]

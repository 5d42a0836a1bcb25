"""A bucket's scan that lost its server mid-stream, resumed on the bucket's new leader as of the
offset it began at: no row handed out twice, none skipped, none from a later state.

A scan streams one bucket as of one changelog offset A (the first server's snapshot), rows in
no key order. When that stream stalls or its server goes away, the rows handed out so far stay
handed out. The bucket's new leader can only be scanned as of its own offset B (B >= A: the
first server streamed A only once A was replicated to the in-sync copies a new leader is
elected from). The rows as of A are those of B with the changes of [A, B) taken back: the first
record of a key in [A, B) tells its row as of A (a -U or -D record's image is the row before
the change; a +I says there was none). So the resumed stream is B's rows less every key handed
out already and every key changed in [A, B), then the before-images of the changed keys that
were not handed out.

That needs the keys handed out so far (the scan reads the primary key with every stream, and
keeps each bucket's keys until the bucket is read) and the changelog of [A, B) (read in steps,
each with its own deadline). Limits: a scan resumed after retention removed part of [A, B)
fails with OffsetOutOfRangeError; with a row TTL, rows that expire between the two servers'
snapshots may be told apart by when each server read them.
"""

from __future__ import annotations

from typing import Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from merge_engine.table.hidden_columns import CHANGE_TYPE, OFFSET
from tally.errors import UnavailableError

CHANGELOG_STEP = 10_000  # records per changelog request while resuming
_ROW = "_scan_row"       # a row's position in its batch, beside its key (client side only)
BEFORE_IMAGES = ("-U", "-D")


class KeysSeen:
    """The primary keys of the rows a bucket's stream handed out (key columns only)."""

    def __init__(self, primary_key: list[str]) -> None:
        self.primary_key = primary_key
        self._parts: list[pa.Table] = []

    def add(self, batch: pa.RecordBatch) -> None:
        if batch.num_rows:
            self._parts.append(pa.Table.from_batches([batch.select(self.primary_key)]))

    def table(self, schema: pa.Schema) -> pa.Table:
        if not self._parts:
            return schema.empty_table()
        return pa.concat_tables([p.cast(schema) for p in self._parts])


def rows_without(rows: pa.Table, keys: pa.Table, primary_key: list[str]) -> pa.Table:
    """`rows` less those whose primary key is in `keys`. Only key columns enter the join (Arrow
    joins refuse list columns, which `_unwritten` and array_agg values are)."""
    if rows.num_rows == 0 or keys.num_rows == 0:
        return rows
    left = rows.select(primary_key).append_column(
        _ROW, pa.array(np.arange(rows.num_rows, dtype=np.int64)))
    kept = left.join(keys.select(primary_key).group_by(primary_key).aggregate([]),
                     keys=primary_key, join_type="left anti")
    positions = np.sort(kept.column(_ROW).to_numpy())
    return rows.take(pa.array(positions, type=pa.int64()))


def first_changes(records: pa.Table, primary_key: list[str]) -> pa.Table:
    """The first record of each key in `records` (records of one bucket in offset order)."""
    if records.num_rows == 0:
        return records
    indexed = records.append_column(_ROW, pa.array(np.arange(records.num_rows, dtype=np.int64)))
    firsts = indexed.group_by(primary_key).aggregate([(_ROW, "min")])
    positions = np.sort(firsts.column(f"{_ROW}_min").to_numpy())
    return records.take(pa.array(positions, type=pa.int64()))


def changes_since(read_range, start: int, end: int) -> pa.Table | None:
    """The changelog records [start, end) of the bucket, read in steps (None when empty)."""
    tables = []
    position = start
    while position < end:
        upto = min(end, position + CHANGELOG_STEP)
        tables.append(read_range(position, upto))
        position = upto
    tables = [t for t in tables if t.num_rows]
    if not tables:
        return None
    return pa.concat_tables(tables, promote_options="permissive").sort_by(OFFSET)


def resumed_batches(fresh: Iterator[pa.RecordBatch], schema: pa.Schema, seen: KeysSeen,
                    read_range, scan_offset: int, fresh_offset: int, where: str
                    ) -> Iterator[pa.RecordBatch]:
    """The rest of a bucket's scan as of `scan_offset`, from a stream of the bucket as of
    `fresh_offset` (`fresh`, batches in `schema`) and `read_range(start, end)`, the bucket's
    changelog records (see the module docstring)."""
    if fresh_offset < scan_offset:
        raise UnavailableError(
            f"cannot resume the scan of {where} as of offset {scan_offset}: its leader now "
            f"reads it as of offset {fresh_offset}, behind it (retried)")
    pk = seen.primary_key
    key_schema = pa.schema([schema.field(c) for c in pk])
    handed_out = seen.table(key_schema)
    skip, restored = handed_out, None
    if fresh_offset > scan_offset:
        records = changes_since(read_range, scan_offset, fresh_offset)
        if records is not None:
            firsts = first_changes(records, pk)
            skip = pa.concat_tables([handed_out, firsts.select(pk).cast(key_schema)])
            before = firsts.filter(pc.is_in(firsts.column(CHANGE_TYPE),
                                            pa.array(BEFORE_IMAGES)))
            before = before.select(schema.names).cast(schema)
            restored = rows_without(before, handed_out, pk)
    for batch in fresh:
        rest = rows_without(pa.Table.from_batches([batch]), skip, pk)
        yield from rest.to_batches()
    if restored is not None and restored.num_rows:
        yield from restored.to_batches()

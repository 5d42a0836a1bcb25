"""A bucket's rows read: one key, many keys, a snapshot to stream, every row.

Reads take the bucket's lock only to pin what they read (the log end offset and the row
buffer); rows past the row TTL are never returned.
"""

from __future__ import annotations

import weakref
from typing import Callable

import numpy as np
import pyarrow as pa

from merge_engine.format.visible_row import VisibleRows
from merge_engine.kv import changelog as log
from merge_engine.kv.expiry import TabletExpiry
from merge_engine.kv.guard import BucketGuard, LogOffsets
from merge_engine.kv.prefix_reads import PrefixRows
from merge_engine.kv.row_layouts import RowLayouts
from merge_engine.kv.row_snapshot import RowSnapshot
from merge_engine.kv.rows import BucketRows
from merge_engine.kv.storage import TabletStore
from merge_engine.table.hidden_columns import UNWRITTEN
from merge_engine.table.schema import Schema
from merge_engine.write.input import prepare_write
from merge_engine.write.key_prefixes import encoded_prefixes, prefix_table
from merge_engine.write.keys import KeyArray, key_array
from tally.errors import InvalidInputError


class TabletReads:
    """Answers a bucket's reads from its rows (the row buffer, then RocksDB)."""

    def __init__(self, guard: BucketGuard, offsets: LogOffsets, store: TabletStore,
                 rows: BucketRows, images: log.Images, codec: RowLayouts, expiry: TabletExpiry,
                 schema: Schema, arrow_schema: pa.Schema, aggregators: list,
                 value_positions: list[int], visible_rows: VisibleRows | None,
                 empty_rows: Callable, flush: Callable[[], None]):
        self._guard = guard
        self._offsets = offsets
        self._store = store
        self._rows = rows
        self._images = images
        self._codec = codec
        self._expiry = expiry
        self._ttl = expiry.ttl
        self._schema = schema
        self._arrow_schema = arrow_schema
        self._aggregators = aggregators
        self._value_positions = value_positions
        self._visible_rows = visible_rows
        self._time_at = codec.current.time_offset  # a stored row's last-write time
        self._empty_rows = empty_rows  # (write, rows) -> rows of keys without one
        self._flush = flush
        self._snapshots: weakref.WeakSet = weakref.WeakSet()  # released at close

    def lookup(self, key: dict) -> dict | None:
        """The row of `key` (a dict of the primary-key columns), or None."""
        self._guard.check_open()
        if not isinstance(key, dict):
            raise InvalidInputError(f"lookup takes a dict of the primary key columns, got {key!r}")
        write = prepare_write([key], self._schema, self._aggregators, keys_only=True)
        row = self.lookup_row(write.key_columns(self._schema))
        return None if row is None else row.to_pylist()[0]

    def lookup_row(self, key_columns: list[pa.Array]) -> pa.RecordBatch | None:
        """The row of one key as a one-row batch of the tablet's schema, or None. The key is
        one value per primary-key column, in key order, already typed like them and not null
        (the caller checked): a point lookup's key skips the write-input validation."""
        return self.lookup_key(key_array(key_columns))

    def lookup_key(self, key: KeyArray) -> pa.RecordBatch | None:
        """lookup_row() of a key already encoded as the store encodes it (one key)."""
        self._guard.check_open()
        state = self._rows.lookup(key)
        if state is None or (self._ttl is not None and self._expiry.expired(state)[0]):
            return None
        arrays = [c.combine_chunks() if isinstance(c, pa.ChunkedArray) else c
                  for c in self._images.visible_arrays(state)]
        try:  # the types match but for nullability: no cast, which copies every column
            return pa.RecordBatch.from_arrays(arrays, schema=self._arrow_schema)
        except (pa.ArrowInvalid, pa.ArrowTypeError):
            return pa.RecordBatch.from_arrays(arrays, names=self._arrow_schema.names).cast(
                self._arrow_schema)

    def lookup_visible(self, key: KeyArray) -> bytes | None:
        """lookup_key() as a visible row (merge_engine.format.visible_row), or None: a stored row is
        cut out of its bytes when it can be, any other encoded from its visible arrays. Only
        for tablets whose schema has one (`visible_rows` is not None)."""
        self._guard.check_open()
        found = self._rows.lookup_held(key)
        if found is None:
            return None
        rows = self._visible_rows
        cutoff = self._expiry.cutoff()
        if isinstance(found, bytes):
            cut = rows.of_stored(found)
            if cut is not None:
                if cutoff is not None and cutoff >= int.from_bytes(
                        found[self._time_at:self._time_at + 8], "little", signed=True):
                    return None
                return cut
            state, at = self._codec.decode([found]), 0
        else:
            state, at = found  # the row's run in the buffer, not sliced: a slice per column
            # cost as much as encoding the row
        if cutoff is not None and state.times()[at] <= cutoff:
            return None
        if rows.states_are_values:
            return rows.of_arrays(state.columns, at)
        return rows.of_arrays(self._images.visible_arrays(state.slice(at, at + 1)))

    def lookup_many(self, keys, unwritten: bool = False) -> tuple[pa.Table, np.ndarray]:
        """The rows of many keys (a table or list of dicts of the primary-key columns), one row
        per key in input order, and whether each key has a row (where not, its row is
        meaningless). Duplicate keys are fine. `unwritten` adds the hidden `_unwritten`
        column."""
        with self._guard.lock:  # one offset for every key, and no close underneath
            self._guard.check_open()
            write = prepare_write(keys, self._schema, self._aggregators, keys_only=True)
            if write.rows == 0:
                return self._arrow_schema.empty_table(), np.zeros(0, dtype=bool)
            encoded = key_array(write.key_columns(self._schema))
            states, present = self._rows.current(
                encoded, lambda new: self._empty_rows(write, new))
            if self._ttl is not None:
                present = present & ~self._expiry.expired(states)
        rows = self._images.visible(states).cast(self._arrow_schema)
        if unwritten:
            lists = log.unwritten_lists(states.written, self._value_positions,
                                        self._arrow_schema.names)
            rows = rows.append_column(pa.field(UNWRITTEN, pa.list_(pa.string())), lists)
        return rows, present

    def snapshot(self) -> RowSnapshot:
        """The rows as of the log end offset now, to read without holding the tablet's lock
        (merge_engine.kv.row_snapshot). The tablet's close releases it."""
        with self._guard.lock:
            self._guard.check_open()
            cutoff = self._expiry.cutoff()
            snapshot = RowSnapshot(self._offsets.end, self._rows.buffer_copy(),
                                   self._store.row_items(), self._codec, self._aggregators,
                                   self._arrow_schema, self._value_positions, self._guard.name,
                                   cutoff)
            self._snapshots.add(snapshot)
        return snapshot

    def prefix_rows(self, prefixes) -> PrefixRows:
        """The rows whose keys start with `prefixes` (a dict of the leading primary-key
        columns, a list of them or an Arrow table: merge_engine.write.key_prefixes), pinned as
        of the log end offset now like a snapshot, to read without the lock
        (merge_engine.kv.prefix_reads). The tablet's close releases it."""
        table = prefix_table(self._schema.primary_key, self._arrow_schema, prefixes,
                             self._guard.name)
        encoded = encoded_prefixes(table)
        with self._guard.lock:
            self._guard.check_open()
            rows = PrefixRows(self._offsets.end, self._rows.buffer_copy(),
                              self._store.db.iter(), encoded, self._codec, self._aggregators,
                              self._arrow_schema, self._value_positions, self._guard.name,
                              self._expiry.cutoff())
            self._snapshots.add(rows)
        return rows

    def release_snapshots(self) -> None:
        """At close, under the lock: an open iterator would keep RocksDB open."""
        for snapshot in list(self._snapshots):
            snapshot.release()

    def to_arrow(self) -> pa.Table:
        """Every row, ordered by primary key (buffered rows are flushed first)."""
        self._flush()
        tables = [self._images.visible(self._expiry.live(self._codec.decode(chunk)))
                  for chunk in self._store.scan_rows()]
        if not tables:
            return self._arrow_schema.empty_table()
        return pa.concat_tables(tables).cast(self._arrow_schema)

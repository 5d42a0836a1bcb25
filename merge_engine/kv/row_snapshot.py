"""RowSnapshot: a bucket's rows as of one changelog offset, read a batch at a time.

A scan must not hold the bucket's lock while it streams (writers would wait for the slowest
reader), yet every row it returns must belong to one offset. So the tablet takes its lock only
to note the log end offset, copy the row buffer (cheap: the copy shares its runs, and the buffer
replaces its index instead of changing it) and open a RocksDB iterator (rocksdict's `items()`
from the first row key), which reads the database as of its creation (an implicit snapshot that
survives later writes and flushes). The buffered rows are the newest; a stored row whose key
the buffer holds (changed or removed since the last flush) is skipped. rocksdict's
`Snapshot.iter()` does not read at its snapshot (it sees later writes, checked with rocksdict
0.3.29), hence the plain iterator.

An open iterator keeps its RocksDB open: the tablet releases its snapshots when it closes,
after which reading one raises StorageError instead of touching a closed database.
"""

from __future__ import annotations

import threading
from itertools import islice
from typing import Iterator

import numpy as np
import pyarrow as pa

from merge_engine.kv.buffer import ABSENT, RowBuffer
from merge_engine.kv.changelog import unwritten_lists
from merge_engine.kv.storage import ROW
from merge_engine.table.hidden_columns import UNWRITTEN
from merge_engine.write.keys import KeyArray
from merge_engine.write.state import StateBatch
from tally.errors import InvalidInputError, StorageError

# Stored rows read per hold of the snapshot's lock (a closing tablet waits at most this long).
READ_STEP = 4096
ROW_BYTE = ROW[0]  # the row prefix is one byte: a key's first byte tells a row's key
_ENDED = object()  # in place of the items once the stored rows are all read


def scan_schema(arrow_schema: pa.Schema, columns: list[str] | None, unwritten: bool) -> pa.Schema:
    """The schema of a scan's batches: `columns` (all by default) in the order given, then the
    hidden `_unwritten` column when asked for."""
    if columns is None:
        fields = list(arrow_schema)
    else:
        unknown = [c for c in columns if c not in arrow_schema.names]
        if unknown:
            raise InvalidInputError(f"unknown column(s) {unknown}; the table has "
                                    f"{arrow_schema.names}")
        if len(set(columns)) != len(columns):
            raise InvalidInputError(f"columns {columns} name a column twice")
        fields = [arrow_schema.field(c) for c in columns]
    if unwritten:
        fields.append(pa.field(UNWRITTEN, pa.list_(pa.string())))
    return pa.schema(fields)


class RowSnapshot:
    """The rows of one bucket as of changelog offset `offset` (every record below it)."""

    def __init__(self, offset: int, buffer: RowBuffer, items, codec, aggregators,
                 arrow_schema: pa.Schema, value_positions: list[int], name: str,
                 expired_up_to: int | None = None) -> None:
        """`expired_up_to`: rows last written at or before this time (ms) are past the row TTL
        and never returned (None: the table has no row TTL)."""
        self.offset = offset
        self._expired_up_to = expired_up_to
        self._buffer = buffer
        self._items = items  # (key, value) pairs from the first stored row on
        self._codec = codec
        self._aggregators = aggregators
        self._schema = arrow_schema
        self._value_positions = value_positions
        self._name = name
        self._lock = threading.Lock()

    def release(self) -> None:
        """Let go of the RocksDB iterator (the tablet closes); later reads raise."""
        with self._lock:
            self._items = None

    def batches(self, columns: list[str] | None = None, batch_size: int = 65536,
                unwritten: bool = False) -> Iterator[pa.RecordBatch]:
        """The rows as record batches of at most `batch_size` rows, in the scan schema
        (`scan_schema`). Buffered rows come first, run by run (in no key order: each
        run's live rows as they are, not gathered across runs), then stored rows in key
        order. A snapshot is read once."""
        schema = scan_schema(self._schema, columns, unwritten)
        if self._buffer is None:
            raise StorageError(f"a snapshot of {self._name} is read once; take another")
        buffer, self._buffer = self._buffer, None
        for rows in _batched(buffer.live_runs(), batch_size):
            yield self._visible(rows, schema, unwritten)
        width = buffer.key_width
        shadowing = buffer if len(buffer) else None
        while True:
            raw_keys, values = self._read(batch_size)
            if not values:
                return
            states = self._codec.decode(values)
            if shadowing is not None:
                fresh = np.flatnonzero(shadowing.find(_key_array(raw_keys, width)) == ABSENT)
                if len(fresh) < len(values):
                    states = states.take(fresh)
            if len(states):
                yield self._visible(states, schema, unwritten)

    def _read(self, count: int) -> tuple[list[bytes], list[bytes]]:
        """The next `count` stored rows' keys (without the prefix) and values."""
        keys: list[bytes] = []
        values: list[bytes] = []
        while self._items is not _ENDED and len(values) < count:
            with self._lock:
                items = self._items
                if items is None:
                    raise StorageError(f"{self._name} was closed while it was being read")
                step, had = min(READ_STEP, count - len(values)), len(values)
                add_key, add_value = keys.append, values.append  # per row: no lookups
                for key, value in islice(items, step):
                    if key[0] != ROW_BYTE:  # past the rows: other kinds of keys follow them
                        break
                    add_key(key[1:])
                    add_value(value)
                if len(values) - had < step:
                    self._items = _ENDED
        return keys, values

    def _visible(self, states: StateBatch, schema: pa.Schema, unwritten: bool) -> pa.RecordBatch:
        """Rows as readers see them, only the columns of `schema` (values are computed only
        for those: some functions' values cost more than their states)."""
        if self._expired_up_to is not None:
            states = states.take(np.flatnonzero(states.times() > self._expired_up_to))
        names = self._schema.names
        arrays = []
        for field in schema:
            if field.name == UNWRITTEN and unwritten:
                arrays.append(unwritten_lists(states.written, self._value_positions, names))
                continue
            i = names.index(field.name)
            arrays.append(self._aggregators[i].values(states.columns[i]).cast(field.type))
        return pa.RecordBatch.from_arrays(arrays, schema=schema)


def _batched(runs: Iterator[StateBatch], size: int) -> Iterator[StateBatch]:
    """`runs` as batches of at most `size` rows: a big run sliced (no copy), small ones
    joined (a buffer of many small puts would otherwise send many tiny batches)."""
    small: list[StateBatch] = []
    held = 0
    for run in runs:
        if len(run) >= size // 4:
            for start in range(0, len(run), size):
                yield run.slice(start, min(start + size, len(run)))
            continue
        if held + len(run) > size:
            yield StateBatch.concat(*small)
            small, held = [], 0
        small.append(run)
        held += len(run)
    if small:
        yield StateBatch.concat(*small)


def _key_array(raw_keys: list[bytes], width: int | None) -> KeyArray:
    """Stored keys in the buffer's key encoding (fixed width or variable)."""
    if width is None:
        return KeyArray.from_bytes(raw_keys)
    matrix = np.frombuffer(b"".join(raw_keys), dtype=np.uint8).reshape(len(raw_keys), width)
    return KeyArray.from_matrix(matrix)

"""PrefixRows: the rows of a bucket whose keys start with given key prefixes, as of one offset.

A prefix of leading key columns is a byte prefix of the stored keys (merge_engine.write
.key_prefixes), so its rows are one range of RocksDB's sorted row keys: a seek to the prefix
and a step per row while keys still start with it, never a scan of the bucket. Rows merged
since the last flush are still in the row buffer, whose index is sorted by the same bytes: the
prefix's entries there are one range of it too, found by two binary searches. The two ranges
are merged in key order, a buffered entry (a newer row, or a deletion) hiding the stored row
of its key, exactly as a point lookup reads a key from the buffer first.

Everything is pinned as a scan's RowSnapshot pins it (under the bucket's lock: the log end
offset, a copy of the row buffer, a RocksDB iterator, which reads the database as of its
creation) and read without the lock; rows past the row TTL at that moment are left out, and
`unwritten` adds the same hidden column as a scan.
"""

from __future__ import annotations

from typing import Iterator

import numpy as np
import pyarrow as pa

from merge_engine.kv.buffer import RowBuffer
from merge_engine.kv.row_snapshot import READ_STEP, RowSnapshot, scan_schema
from merge_engine.kv.storage import ROW
from merge_engine.write.state import StateBatch
from tally.errors import StorageError

_BUFFERED, _STORED = 0, 1


class PrefixRows(RowSnapshot):
    """The rows of the bucket under `prefixes` (encoded, see key_prefixes) as of `offset`,
    in key order; `iterator` is a RocksDB iterator made with the buffer's copy."""

    def __init__(self, offset: int, buffer: RowBuffer, iterator, prefixes: list[bytes],
                 codec, aggregators, arrow_schema: pa.Schema, value_positions: list[int],
                 name: str, expired_up_to: int | None = None) -> None:
        super().__init__(offset, buffer, iterator, codec, aggregators, arrow_schema,
                         value_positions, name, expired_up_to)
        # distinct and sorted: prefixes of one column set delimit themselves, so their
        # ranges never overlap and the answer comes out in key order
        self._prefixes = sorted(set(prefixes))
        self._at: bytes | None = None  # the prefix the iterator was positioned for

    def batches(self, columns: list[str] | None = None, batch_size: int = 65536,
                unwritten: bool = False) -> Iterator[pa.RecordBatch]:
        """The rows as record batches of at most `batch_size` rows in the scan schema
        (`scan_schema`), in key order. Read once."""
        schema = scan_schema(self._schema, columns, unwritten)
        if self._buffer is None:
            raise StorageError(f"a prefix read of {self._name} is read once; take another")
        buffer, self._buffer = self._buffer, None
        for prefix in self._prefixes:
            for states in self._prefix_states(buffer, prefix, batch_size):
                for start in range(0, len(states), batch_size):
                    rows = self._visible(states.slice(start, min(start + batch_size,
                                                                 len(states))),
                                         schema, unwritten)
                    if rows.num_rows:
                        yield rows

    def to_table(self, columns: list[str] | None = None, unwritten: bool = False) -> pa.Table:
        """Every row as one table, in key order."""
        schema = scan_schema(self._schema, columns, unwritten)
        return pa.Table.from_batches(list(self.batches(columns, 65536, unwritten)),
                                     schema=schema)

    def _prefix_states(self, buffer: RowBuffer, prefix: bytes,
                       step: int) -> Iterator[StateBatch]:
        """The rows under one prefix, `step` stored rows (and the buffered ones among them)
        at a time, in key order."""
        keys, ids = buffered_range(buffer, prefix)
        hidden = set(keys)  # a buffered key's stored row is older, or deleted since
        runs = buffer.runs()
        taken = 0  # buffered entries handed out so far
        while True:
            stored_keys, values = self._read_prefix(prefix, step)
            ended = len(values) < step
            # buffered entries up to the last stored key read (all of them at the end)
            upto = len(keys) if ended else _count_not_after(keys, taken, stored_keys[-1])
            entries = [(k, _STORED, i) for i, k in enumerate(stored_keys) if k not in hidden]
            entries += [(keys[j], _BUFFERED, int(ids[j])) for j in range(taken, upto)
                        if ids[j] >= 0]
            taken = upto
            if entries:
                entries.sort()
                sources = list(runs)
                placed = sum(len(run) for run in sources)
                if values:
                    sources.append(self._codec.decode(values))
                where = np.array([i if kind == _BUFFERED else placed + i
                                  for _, kind, i in entries], dtype=np.int64)
                yield StateBatch.gather(sources, where)
            if ended:
                return

    def _read_prefix(self, prefix: bytes, count: int) -> tuple[list[bytes], list[bytes]]:
        """The next `count` stored rows under `prefix` (their keys without the row prefix,
        and their values); fewer once its range ends. The iterator is positioned at the
        prefix's first key on the first call for it."""
        start = ROW + prefix
        keys: list[bytes] = []
        values: list[bytes] = []
        while len(values) < count:
            with self._lock:
                iterator = self._items
                if iterator is None:
                    raise StorageError(f"{self._name} was closed while it was being read")
                if self._at != prefix:
                    iterator.seek(start)
                    self._at = prefix
                for _ in range(min(READ_STEP, count - len(values))):
                    if not iterator.valid():
                        return keys, values
                    key = iterator.key()
                    if not key.startswith(start):
                        return keys, values
                    keys.append(key[1:])
                    values.append(iterator.value())
                    iterator.next()
        return keys, values


def buffered_range(buffer: RowBuffer, prefix: bytes) -> tuple[list[bytes], np.ndarray]:
    """(the keys under `prefix` the row buffer holds, in key order, and each one's row id or
    REMOVED). The buffer offers no range read of its own: its index (sorted keys as numpy
    values that compare like their bytes, with ids) is replaced whole, never changed in
    place, so reading it once here sees one consistent state."""
    index = buffer._index  # noqa: SLF001 - see the docstring
    found = index.keys
    if found is None or not len(index.ids):
        return [], np.empty(0, dtype=np.int64)
    search = found.search
    if search.dtype == np.uint64:  # fixed-width keys of up to 8 bytes, zero padded
        width = found.width
        if len(prefix) > width:
            return [], np.empty(0, dtype=np.int64)
        low = np.uint64(int.from_bytes(prefix.ljust(8, b"\x00"), "big"))
        high = np.uint64(int.from_bytes((prefix + b"\xff" * (width - len(prefix)))
                                        .ljust(8, b"\x00"), "big"))
    else:  # 'S<n>' values, compared as their bytes zero padded to n
        size = search.dtype.itemsize
        if len(prefix) > size:
            return [], np.empty(0, dtype=np.int64)
        low = np.array([prefix], dtype=search.dtype)[0]
        high = np.array([prefix + b"\xff" * (size - len(prefix))], dtype=search.dtype)[0]
    lo = int(np.searchsorted(search, low, side="left"))
    hi = int(np.searchsorted(search, high, side="right"))
    if lo >= hi:
        return [], np.empty(0, dtype=np.int64)
    keys = found.take(slice(lo, hi)).to_list()
    ids = index.ids[lo:hi]
    exact = [i for i, k in enumerate(keys) if k.startswith(prefix)]  # the padding's near misses
    if len(exact) < len(keys):
        keys, ids = [keys[i] for i in exact], ids[exact]
    return keys, ids


def _count_not_after(keys: list[bytes], start: int, last: bytes) -> int:
    """The position after the keys from `start` on that are at most `last` (sorted keys)."""
    at = start
    while at < len(keys) and keys[at] <= last:
        at += 1
    return at

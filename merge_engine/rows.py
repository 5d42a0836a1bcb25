"""BucketRows: a bucket's current rows, the RowBuffer in front of RocksDB's row keys.

KvTablet decides what a write changes and commits its one write batch; this class decides where
the changed rows live. A put's rows join the buffer after its changelog batch commits, or, when
the buffer would outgrow its limit, the whole buffer goes into that same write batch (with the
offset the rows are then applied up to). Reads look in the buffer first, then in RocksDB. See merge_engine/buffer.py for
why the rows wait in memory and how a crash is recovered (replay of the changelog).
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Iterable

import numpy as np
from rocksdict import WriteBatch

from merge_engine.buffer import ABSENT, ENTRY_BYTES, REMOVED, RowBuffer
from merge_engine.keys import KeyArray
from merge_engine.rowcodec import RowCodec
from merge_engine.state import StateBatch
from merge_engine.storage import KV_APPLIED, ROW, TabletStore
from tally.errors import StorageError

ENCODE_ROWS = 65536  # rows encoded at a time when buffered rows go to RocksDB


# Rows are flushed once the changelog since the last flush reaches this many buffer sizes, so a
# hot key set that never fills the buffer still leaves a bounded changelog to replay.
REPLAY_FACTOR = 4


@dataclasses.dataclass(frozen=True)
class StagedRows:
    """What one write changes in the rows, between staging and its commit."""

    flushed: bool               # the write batch carries every buffered row
    keys: KeyArray
    rows: StateBatch | None
    removed: KeyArray
    log_bytes: int


class BucketRows:
    """Rows by encoded key. Writes are serialised by the tablet; reads may run alongside."""

    def __init__(self, store: TabletStore, codec: RowCodec, buffer_limit: int):
        self._store = store
        self._codec = codec
        self._limit = buffer_limit
        self._buffer = RowBuffer()
        self._log_bytes = 0  # changelog written since the last flush: what a crash replays

    # --- reads ------------------------------------------------------------------------------

    def current(self, keys: KeyArray,
                empty_rows: Callable[[np.ndarray], StateBatch]) -> tuple[StateBatch, np.ndarray]:
        """Each key's current row (`empty_rows(positions)` for keys without one) and whether it
        exists. Buffered rows are taken as Arrow; the rest come from one RocksDB multi-get."""
        buffer = self._buffer
        ids = buffer.find(keys)
        unknown = np.nonzero(ids == ABSENT)[0]
        stored = self._store.get_rows(keys.take(unknown).to_list())
        found = np.fromiter((v is not None for v in stored), dtype=bool, count=len(stored))
        present = ids >= 0
        present[unknown[found]] = True
        # Concatenate the three sources, then one take puts the rows in key order.
        parts, where, placed = [], np.empty(len(keys), dtype=np.int64), 0
        buffered = np.nonzero(ids >= 0)[0]
        if len(buffered):
            rows, order = buffer.states_grouped(ids[buffered])
            parts.append(rows)
            where[buffered[order]] = np.arange(len(rows))
            placed = len(rows)
        from_store = unknown[found]
        if len(from_store):
            parts.append(self._codec.decode([v for v in stored if v is not None]))
            where[from_store] = placed + np.arange(len(from_store))
            placed += len(from_store)
        new = np.nonzero(~present)[0]
        if len(new):
            parts.append(empty_rows(new))
            where[new] = placed + np.arange(len(new))
        state = parts[0] if len(parts) == 1 else StateBatch.concat(*parts)
        if len(where) > 1 and not (where[1:] > where[:-1]).all():
            state = state.take(where)
        return state, present

    def lookup(self, key: KeyArray) -> StateBatch | None:
        """One key's row (`key` holds one key), or None."""
        buffer = self._buffer  # one buffer for the whole read: a flush replaces it
        found = buffer.find(key)[0]
        if found == REMOVED:
            return None
        if found >= 0:
            return buffer.states(np.array([found]))
        stored = self._store.get_rows(key.to_list())[0]
        return None if stored is None else self._codec.decode([stored])

    def buffer_copy(self) -> RowBuffer:
        """The buffered rows as they are now, unchanged by later writes (for a snapshot)."""
        return self._buffer.copy()

    @property
    def buffered_bytes(self) -> int:
        return self._buffer.size_bytes

    # --- writes -----------------------------------------------------------------------------

    def stage(self, batch: WriteBatch, applied: int, keys: KeyArray, rows: StateBatch | None,
              removed: KeyArray, log_bytes: int) -> "StagedRows":
        """Prepare a write's changed rows (`keys` aligned with `rows`) and removed keys; the
        caller commits `batch` (the write's changelog of `log_bytes` and its offsets), then
        hands the result to `committed`. If the rows would outgrow the buffer, or leave more
        changelog than REPLAY_FACTOR buffers to replay after a crash, every buffered row goes
        into `batch` too, applied up to offset `applied` (the write's end). Readers keep seeing
        the current buffer until `committed`, so a write that fails to commit shows nothing."""
        growth = (rows.nbytes if rows is not None else 0) + ENTRY_BYTES * (len(keys) + len(removed))
        flush = bool(growth) and (self._buffer.size_bytes + growth > self._limit
                                  or self._log_bytes + log_bytes > REPLAY_FACTOR * self._limit)
        if flush:
            pending = self._buffer.copy()
            pending.add(keys, rows, removed)
            self._write(batch, pending, applied)
        return StagedRows(flush, keys, rows, removed, log_bytes)

    def committed(self, staged: "StagedRows") -> None:
        """The staged write's batch is in RocksDB: its rows join the buffer (or, when they went
        to RocksDB with every buffered row, the buffer starts empty)."""
        if staged.flushed:
            self._buffer, self._log_bytes = RowBuffer(), 0
            return
        self._log_bytes += staged.log_bytes
        self._buffer.add(staged.keys, staged.rows, staged.removed)
        if self._buffer.wants_compaction(self._limit):
            self._buffer = self._buffer.compacted()

    def flush(self, applied: int) -> None:
        """Write the buffered rows to RocksDB, applied up to offset `applied` (the log end)."""
        if len(self._buffer) == 0 and self.applied_offset() == applied:
            return
        batch = self._store.new_batch()
        self._write(batch, self._buffer, applied)
        self._store.commit(batch)
        self._buffer, self._log_bytes = RowBuffer(), 0

    def applied_offset(self) -> int:
        """The changelog offset RocksDB's rows are applied up to (set when the bucket is made)."""
        applied = self._store.get_int(KV_APPLIED, -1)
        if applied < 0:
            raise StorageError("The bucket's rows record no applied offset: the tablet is corrupt")
        return applied

    def replay(self, changes: Iterable[tuple[KeyArray, StateBatch, KeyArray]],
               log_end: int) -> None:
        """Rebuild the buffer from changelog changes past the last flush, oldest first: per
        write, (upserted keys, their after-images, removed keys). Then flush."""
        for keys, rows, removed in changes:
            self._buffer.add(keys, rows, removed)
            if self._buffer.wants_compaction(self._limit):
                self._buffer = self._buffer.compacted()
        self.flush(log_end)

    def _write(self, batch: WriteBatch, buffer: RowBuffer, applied: int) -> None:
        keys, rows, removed = buffer.drain()
        if rows is not None:
            put = batch.put
            # Encoded a slice at a time: the rows of one large write as Python bytes objects
            # at once took several times the write's own size on top of the write batch.
            for start in range(0, len(rows), ENCODE_ROWS):
                stop = min(start + ENCODE_ROWS, len(rows))
                chunk = keys.take(np.arange(start, stop)).to_list()
                for key, value in zip(chunk, self._codec.encode(rows.slice(start, stop))):
                    put(ROW + key, value)
        if removed is not None:
            for key in removed.to_list():
                batch.delete(ROW + key)
        TabletStore.put_int(batch, KV_APPLIED, applied)

    @staticmethod
    def initialise(batch: WriteBatch) -> None:
        """Mark a new bucket's (empty) rows as applied up to offset 0."""
        TabletStore.put_int(batch, KV_APPLIED, 0)

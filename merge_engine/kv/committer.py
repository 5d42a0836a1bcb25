"""Where every change of a bucket lands: one atomic RocksDB write batch per commit.

A write, an undo, the row TTL's sweep and a follower's copy of the leader's entries all end
the same way: their changelog records, the new log end offset and the writer's sequence are
committed at once, after which the changed rows join the row buffer, which is flushed to
RocksDB in batches of its own when full. The changelog is the write-ahead log: a crash before
the buffer's flush loses nothing (a reopen replays it).
"""

from __future__ import annotations

import contextlib
import functools
from typing import Callable

from merge_engine.kv import changelog as log
from merge_engine.kv.guard import BucketGuard, LogOffsets
from merge_engine.kv.pending_write import PendingWrite
from merge_engine.kv.rows import BucketRows
from merge_engine.kv.storage import TabletStore
from tally.errors import InvalidInputError, StorageWriteError


class Committer:
    """Opens a bucket's writes (PendingWrite), commits them and flushes its row buffer."""

    def __init__(self, guard: BucketGuard, offsets: LogOffsets, store: TabletStore,
                 images: log.Images, rows: BucketRows, buffer_size: int,
                 clock: Callable[[], float], row_changes: Callable):
        self._guard = guard
        self._offsets = offsets
        self._store = store
        self._images = images
        self._rows = rows
        self._buffer_size = buffer_size
        self._clock = clock  # stamps changelog entries (seconds, like time.time)
        self._row_changes = row_changes  # (start, end) -> what those records do to the rows

    def pending(self) -> PendingWrite:
        """A new write from the log end offset, timed now."""
        return PendingWrite(self._store, self._images, self._offsets.end, self._buffer_size,
                            int(self._clock() * 1000))

    def replayed(self, writer) -> int | None:
        """The recorded end offset if this (writer id, sequence) was already applied."""
        if writer is None:
            return None
        if not (isinstance(writer, tuple) and len(writer) == 2 and isinstance(writer[0], str)
                and isinstance(writer[1], int)):
            raise InvalidInputError(f"writer must be a (writer_id: str, sequence: int) pair, got {writer!r}")
        state = self._store.writer_state(writer[0])
        if state is not None and writer[1] <= state[0]:
            return state[1]
        return None

    def commit(self, pending: PendingWrite, writer) -> int:
        """The write's one atomic RocksDB write batch: its changelog, offsets and writer
        sequence; then its changed rows join the buffer, which may flush. The end offset
        after it."""
        staged = pending.seal(self._rows, writer)
        return self.commit_batch(pending.batch, staged, pending.end)

    def commit_batch(self, batch, staged, end: int) -> int:
        """Commit `batch` (changelog entries up to `end`, END_OFFSET), then hand the rows
        `staged` for it (if any) to the row buffer. The new log end offset."""
        start = self._offsets.end
        if not batch.is_empty():
            self._store.commit(batch)
        self._offsets.end = end
        if staged is not None:
            # The write is committed even if the disk refuses the flush: the buffer keeps its
            # rows, and the store refuses the next write (a reopen replays the changelog).
            with contextlib.suppress(StorageWriteError):
                self._rows.committed(staged, start, end,
                                     functools.partial(self._row_changes, start, end))
        return end

    def flush(self) -> None:
        """Write the buffered rows to RocksDB now (close and log truncation do this too)."""
        with self._guard.lock:
            self._guard.check_open()
            self._rows.flush(self._offsets.end)

    def flush_if_open(self) -> None:
        """flush(), or nothing once closed (a memory budget may ask while another thread closes)
        or once the disk refused a write (storage_failure, which a refused flush sets)."""
        with self._guard.lock, contextlib.suppress(StorageWriteError):
            if not self._guard.closed and self._store.failure is None:
                self._rows.flush(self._offsets.end)

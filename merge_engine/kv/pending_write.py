"""PendingWrite: one write's RocksDB batch, assembled a slice of merged keys at a time.

Each slice's changelog records become their own entry as soon as the slice is merged (at
consecutive offsets, in key order, so the log reads as one write's records), and only the
changed rows are kept for the row buffer (RowsKept, which may drop them for the log to give
back); `seal` puts the entries, the offsets and the writer's sequence into the batch and stages
the rows; the tablet then writes the batch atomically. Until then nothing is visible and
nothing is stored.

A large entry is encoded (Arrow IPC, LZ4) on a worker thread: Arrow lets go of the GIL while
it encodes, so the put meanwhile merges its next slice and prepares the row buffer it will
install after the commit (BucketRows.prepare). On the ingest benchmark's repeated keys the
encoding of a 100,000-row put's entry took twice as long as that preparation, and the put
waited for the rest: so a slice whose images hold SPLIT_FROM_BYTES or more makes two entries
(the records of each half of its keys), encoded on two workers at once.
"""

from __future__ import annotations

import os
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np

from merge_engine.kv import changelog as log
from merge_engine.kv.rows import RowsKept
from merge_engine.kv.storage import END_OFFSET, TabletStore
from merge_engine.write.keys import KeyArray
from merge_engine.write.state import StateBatch

# A slice's images (before and after) this large make two changelog entries, encoded side by
# side.
SPLIT_FROM_BYTES = 4 << 20

# Shared by every bucket of the process; each write waits for its own entries only, in order.
# Made on first use, and again in a forked child: a child inherits the pool but not its
# threads, so work given to the inherited pool would never run.
_encoder: ThreadPoolExecutor | None = None
_encoder_lock = threading.Lock()


def _forget_encoder() -> None:
    global _encoder, _encoder_lock
    _encoder, _encoder_lock = None, threading.Lock()


os.register_at_fork(after_in_child=_forget_encoder)


def encoder() -> ThreadPoolExecutor:
    """The process's pool that encodes large changelog entries."""
    global _encoder
    with _encoder_lock:
        if _encoder is None:
            _encoder = ThreadPoolExecutor(max_workers=2, thread_name_prefix="changelog-entry")
        return _encoder


class PendingWrite:
    def __init__(self, store: TabletStore, images: log.Images, end: int,
                 keep_bytes: int, now_ms: int | None = None) -> None:
        """`keep_bytes`: the most changed rows kept in memory (the row buffer's limit);
        `now_ms`: the write's time by the tablet's clock (the row TTL's), by default the wall
        clock. The changelog entry's time (retention) is always the wall clock's."""
        self._store, self._images = store, images
        self.batch = store.new_batch()
        self.end = end
        self._written = int(time.time() * 1000)
        self.now_ms = self._written if now_ms is None else now_ms
        self._log_bytes = 0
        self._last_entry = end  # first offset of the write's last changelog entry
        self._changed = False
        self._kept = RowsKept(keep_bytes)
        # (first offset, encoded entry or its Future, Arrow bytes of its records)
        self._entries: list[tuple[int, bytes | Future, int]] = []

    def add(self, keys: KeyArray, before: StateBatch, after: StateBatch,
            outcome: np.ndarray, expired: np.ndarray | None = None) -> None:
        """Merged keys (aligned with their before and after states) and each key's outcome;
        `expired` marks the removals that are the row TTL's."""
        entries = len(self._entries)
        for start, stop in _entry_keys(len(keys), before.nbytes + after.nbytes):
            records = self._images.build_records(
                before.slice(start, stop), after.slice(start, stop), outcome[start:stop],
                None if expired is None else expired[start:stop])
            if records is not None:
                self._add_entry(records)
        if len(self._entries) == entries:  # nothing changed
            return
        changed = np.nonzero((outcome == log.INSERTED) | (outcome == log.UPDATED))[0]
        rows = None if not len(changed) else \
            after if len(changed) == len(after) else after.take(changed)
        self._kept.add(keys.take(changed), rows, keys.take(np.nonzero(outcome == log.REMOVED)[0]))

    def _add_entry(self, records) -> None:
        # A small entry is encoded here: a thread hop would cost more than the encoding.
        data = encoder().submit(log.serialize, records) \
            if records.nbytes >= log.COMPRESS_FROM_BYTES else log.serialize(records)
        self._entries.append((self.end, data, records.nbytes))
        self._last_entry = self.end
        self.end += records.num_rows
        self._changed = True

    def seal(self, rows, writer: tuple[str, int] | None):
        """Finish the batch: the offsets, the writer's sequence, and the changed rows staged
        with `rows` (BucketRows). The caller commits `batch` (if not empty), then hands the
        result, when there is one, to `rows.committed`. Without changes only the writer's
        sequence is recorded.

        The writer also goes beside the write's last changelog entry: a follower that copies
        the entries then records the sequence with the write's end offset, and only once it
        holds the whole write; cutting the log's tail finds the writers' earlier states there."""
        prepared = rows.prepare(self._kept) if self._changed else None
        entries = []
        for offset, data, nbytes in self._entries:
            if isinstance(data, Future):
                data = data.result()
            entries.append((offset, data, self._written))
            # What a crash would replay, read and decoded: the row buffer's flush rule bounds
            # it. A large entry is stored compressed (smaller than its rows); a small one
            # carries its schema (larger than its rows): the larger of the two counts.
            self._log_bytes += max(nbytes, len(data))
        self._entries = []
        if self._changed:
            TabletStore.put_int(self.batch, END_OFFSET, self.end)
        if writer is not None:
            TabletStore.put_writer(self.batch, writer[0], writer[1], self.end)
            if self._changed:
                TabletStore.put_entry_writer(self.batch, self._last_entry, writer[0], writer[1])
        TabletStore.put_log_entries(self.batch, entries)  # last: see put_log_entries
        if not self._changed:
            return None
        kept, self._kept = self._kept, RowsKept(0)
        return rows.stage(kept, self._log_bytes, prepared)


def _entry_keys(keys: int, image_bytes: int) -> list[tuple[int, int]]:
    """The ranges of a merged slice's keys whose records become one changelog entry each: the
    first and second half of the keys when their images (before and after) hold
    SPLIT_FROM_BYTES or more, else all of them. A key's records (its -U and +U) are always in
    one entry. The first half's records are built and sent to be encoded before the second
    half's are built, so the encoding starts that much earlier: the put otherwise waited for
    it, with a core idle while it merged."""
    if image_bytes < SPLIT_FROM_BYTES or keys < 2:
        return [(0, keys)]
    return [(0, keys // 2), (keys // 2, keys)]

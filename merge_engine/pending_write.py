"""PendingWrite: one write's RocksDB batch, assembled a slice of merged keys at a time.

Each slice's changelog records go into the batch as their own entry as soon as the slice is
merged (at consecutive offsets, in key order, so the log reads as one write's records), and
only the changed rows are kept for the row buffer (RowsKept, which may drop them for the log
to give back); `seal` adds the offsets and the writer's sequence and stages the rows; the
tablet then writes the batch atomically. Until then nothing is visible and nothing is stored.
"""

from __future__ import annotations

import time

import numpy as np

from merge_engine import changelog as log
from merge_engine.keys import KeyArray
from merge_engine.rows import RowsKept
from merge_engine.state import StateBatch
from merge_engine.storage import END_OFFSET, TabletStore


class PendingWrite:
    def __init__(self, store: TabletStore, images: log.Images, end: int,
                 keep_bytes: int) -> None:
        """`keep_bytes`: the most changed rows kept in memory (the row buffer's limit)."""
        self._store, self._images = store, images
        self.batch = store.new_batch()
        self.end = end
        self._now = int(time.time() * 1000)
        self._log_bytes = 0
        self._changed = False
        self._kept = RowsKept(keep_bytes)

    def add(self, keys: KeyArray, before: StateBatch, after: StateBatch,
            outcome: np.ndarray) -> None:
        """Merged keys (aligned with their before and after states) and each key's outcome."""
        records = self._images.build_records(before, after, outcome)
        if records is None:
            return
        data = log.serialize(records)
        TabletStore.put_log_entry(self.batch, self.end, data, self._now)
        self.end += records.num_rows
        self._log_bytes += len(data)
        self._changed = True
        changed = np.nonzero((outcome == log.INSERTED) | (outcome == log.UPDATED))[0]
        rows = None if not len(changed) else \
            after if len(changed) == len(after) else after.take(changed)
        self._kept.add(keys.take(changed), rows, keys.take(np.nonzero(outcome == log.REMOVED)[0]))

    def seal(self, rows, writer: tuple[str, int] | None):
        """Finish the batch: the offsets, the writer's sequence, and the changed rows staged
        with `rows` (BucketRows). The caller commits `batch` (if not empty), then hands the
        result, when there is one, to `rows.committed`. Without changes only the writer's
        sequence is recorded."""
        if self._changed:
            TabletStore.put_int(self.batch, END_OFFSET, self.end)
        if writer is not None:
            TabletStore.put_writer(self.batch, writer[0], writer[1], self.end)
        if not self._changed:
            return None
        kept, self._kept = self._kept, RowsKept(0)
        return rows.stage(kept, self._log_bytes)

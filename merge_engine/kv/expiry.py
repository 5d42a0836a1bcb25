"""The row TTL's side of a bucket: reads hide expired rows, a sweep writes their -D.

The rules (cutoffs, what counts as expired) are merge_engine.kv.row_ttl's; a write's own
expiry of the rows it loads is the write path's.
"""

from __future__ import annotations

import numpy as np

from merge_engine.kv import changelog as log
from merge_engine.kv.committer import Committer
from merge_engine.kv.guard import BucketGuard, LogOffsets
from merge_engine.kv.row_layouts import RowLayouts
from merge_engine.kv.row_ttl import RowTtl
from merge_engine.kv.rows import BucketRows
from merge_engine.kv.storage import TabletStore
from merge_engine.table.schema import Schema
from merge_engine.write.keys import key_array
from merge_engine.write.state import StateBatch


class TabletExpiry:
    """Which rows are past a bucket's row TTL (`ttl`, None without one), and the sweep."""

    def __init__(self, ttl: RowTtl | None, guard: BucketGuard, offsets: LogOffsets,
                 store: TabletStore, rows: BucketRows, codec: RowLayouts, schema: Schema,
                 committer: Committer):
        self.ttl = ttl
        self._guard = guard
        self._offsets = offsets
        self._store = store
        self._rows = rows
        self._codec = codec
        self._key_at = [schema.names.index(k) for k in schema.primary_key]
        self._committer = committer

    def cutoff(self) -> int | None:
        """The last-write time at or below which a row is expired now (None: no row TTL)."""
        return None if self.ttl is None else self.ttl.cutoff(self.ttl.now_ms())

    def expired(self, states: StateBatch) -> np.ndarray:
        """Which of `states` are past the row TTL now (only with one)."""
        return RowTtl.expired(states, self.ttl.cutoff(self.ttl.now_ms()))

    def live(self, states: StateBatch) -> StateBatch:
        """`states` without the rows past the row TTL (reads never return those)."""
        if self.ttl is None:
            return states
        return states.take(np.flatnonzero(~self.expired(states)))

    def expire_rows(self) -> int:
        """The sweep of the row TTL (merge_engine.kv.row_ttl): write the -D (`_expired`) of every
        row past it; returns how many. One commit per stored chunk of rows."""
        if self.ttl is None:
            return 0
        expired = 0
        with self._guard.lock:
            self._guard.check_open()
            self._rows.flush(self._offsets.end)  # then every row is in RocksDB, the iterator's view
            pending = self._committer.pending()
            cutoff = self.ttl.cutoff(pending.now_ms)
            for chunk in self._store.scan_rows():
                states = self._codec.decode(chunk)
                gone = np.flatnonzero(RowTtl.expired(states, cutoff))
                if not len(gone):
                    continue
                old = states.take(gone)
                keys = key_array([old.columns[i] for i in self._key_at])
                pending.add(keys, old, old, np.full(len(gone), log.REMOVED, dtype=np.int8),
                            np.ones(len(gone), dtype=bool))
                self._committer.commit(pending, None)
                pending = self._committer.pending()
                expired += len(gone)
        return expired

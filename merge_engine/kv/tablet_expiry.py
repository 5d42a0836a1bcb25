"""The row TTL's side of a bucket: reads hide expired rows, a sweep writes their -D.

Part of KvTablet, kept apart by concern; the rules (cutoffs, what counts as expired) are
merge_engine.kv.row_ttl's.
"""

from __future__ import annotations

import numpy as np

from merge_engine.kv import changelog as log
from merge_engine.kv.row_ttl import RowTtl
from merge_engine.write.keys import key_array
from merge_engine.write.state import StateBatch


class TabletExpiry:
    """KvTablet's row-TTL reads and sweep (a part of KvTablet, not used alone)."""

    def _expired(self, states: StateBatch) -> np.ndarray:
        return RowTtl.expired(states, self._ttl.cutoff(self._ttl.now_ms()))

    def _live(self, states: StateBatch) -> StateBatch:
        """`states` without the rows past the row TTL (reads never return those)."""
        if self._ttl is None:
            return states
        return states.take(np.flatnonzero(~self._expired(states)))

    def expire_rows(self) -> int:
        """The sweep of the row TTL (merge_engine.kv.row_ttl): write the -D (`_expired`) of every
        row past it; returns how many. One commit per stored chunk of rows."""
        if self._ttl is None:
            return 0
        expired = 0
        with self._lock:
            self._check_open()
            self._rows.flush(self._end)  # then every row is in RocksDB, the iterator's view
            pending = self._pending()
            cutoff = self._ttl.cutoff(pending.now_ms)
            key_at = [self.schema.names.index(k) for k in self.schema.primary_key]
            for chunk in self._store.scan_rows():
                states = self.codec.decode(chunk)
                gone = np.flatnonzero(RowTtl.expired(states, cutoff))
                if not len(gone):
                    continue
                old = states.take(gone)
                keys = key_array([old.columns[i] for i in key_at])
                pending.add(keys, old, old, np.full(len(gone), log.REMOVED, dtype=np.int8),
                            np.ones(len(gone), dtype=bool))
                self._commit(pending, None)
                pending = self._pending()
                expired += len(gone)
        return expired

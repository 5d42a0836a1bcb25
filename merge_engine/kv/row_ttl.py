"""Row TTL (`table.kv.row-ttl`): a key not written for longer than the TTL expires.

Each row of such a table stores when its key was last written (`StateBatch.touched`, ms since
the epoch by the tablet's clock), and every changelog image carries that time (`_written_ms`),
so replay rebuilds it exactly. A row written at t is live while now < t + ttl.

- Reads (lookups, scans, to_arrow) never return an expired row, whether or not its -D has been
  written yet.
- Its -D is written lazily, by the first write that touches the key (before that write's own
  records, which then insert the key anew), or by a sweep (`KvTablet.expire_rows`, which tablet
  servers run periodically). Either way the -D carries `_expired = true`, telling it apart from a
  delete, and the full image, so nothing a later undo needs is lost.
- Every write of a key refreshes it, even one that changes no value (then -U/+U differ only in
  `_written_ms`).
- Undo skips `_expired` -D records (an expiry is not the undone writer's change) and writes back
  baseline images with their original `_written_ms`: a row the undone writes kept alive only
  by refreshing it stays expired, and a restored row expires when it would have without them.
  A write whose resulting row is already past the TTL (only a restored time can be) stores
  nothing for a new key and expires an existing one.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from merge_engine.kv import changelog as log
from merge_engine.write.input import WriteInput
from merge_engine.write.keys import KeyArray
from merge_engine.write.state import StateBatch

Clock = Callable[[], float]  # seconds since the epoch, like time.time


class RowTtl:
    """The expiry rule of one table, judged by an injectable clock (tests move it)."""

    def __init__(self, ttl_ms: int, clock: Clock):
        self.ttl_ms = ttl_ms
        self.clock = clock

    def now_ms(self) -> int:
        return int(self.clock() * 1000)

    def cutoff(self, now_ms: int) -> int:
        """Rows last written at or before this time are expired at `now_ms`."""
        return now_ms - self.ttl_ms

    @staticmethod
    def expired(states: StateBatch, cutoff: int) -> np.ndarray:
        return states.times() <= cutoff

    def expire_loaded(self, pending, keys: KeyArray, before: StateBatch, present: np.ndarray,
                      empty_rows: Callable[[np.ndarray], StateBatch]):
        """Lazy expiry in a write (`pending`, a PendingWrite): the -D of each loaded row past
        the TTL goes before the write's own records, and the write then finds its key new
        (`empty_rows(positions)`). The loaded rows and whether each key has one."""
        gone = present & self.expired(before, self.cutoff(pending.now_ms))
        if not gone.any():
            return before, present
        idx = np.flatnonzero(gone)
        old = before.take(idx)
        pending.add(keys.take(idx), old, old, np.full(len(idx), log.REMOVED, dtype=np.int8),
                    np.ones(len(idx), dtype=bool))
        where = np.arange(len(before))
        where[idx] = len(before) + np.arange(len(idx))
        before = StateBatch.concat(before, empty_rows(idx)).take(where)
        return before, present & ~gone

    def expire_merged(self, after: StateBatch, outcome: np.ndarray, present: np.ndarray,
                      now_ms: int):
        """A merged row already past the TTL (only a restored `_written_ms` can be): a new key
        is not stored, an existing one expires. The outcome, and which removals are expiries."""
        stale = (outcome != log.UNCHANGED) & (outcome != log.REMOVED) \
            & self.expired(after, self.cutoff(now_ms))
        if not stale.any():
            return outcome, None
        outcome = outcome.copy()
        outcome[stale & ~present] = log.UNCHANGED
        outcome[stale & present] = log.REMOVED
        return outcome, stale & present

    @staticmethod
    def stamp(after: StateBatch, before: StateBatch, write: WriteInput, group_ids: np.ndarray,
              now_ms: int) -> None:
        """Set each merged key's last-write time: now, or the `_written_ms` an OVERWRITE
        restores (the key's last row with one decides, as its values do). A restore of some
        columns only (the undo of a column lock's writer) keeps the row's time when that is
        later: other writers' refreshes of the key are not undone."""
        touched = np.full(len(after), now_ms, dtype=np.int64)
        if write.written_ms is not None:
            given = np.array([-1 if v is None else int(v) for v in write.written_ms],
                             dtype=np.int64)
            rows = np.flatnonzero(given >= 0)
            # Later rows overwrite earlier ones: assign in row order, last assignment wins.
            last = {}
            for row in rows.tolist():
                last[int(group_ids[row])] = given[row]
            if last:
                touched[np.fromiter(last.keys(), dtype=np.int64, count=len(last))] = \
                    np.fromiter(last.values(), dtype=np.int64, count=len(last))
            if not write.target.all():
                touched = np.maximum(touched, before.times())
        after.touched = touched

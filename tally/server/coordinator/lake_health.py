"""How far behind a table's lake is, and whether it falls further behind than the table's
changelog retention allows: read alike by `lake_status` (so `tally lake`) and the lake metrics,
so the two never disagree.

Lag in records, per bucket: its end offset less the lake's offset (0 before the first commit).
Lag in seconds: 0 while the lake holds every change; else how long ago the lake was last known
to hold every change made until then: its last commit, or a later status read that found it
holding every change (kept in memory), or, before any commit, the table's creation.

The retention alert, on a table that sets `table.log.retention.offsets` and/or
`table.log.retention.ms`, says why the lake is further behind than retention allows:

- a bucket has more records not in the lake than retention.offsets keeps, or
- the lake has records to copy and has lagged for longer than retention.ms, or
- (with `table.log.retention.ignore-lake`) retention already dropped records the lake had not
  copied: the next round copies the whole table.

Retention then keeps the changelog the lake still needs, past what the table's options allow,
or, with ignore-lake, drops it at its next pass (every 30 s): either way an operator acts
before that, so the alert is on as soon as the lake's lag crosses the retention bound.
"""

from __future__ import annotations

import dataclasses
import threading

from merge_engine.table.descriptor import RETENTION_MS, RETENTION_OFFSETS

Key = tuple[str | None, int]


@dataclasses.dataclass(frozen=True)
class LakeHealth:
    lag_records: dict[Key, int]
    lag_seconds: float
    retention_alert: str | None

    @property
    def total_lag(self) -> int:
        return sum(self.lag_records.values())


def where(key: Key) -> str:
    partition, bucket = key
    return f"bucket {bucket}" if partition is None else f"partition '{partition}' bucket {bucket}"


def lag_records(ends: dict[Key, tuple[int, int]], lake: dict[Key, int]) -> dict[Key, int]:
    """Per bucket, the changelog records not in the lake yet."""
    return {key: max(0, end - lake.get(key, 0)) for key, (_start, end) in ends.items()}


def retention_alert(properties: dict, ignores_lake: bool, ends: dict[Key, tuple[int, int]],
                    lake: dict[Key, int] | None, lag_seconds: float) -> str | None:
    """Why the lake falls further behind than the table's retention allows (see the module
    docstring), in one line naming the bucket and the numbers; None when it does not."""
    keep, max_ms = properties.get(RETENTION_OFFSETS), properties.get(RETENTION_MS)
    if keep is None and max_ms is None:
        return None
    held = lake or {}
    behind = lag_records(ends, held)
    effect = ("retention drops them at its next pass (table.log.retention.ignore-lake)"
              if ignores_lake else "retention keeps them, past what the table allows")
    if ignores_lake and lake is not None:
        for key, (start, _end) in sorted(ends.items(), key=_order):
            if key in held and start > held[key]:
                return (f"{where(key)}: retention dropped offsets {held[key]} to {start} before "
                        "the lake copied them (table.log.retention.ignore-lake): the next round "
                        "copies the whole table")
    if keep is not None and behind:
        key, count = max(sorted(behind.items(), key=_order), key=lambda kv: kv[1])
        if count > int(keep):
            return (f"{where(key)}: {records(count)} not in the lake, more than "
                    f"{RETENTION_OFFSETS} = {int(keep)}: {effect}")
    total = sum(behind.values())
    if max_ms is not None and total and lag_seconds * 1000 > int(max_ms):
        return (f"the lake lags {lag_seconds:.0f} s ({records(total)} not in it), longer than "
                f"{RETENTION_MS} = {int(max_ms)}: {effect}")
    return None


def records(count: int) -> str:
    return f"{count} record" if count == 1 else f"{count} records"


def _order(item) -> tuple:
    (partition, bucket), _ = item
    return partition or "", bucket


class LakeWatch:
    """Assesses lake tables, remembering when each was last seen holding every change."""

    def __init__(self, clock) -> None:
        self.clock = clock
        self._caught_up: dict[int, float] = {}  # table id -> when seen holding every change
        self._lock = threading.Lock()

    def assess(self, record, properties: dict, ignores_lake: bool, value: dict,
               lake: dict[Key, int] | None, ends: dict[Key, tuple[int, int]]) -> LakeHealth:
        """`value`: the table's lake record; `lake`: its offsets (None before a commit);
        `ends`: (log start, log end) per bucket, just read."""
        now = self.clock()
        behind = lag_records(ends, lake or {})
        with self._lock:
            if not any(behind.values()):
                self._caught_up[record.table_id] = now
                lag = 0.0
            else:
                fresh = value.get("committed_at") or record.created_at
                fresh = max(fresh, self._caught_up.get(record.table_id, fresh))
                lag = max(0.0, now - fresh)
        alert = retention_alert(properties, ignores_lake, ends, lake, lag)
        return LakeHealth(behind, lag, alert)

    def lag_seconds(self, record, value: dict) -> float:
        """Lag in seconds when the end offsets cannot be read: since the last time the lake
        was known to hold every change."""
        fresh = value.get("committed_at") or record.created_at
        with self._lock:
            fresh = max(fresh, self._caught_up.get(record.table_id, fresh))
        return max(0.0, self.clock() - fresh)

    def forget(self, table_id: int) -> None:
        with self._lock:
            self._caught_up.pop(table_id, None)

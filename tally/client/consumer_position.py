"""What `conn.admin.consumer_positions(table)` returns: one changelog consumer's registered
positions, and whether they still hold back retention.

A consumer registers, per bucket, the next changelog offset it will read; retention keeps
those records and everything after them, for `table.log.retention.consumer-ms` after the
consumer last registered (`holds_until`). Past that the consumer no longer holds anything
(`holding` is false), and reading from positions retention has since passed is refused.
"""

from __future__ import annotations

import dataclasses
import datetime


@dataclasses.dataclass(frozen=True)
class ConsumerPosition:
    """One consumer of one table: its positions and how long they hold retention back."""

    consumer: str
    positions: dict[tuple[str | None, int], int]   # (partition, bucket) -> next offset
    updated_at: float                               # seconds since the epoch (coordinator clock)
    holds_until: float | None                       # updated_at + table.log.retention.consumer-ms
    #                                                 (None: the lake, which holds while it is on)
    holding: bool                                   # whether retention still keeps its records
    principal: str | None = None                    # the client it belongs to (None: nobody's
    #                                                 yet, or a cluster without credentials)

    @classmethod
    def from_json(cls, doc: dict) -> "ConsumerPosition":
        return cls(doc["consumer"], {(p, int(b)): int(o) for p, b, o in doc["positions"]},
                   float(doc["updated_at"]),
                   None if doc["holds_until"] is None else float(doc["holds_until"]),
                   bool(doc["holding"]), doc.get("principal"))

    def positions_json(self) -> list[list]:
        """The positions in the JSON form changelog readers start from."""
        return [[p, b, o] for (p, b), o in
                sorted(self.positions.items(), key=lambda kv: (kv[0][0] or "", kv[0][1]))]

    def lag(self, log_offsets: dict[tuple[str | None, int], tuple[int, int]]
            ) -> dict[tuple[str | None, int], int]:
        """Records not yet read per bucket, given `admin.list_log_offsets(table)` (a bucket the
        consumer has no position for counts from its log start)."""
        return {key: end - self.positions.get(key, start)
                for key, (start, end) in log_offsets.items()}

    def __repr__(self) -> str:
        when = datetime.datetime.fromtimestamp(self.updated_at, datetime.timezone.utc)
        return (f"ConsumerPosition({self.consumer!r}, {len(self.positions)} buckets, updated "
                f"{when.isoformat(timespec='seconds')}, holding={self.holding})")

"""What the coordinator adds to its metrics: the undo reports of clients and the lock holders.

Undo runs in the client (a Spark job, `recovery.recover`), where no server sees it whole, so
the client reports each bucket it undid with the `undo_report` action; lock holders are read
from the lock service when the metrics are scraped. Kept apart from the coordinator, which
only wires it, as its lock and consumer actions are.
"""

from __future__ import annotations

import math

from tally.errors import InvalidInputError, NotFoundError
from tally.wire.messages import field

COUNTS = ("keys_restored", "keys_deleted", "records_scanned")


class MetricReports:
    def __init__(self, coordinator) -> None:
        self.coordinator = coordinator
        coordinator.actions["undo_report"] = self.undo_report
        coordinator.metrics.watch_locks(self.lock_holders)

    def lock_holders(self) -> dict[str, tuple[int, int]]:
        """{table name: (live locks, expired unreleased locks)}."""
        catalog, out = self.coordinator.catalog, {}
        for table_id, counts in self.coordinator.locking.locks.holders().items():
            try:
                out[catalog.table_by_id(table_id).name] = counts
            except NotFoundError:
                continue  # dropped meanwhile
        return out

    def undo_report(self, body: dict) -> None:
        """A client undid one bucket of a table. Counted only for an existing table (the one
        the caller resolved, when it sends `table_id`), so a caller cannot make up series; the
        numbers are the client's."""
        record = self.coordinator.named_table(body)
        counts = {name: field(body, name, int) for name in COUNTS}
        seconds = body.get("seconds")
        if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) \
                or not math.isfinite(seconds) or seconds < 0 \
                or any(not 0 <= n < 2**63 for n in counts.values()):
            raise InvalidInputError(
                f"an undo report's counts ({counts}) must be 64-bit integers and its seconds "
                f"({seconds!r}) a finite number, none negative")
        self.coordinator.metrics.undone(record.name, counts["keys_restored"],
                                        counts["keys_deleted"], counts["records_scanned"],
                                        float(seconds))

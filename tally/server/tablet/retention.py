"""Changelog retention on a tablet server, and the admin call that truncates one bucket's log.

Every `interval` seconds each open tablet whose table sets `table.log.retention.offsets` or
`table.log.retention.ms` is truncated to what those options allow, but never above the floor the
coordinator reports: the oldest offset an unreleased lock tenure (live, or expired within the
table's `table.log.retention.expired-lock-ms`) still needs for its undo: its last commit in the
tenure (or the tenure's start) and its uncommitted epochs' baselines.
`table.log.retention.ignore-locks = true` drops that protection. Nor above the lowest position a
registered changelog consumer has not read (the coordinator's consumer floor), which holds for
`table.log.retention.consumer-ms` after the consumer last registered. The policy itself (what the
options allow, capped at the floor) is merge_engine/kv/log_retention.py.
"""

from __future__ import annotations

import logging

from locks.lease import offsets_from_json
from merge_engine.kv.log_retention import enforce_retention, has_retention
from tally.errors import StorageError, TallyError
from tally.server.tablet.periodic import PeriodicDuty
from tally.wire.messages import field

log = logging.getLogger(__name__)

RETENTION_INTERVAL = 30.0


class RetentionKeeper:
    def __init__(self, server, interval: float = RETENTION_INTERVAL) -> None:
        self.server = server
        server.actions["truncate_bucket_log"] = self.truncate
        server.actions["enforce_retention"] = lambda body: self.enforce()
        self._loop = PeriodicDuty(self.enforce, interval, "log retention")

    def start(self) -> None:
        self._loop.start()

    def close(self) -> None:
        self._loop.close()

    def truncate(self, body: dict) -> int:
        hosted = self.server.addressed(body)
        before = field(body, "before", int)
        with hosted.lock:
            start = hosted.tablet.log_start_offset
            after = hosted.tablet.truncate_log(before)
        self.server.metrics.truncated(hosted, "admin", start, after)
        return after

    def enforce(self) -> dict:
        """One retention pass; {bucket label: new log start} for the buckets it truncated."""
        floors: dict[int, tuple[dict, int, dict, int]] = {}
        moved = {}
        for hosted in self.server.host.all_hosted():
            if not has_retention(hosted.tablet.descriptor):
                continue
            table_id = hosted.key.table_id
            try:
                if table_id not in floors:
                    floors[table_id] = self._floors(table_id)
            except TallyError as e:
                log.info("retention skipped for table id %d: %s", table_id, e)
                continue
            offsets, holding, consumed, consuming = floors[table_id]
            key = (hosted.partition, hosted.key.bucket)
            floor = offsets.get(key, 0 if holding else None)
            consumer_floor = consumed.get(key, 0 if consuming else None)
            try:
                with hosted.lock:
                    before = hosted.tablet.log_start_offset
                    after = enforce_retention(hosted.tablet, floor,
                                              consumer_floor=consumer_floor)
            except StorageError as e:  # a full disk: the bucket reports it, the others go on
                log.info("retention skipped for %s: %s", hosted.label, e)
                continue
            if after != before:
                moved[hosted.label] = after
                self.server.metrics.truncated(hosted, "retention", before, after)
        return moved

    def _floors(self, table_id: int) -> tuple[dict, int, dict, int]:
        """What the coordinator says retention must keep of a table: the locks' floor and how
        many tenures hold it, the consumers' floor and how many consumers hold it."""
        locks = self.server.coordinator("retention_floor", {"table_id": table_id})
        consumers = self.server.coordinator("consumer_floor", {"table_id": table_id})
        return (offsets_from_json(locks["offsets"]), locks["holding_locks"],
                offsets_from_json(consumers["offsets"]), consumers["holding_consumers"])

"""The coordinator's record of each bucket's remote snapshots: the newest snapshot's id and
offset, where the uploaded changelog ends, and the last high watermark its leader reported.

Leaders register after every upload (`snapshot_register`) and report high watermarks with
their heartbeats; both are taken only from the server that leads the bucket under the leader
epoch it names, so a deposed leader cannot move the record. A restore reads it to tell what
was lost: the acknowledged offsets past the end of the uploaded changelog. Layout in the
metadata store, deleted with the table:

    /snapshots/<table id>/<partition id>-<bucket>   {"snapshot_id", "snapshot_offset",
        "segment_end", "high_watermark", "leader_epoch", "updated_at"}
"""

from __future__ import annotations

import logging
import threading

from tally.errors import FencedLeaderEpochError, InvalidInputError, NotFoundError
from tally.meta import join_path
from tally.wire.messages import field, int_items

log = logging.getLogger(__name__)


def record_path(table_id: int, partition_id: int | None = None, bucket: int | None = None) -> str:
    if partition_id is None:
        return join_path("snapshots", str(table_id))
    return join_path("snapshots", str(table_id), f"{partition_id}-{bucket}")


class SnapshotRegistry:
    """Adds the snapshot actions to a Coordinator."""

    def __init__(self, coordinator) -> None:
        self.coordinator = coordinator
        self.store = coordinator.store
        self._reported: dict[tuple, int] = {}  # what is stored already: no write per heartbeat
        self._lock = threading.Lock()
        coordinator.actions.update({
            "snapshot_register": self.register,
            "bucket_snapshots": self.bucket_snapshots,
        })

    def _check_leader(self, table_id: int, partition_id: int, bucket: int, leader: str,
                      epoch: int) -> None:
        partition = self.coordinator.catalog.partition_by_id(table_id, partition_id)
        if not 0 <= bucket < len(partition.buckets):
            raise NotFoundError(f"table id {table_id} has no bucket {bucket}")
        current = partition.buckets[bucket]
        if current.leader != leader or current.leader_epoch != epoch:
            raise FencedLeaderEpochError(
                f"server {leader} does not lead bucket {bucket} of table id {table_id} "
                f"partition id {partition_id} under leader epoch {epoch} (leader "
                f"{current.leader}, epoch {current.leader_epoch}): nothing was registered")

    def _write(self, table_id: int, partition_id: int, bucket: int, change) -> dict:
        self.store.ensure(join_path("snapshots"))
        self.store.ensure(record_path(table_id))
        return self.store.update(record_path(table_id, partition_id, bucket), change,
                                 create={}).value

    def register(self, body: dict) -> dict:
        """A leader's upload: the snapshot it made and/or where its uploaded log ends, with
        its high watermark. Refused (FencedLeaderEpochError) from a deposed leader."""
        table_id, partition_id = field(body, "table_id", int), field(body, "partition_id", int)
        bucket, epoch = field(body, "bucket", int), field(body, "leader_epoch", int)
        hw = field(body, "high_watermark", int)
        snapshot = field(body, "snapshot", dict, None)
        segment_end = field(body, "segment_end", int, None)
        if snapshot is not None:
            snapshot = (field(snapshot, "snapshot_id", int), field(snapshot, "offset", int))
        if hw < 0 or (segment_end is not None and segment_end < 0) or \
                (snapshot is not None and min(snapshot) < 0):
            raise InvalidInputError(f"offsets are never negative: {body!r}")
        self._check_leader(table_id, partition_id, bucket, field(body, "leader", str), epoch)
        now = self.coordinator.clock()

        def change(value: dict) -> dict:
            if snapshot is not None:
                value["snapshot_id"], value["snapshot_offset"] = snapshot
            if segment_end is not None:
                value["segment_end"] = segment_end
            value["high_watermark"] = hw
            value["leader_epoch"] = epoch
            value["updated_at"] = now
            return value

        value = self._write(table_id, partition_id, bucket, change)
        with self._lock:
            self._reported[(table_id, partition_id, bucket)] = hw
        return value

    def heartbeat(self, server_id: str, reports: list) -> None:
        """A leader's high watermarks, [[table id, partition id, bucket, epoch, hw], ...];
        those of buckets it does not lead under that epoch (or of dropped tables) are
        ignored."""
        for item in reports:
            table_id, partition_id, bucket, epoch, hw = item
            key = (table_id, partition_id, bucket)
            with self._lock:
                if self._reported.get(key) == hw:
                    continue
            try:
                self._check_leader(table_id, partition_id, bucket, server_id, epoch)
            except (FencedLeaderEpochError, NotFoundError):
                continue

            def change(value: dict, hw=hw, epoch=epoch) -> dict:
                value.update(high_watermark=hw, leader_epoch=epoch,
                             updated_at=self.coordinator.clock())
                return value

            self._write(table_id, partition_id, bucket, change)
            with self._lock:
                self._reported[key] = hw

    @staticmethod
    def check_reports(reports) -> list[list[int]]:
        """A heartbeat's `high_watermarks`, checked before the heartbeat counts."""
        if not isinstance(reports, list) or not all(
                isinstance(r, list) and len(r) == 5 for r in reports):
            raise InvalidInputError("malformed request: the field 'high_watermarks' must hold "
                                    "[table id, partition id, bucket, epoch, offset] lists")
        return [int_items(r, "high_watermarks") for r in reports]

    def record(self, table_id: int, partition_id: int, bucket: int) -> dict:
        node = self.store.get(record_path(table_id, partition_id, bucket))
        return dict(node.value) if node is not None else {}

    def restored(self, table_id: int, partition_id: int, bucket: int, end: int,
                 epoch: int) -> None:
        """A restore rebuilt the bucket up to `end`: that is its acknowledged end now."""
        def change(value: dict) -> dict:
            value.update(high_watermark=end, segment_end=end, leader_epoch=epoch,
                         updated_at=self.coordinator.clock())
            return value

        self._write(table_id, partition_id, bucket, change)
        with self._lock:
            self._reported.pop((table_id, partition_id, bucket), None)

    def bucket_snapshots(self, body: dict) -> list[list]:
        """[[partition, bucket, record], ...] of one table (record: {} before any upload)."""
        record = self.coordinator.named_table(body)
        out = []
        for p in self.coordinator.catalog.partitions(record.table_id):
            for b in range(len(p.buckets)):
                out.append([p.name, b, self.record(record.table_id, p.partition_id, b)])
        return out

    def drop_table(self, table_id: int) -> None:
        self.store.delete(record_path(table_id), recursive=True)
        with self._lock:
            for key in [k for k in self._reported if k[0] == table_id]:
                del self._reported[key]

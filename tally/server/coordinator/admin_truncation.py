"""An operator's truncation of one bucket's changelog (`truncate_log`), forwarded to the bucket's
leader after checking that no lock tenure's undo or registered consumer still needs the
records (unless forced)."""

from __future__ import annotations

from tally.errors import InvalidInputError, NotFoundError, UnavailableError
from tally.wire.messages import field


class AdminTruncation:
    """Added to a Coordinator; adds the `truncate_log` action."""

    def __init__(self, coordinator) -> None:
        self.coordinator = coordinator
        coordinator.actions["truncate_log"] = self.truncate_log

    def truncate_log(self, body: dict) -> int:
        """Forward an admin truncation to the tablet server hosting the bucket."""
        record = self.coordinator.catalog.get_table(field(body, "name", str))
        name = None if body.get("partition") is None else field(body, "partition", str)
        bucket, before = field(body, "bucket", int), field(body, "before", int)
        partition = self.coordinator.catalog.get_partition(record.table_id, name)
        if partition is None:
            raise NotFoundError(f"table '{record.name}' has no partition {name!r}")
        if not 0 <= bucket < len(partition.buckets):
            raise NotFoundError(f"table '{record.name}' has no bucket {bucket}")
        if not body.get("force", False):
            self._check_retention_floors(record, name, bucket, before)
        owner = partition.buckets[bucket].leader
        address = self.coordinator.liveness.live().get(owner) if owner else None
        if address is None:
            raise UnavailableError(f"tablet server {owner} hosting that bucket is not live")
        return self.coordinator.channels.get(address).action("truncate_bucket_log", {
            "table_id": record.table_id, "partition_id": partition.partition_id,
            "bucket": bucket, "before": before})

    def _check_retention_floors(self, record, partition: str | None, bucket: int,
                                before: int) -> None:
        """Refuse an admin truncation past what a lock tenure's undo or a registered changelog
        consumer still needs (the floors the tablet servers' retention keeps too): cutting
        there would make a crashed job's undo impossible, or a consumer skip records. `force`
        overrides it, knowingly."""
        key, table_id = (partition, bucket), {"table_id": record.table_id}
        floors = []
        if "retention_floor" in self.coordinator.actions:
            locks = self.coordinator.actions["retention_floor"](table_id)
            floors.append(("an unreleased column lock's undo", locks["holding_locks"],
                           {(p, b): o for p, b, o in locks["offsets"]}))
        if "consumer_floor" in self.coordinator.actions:
            consumers = self.coordinator.actions["consumer_floor"](table_id)
            floors.append(("a registered changelog consumer", consumers["holding_consumers"],
                           {(p, b): o for p, b, o in consumers["offsets"]}))
        for what, holding, offsets in floors:
            floor = offsets.get(key, 0 if holding else None)
            if floor is not None and before > floor:
                where = f"bucket {bucket}" if partition is None else \
                    f"bucket {bucket} of partition {partition!r}"
                raise InvalidInputError(
                    f"truncating {record.name}'s {where} before offset {before} would drop "
                    f"records {what} still needs (from offset {floor}); truncate before "
                    f"{floor} at most, or pass force to drop them anyway")

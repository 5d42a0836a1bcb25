"""An operator's restore of a bucket whose every copy is gone (`restore_bucket`, admin).

One live tablet server (the one named, else the least loaded) builds the bucket from its
newest remote snapshot and the remote changelog segments after it; the coordinator then makes
that server the bucket's leader under a new leader epoch, with live servers as its followers
(they fetch the rest, or rebuild from the snapshot). What the remote log did not hold is lost,
and said so exactly: the offsets from the restored log end up to the last high watermark its
leaders reported, in the answer and in the coordinator's log. Refused while the bucket has a
live leader: its copies are not lost.
"""

from __future__ import annotations

import logging

from tally.errors import NotFoundError, UnavailableError, VersionConflictError
from tally.server.coordinator.catalog import BucketReplicas
from tally.server.coordinator.replica_placement import replication_factor
from tally.wire.messages import field

log = logging.getLogger(__name__)

RESTORE_TIMEOUT = 600.0  # seconds a server may take to download and replay a bucket


class BucketRestore:
    """Added to a Coordinator (after its SnapshotRegistry); adds `restore_bucket`."""

    def __init__(self, coordinator) -> None:
        self.coordinator = coordinator
        coordinator.actions["restore_bucket"] = self.restore

    def restore(self, body: dict) -> dict:
        coordinator = self.coordinator
        catalog = coordinator.catalog
        record = coordinator.named_table(body)
        name = None if body.get("partition") is None else field(body, "partition", str)
        bucket = field(body, "bucket", int)
        wanted = None if body.get("server") is None else field(body, "server", str)
        partition = catalog.get_partition(record.table_id, name)
        if partition is None:
            raise NotFoundError(f"table '{record.name}' has no partition {name!r}")
        if not 0 <= bucket < len(partition.buckets):
            raise NotFoundError(f"table '{record.name}' has no bucket {bucket}")
        where = f"bucket {bucket} of {record.name}" + \
            (f" partition '{name}'" if name is not None else "")
        current = partition.buckets[bucket]
        live = coordinator.liveness.live()
        if current.leader is not None and current.leader in live:
            raise VersionConflictError(
                f"{where} is led by live tablet server {current.leader}: its copies are not "
                f"lost, nothing was restored")
        target = self._target(wanted, live, where)
        known = coordinator.snapshots.record(record.table_id, partition.partition_id, bucket)
        routing = coordinator.routing(record)
        answer = coordinator.channels.get(live[target]).action("restore_bucket_copy", {
            "table_id": record.table_id, "partition_id": partition.partition_id,
            "bucket": bucket, "descriptor": record.descriptor, "routing": routing.to_json(),
            "partition": name}, timeout=RESTORE_TIMEOUT)
        end = int(answer["log_end"])
        factor = replication_factor(coordinator.parse_descriptor(record.descriptor),
                                    coordinator.replicas.default_factor)
        followers = [s for s in current.replicas if s in live and s != target]
        followers += sorted(s for s in live if s != target and s not in followers)
        replicas = (target, *followers[:factor - 1])

        def change(buckets):
            buckets = list(buckets)
            if buckets[bucket] != current:
                raise VersionConflictError(f"{where} changed while it was being restored; "
                                           f"retry the restore")
            buckets[bucket] = BucketReplicas(target, replicas, (target,),
                                             current.leader_epoch + 1)
            return buckets

        catalog.update_buckets(record.table_id, name, change)
        coordinator.snapshots.restored(record.table_id, partition.partition_id, bucket, end,
                                       current.leader_epoch + 1)
        coordinator.replicas.changed(set(replicas) | set(current.replicas))
        last_hw = known.get("high_watermark")
        lost = [end, int(last_hw)] if last_hw is not None and int(last_hw) > end else None
        snapshot = "no snapshot" if answer["snapshot_id"] is None else \
            f"snapshot {answer['snapshot_id']} (offset {answer['snapshot_offset']})"
        message = (f"restored {where} on tablet server {target} from {snapshot} and "
                   f"{answer['segments']} log segment(s) up to offset {end}; ")
        if lost:
            message += (f"LOST offsets [{lost[0]}, {lost[1]}): acknowledged (last known high "
                        f"watermark {lost[1]}) but never uploaded")
            log.error("%s", message)
        elif last_hw is None:
            message += "no high watermark was ever reported, so what was lost is unknown"
            log.error("%s", message)
        else:
            message += f"nothing lost (last known high watermark {last_hw})"
            log.warning("%s", message)
        return {"server": target, "snapshot_id": answer["snapshot_id"],
                "snapshot_offset": answer["snapshot_offset"], "segments": answer["segments"],
                "log_start": answer["log_start"], "restored_end": end,
                "last_high_watermark": last_hw, "lost": lost, "message": message}

    def _target(self, wanted: str | None, live: dict, where: str) -> str:
        if wanted is not None:
            if wanted not in live:
                raise UnavailableError(f"tablet server {wanted} is not live: cannot restore "
                                       f"{where} there")
            return wanted
        if not live:
            raise UnavailableError(f"no tablet server is live: cannot restore {where}")
        load: dict[str, int] = {s: 0 for s in live}
        for _, p in self.coordinator.replicas.all_partitions():
            for r in p.buckets:
                for s in r.replicas:
                    if s in load:
                        load[s] += 1
        return min(sorted(load), key=lambda s: load[s])

"""Moving a bucket's leadership on request (`move_leader`): to another live in-sync copy
under the next epoch, with the old leader resigning first, so that no two leaders serve the
bucket at once (its lease cannot outlive the move)."""

from __future__ import annotations

import logging
from typing import Callable

from tally.errors import InvalidInputError, NotFoundError, TallyError, UnavailableError
from tally.server.coordinator.catalog import BucketReplicas
from tally.wire.messages import field

log = logging.getLogger(__name__)

RESIGN_TIMEOUT = 2.0        # the old leader confirms its resignation within this, or no move
# a leadership move is made within this long after the old leader was asked to resign, or not
RESIGN_WITHIN = RESIGN_TIMEOUT + 1.0


class LeaderMoves:
    """Added to the replica control: the `move_leader` action."""

    def __init__(self, coordinator, changed: Callable[[set], None]) -> None:
        """`changed`: told the servers whose roles a move changed (they are nudged)."""
        self.coordinator = coordinator
        self.catalog = coordinator.catalog
        self._changed = changed

    def move_leader(self, body: dict) -> dict:
        """Hand a bucket's leadership to another live in-sync replica (default: its first
        replica, the preferred leader) under the next epoch. The old leader resigns the
        bucket first, so it serves nothing once the new one does; its writes in flight fail
        and are retried on the new one; its unreplicated tail is cut when it follows."""
        record = self.coordinator.named_table(body)
        name = None if body.get("partition") is None else field(body, "partition", str)
        bucket = field(body, "bucket", int)
        to = None if body.get("to") is None else field(body, "to", str)
        partition = self.catalog.get_partition(record.table_id, name)
        if partition is None:
            raise NotFoundError(f"table '{record.name}' has no partition {name!r}")
        live = set(self.coordinator.liveness.live())
        if not 0 <= bucket < len(partition.buckets):
            raise NotFoundError(f"table '{record.name}' has no bucket {bucket}")
        before = partition.buckets[bucket]
        if (to or before.replicas[0]) == before.leader:
            return before.to_json()
        self._check_target(record.name, bucket, before, to or before.replicas[0], live)
        # the old leader stops serving before the new one starts (leader_lease)
        asked = self._resign(record, partition.partition_id, bucket, before)

        def change(buckets):
            buckets = list(buckets)
            if not 0 <= bucket < len(buckets):
                raise NotFoundError(f"table '{record.name}' has no bucket {bucket}")
            current = buckets[bucket]
            target = to or current.replicas[0]
            self._check_target(record.name, bucket, current, target, live)
            if target == current.leader:
                return buckets
            if (current.leader, current.leader_epoch) != (before.leader, before.leader_epoch):
                raise UnavailableError(
                    f"bucket {bucket} of '{record.name}' changed leader while it was being "
                    "moved; nothing changed, retry")
            buckets[bucket] = BucketReplicas(target, current.replicas, current.isr,
                                             current.leader_epoch + 1)
            return buckets

        leases = self.coordinator.leases
        with leases.deposing({before.leader} if before.leader else set()):
            # leases granted from here on carry the new version; those granted before the
            # resignation's hold began end within it, if the move is made in time
            if asked is not None and leases.now() - asked > RESIGN_WITHIN:
                raise UnavailableError(
                    f"bucket {bucket} of '{record.name}': its move took too long after its "
                    f"leader {before.leader} resigned; nothing changed (it leads again within "
                    f"{self._resign_hold():g} s), retry")
            updated = self.catalog.update_buckets(record.table_id, name, change)
            if updated is None:
                raise NotFoundError(f"table '{record.name}' has no partition {name!r}")
            moved = updated.buckets[bucket]
            self._changed(set(moved.replicas))
        log.info("bucket %d of %s partition %s: leader moved to %s (epoch %d)", bucket,
                 record.name, name, moved.leader, moved.leader_epoch)
        return moved.to_json()

    @staticmethod
    def _check_target(table: str, bucket: int, current: BucketReplicas, target: str,
                      live: set[str]) -> None:
        if target not in current.isr or target not in live:
            raise InvalidInputError(
                f"server {target} cannot lead bucket {bucket} of '{table}': only a live "
                f"in-sync replica can (in sync: {list(current.isr)}); nothing changed")

    def _resign_hold(self) -> float:
        """How long a resigned leader serves its bucket no more: past every lease granted
        before the move is made."""
        return RESIGN_WITHIN + self.coordinator.leases.session_timeout

    def _resign(self, record, partition_id: int, bucket: int,
                current: BucketReplicas) -> float | None:
        """Ask a bucket's leader to stop serving it under its epoch; when it was asked (the
        lease clock), or None when it holds no lease that could still run. UnavailableError
        (nothing changed) when it does not confirm."""
        leases = self.coordinator.leases
        leader = current.leader
        if leader is None or not leases.held(leader):
            return None
        address = self.coordinator.liveness.live().get(leader) or \
            self.catalog.known_servers().get(leader)
        asked = leases.now()
        try:
            if address is None:
                raise UnavailableError("its address is not known")
            self.coordinator.channels.get(address).action("resign_leadership", {
                "table_id": record.table_id, "partition_id": partition_id,
                "bucket": bucket, "leader_epoch": current.leader_epoch,
                "hold_ms": int(self._resign_hold() * 1000)}, timeout=RESIGN_TIMEOUT)
        except TallyError as e:
            raise UnavailableError(
                f"bucket {bucket} of '{record.name}': its leader {leader} did not confirm that it "
                f"stopped serving the bucket ({e}); nothing changed, retry (or wait until its "
                "session ends)") from None
        return asked

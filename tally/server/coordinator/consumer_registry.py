"""The coordinator's changelog consumers: registered positions that hold back retention.

A consumer (a name chosen by its reader: a Spark query's `consumer` option, a Python reader's
`consumer=`) registers per bucket the next offset it will read. Retention on the tablet servers
then keeps each bucket's records from the lowest registered position on, and a bucket a holding
consumer has no position for (a partition created since it last registered) from offset 0.

The bound: a consumer holds retention for `table.log.retention.consumer-ms` (7 days by default)
after it last registered, judged by the coordinator's clock. A running consumer registers after
every batch, so it keeps holding; one that stopped or was abandoned lets go when that time has
passed, and an operator may remove it at once. Layout in the metadata store:

    /consumers/<table id>/<consumer>   {"consumer", "positions": [[partition, bucket, offset]],
                                        "updated_at", "principal"}

A consumer's positions belong to its principal (`locks.ownership`): the one its name's auth
file grant names, else the first principal that registered them (kept in "principal"). Only it
or an admin may register, reset or remove them; anyone with `read` may look.
"""

from __future__ import annotations

from locks import ownership
from locks.caller import caller
from locks.coordinator_actions import offsets_field
from locks.lease import offsets_to_json
from tally.errors import InvalidInputError, VersionConflictError
from tally.meta import join_path, node_name, text_of
from tally.wire.messages import field


def consumer_path(table_id: int, consumer: str | None = None) -> str:
    if consumer is None:
        return join_path("consumers", str(table_id))
    return join_path("consumers", str(table_id), node_name(consumer, "consumer name"))


class ConsumerRegistry:
    """Adds the consumer actions to a Coordinator."""

    def __init__(self, coordinator) -> None:
        self.coordinator = coordinator
        self.store = coordinator.store
        coordinator.actions.update({
            "consumer_commit": self.commit,
            "consumer_positions": self.positions,
            "consumer_remove": self.remove,
            "consumer_floor": self.floor,
        })

    def _consumer(self, body: dict) -> str:
        consumer = field(body, "consumer", str)
        if not consumer.strip():
            raise InvalidInputError("a consumer name must not be empty")
        return consumer

    def commit(self, body: dict) -> dict:
        """Replace a consumer's positions (every bucket it reads, each checked against the
        table: a partition it has, a bucket below its bucket count, a non-negative offset)."""
        record = self.coordinator.named_table(body)
        consumer = self._consumer(body)
        positions = offsets_field(body, "positions")
        routing = self.coordinator.routing(record)
        for (partition, bucket), offset in positions.items():
            if (partition is not None) != routing.partitioned:
                raise InvalidInputError(
                    f"table '{record.name}' {'has' if routing.partitioned else 'has no'} "
                    f"partitions: position {[partition, bucket, offset]} does not fit it")
            if not 0 <= bucket < routing.bucket_count or offset < 0:
                raise InvalidInputError(
                    f"position {[partition, bucket, offset]} of consumer '{consumer}' names no "
                    f"bucket of table '{record.name}' (buckets 0..{routing.bucket_count - 1}, "
                    "offsets from 0)")
        now, principal = self.coordinator.clock(), caller()

        def change(old: dict) -> dict:
            # judged against the node this compare-and-set replaces: a claim made meanwhile
            # is seen on the retry
            ownership.check("consumer_commit", principal, consumer, old.get("principal"),
                            table=record.name)
            claimed = old.get("principal") or ownership.principal_id(principal)
            return {"consumer": consumer, "positions": offsets_to_json(positions),
                    "updated_at": now, "principal": claimed}

        self.store.update(consumer_path(record.table_id, consumer), change, create={})
        return {"updated_at": now}

    def _records(self, table_id: int) -> list[dict]:
        root = consumer_path(table_id)
        out = []
        for child in self.store.children(root):
            node = self.store.get(join_path(root, child))
            if node is not None and node.value.get("consumer") == text_of(child):
                out.append(node.value)
        return out

    def _hold_seconds(self, record) -> float:
        return self.coordinator.parse_descriptor(record.descriptor).consumer_retention_ms / 1000

    def positions(self, body: dict) -> list[dict]:
        """Every consumer of the table: positions, when registered, until when they hold; the
        lake's tiering position last, as consumer LAKE_CONSUMER, holding while the lake is on
        (`holds_until` None)."""
        record = self.coordinator.named_table(body)
        hold, now = self._hold_seconds(record), self.coordinator.clock()
        out = [{**doc, "holds_until": doc["updated_at"] + hold,
                "holding": now <= doc["updated_at"] + hold}
               for doc in sorted(self._records(record.table_id), key=lambda d: d["consumer"])]
        lake = self.coordinator.lake.consumer_doc(record)
        return out + ([lake] if lake is not None else [])

    def remove(self, body: dict) -> bool:
        record = self.coordinator.named_table(body)
        consumer = self._consumer(body)
        path = consumer_path(record.table_id, consumer)
        node = self.store.get(path)
        if node is None:
            return False
        ownership.check("consumer_remove", caller(), consumer, node.value.get("principal"),
                        table=record.name)
        try:  # the version judged: a claim or commit made meanwhile keeps the node
            return self.store.delete(path, version=node.version)
        except VersionConflictError:
            raise VersionConflictError(
                f"consumer '{consumer}' of {record.name} changed while it was being removed; "
                "nothing was removed, try again") from None

    def floor(self, body: dict) -> dict:
        """Per bucket, the lowest position of a consumer that still holds (asked by tablet
        servers' retention), and how many hold: a bucket they have no position for keeps
        everything while any holds. The lake's tiering position is such a consumer, held
        without a time bound (see the lake registry)."""
        record = self.coordinator.catalog.table_by_id(field(body, "table_id", int))
        hold, now = self._hold_seconds(record), self.coordinator.clock()
        held = [{(p, b): o for p, b, o in doc["positions"]} for doc in
                self._records(record.table_id) if now <= doc["updated_at"] + hold]
        lake_holds, lake_offsets = self.coordinator.lake.retention_hold(record)
        if lake_holds:  # what the lake has not copied yet, for as long as the lake is on
            held.append(lake_offsets)
        keys = {key for positions in held for key in positions}
        floor = {key: min(positions.get(key, 0) for positions in held) for key in keys}
        return {"offsets": offsets_to_json(floor), "holding_consumers": len(held)}

    def drop_table(self, table_id: int) -> None:
        self.store.delete(consumer_path(table_id), recursive=True)

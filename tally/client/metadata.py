"""The client's cached view of one table: routing, partitions, bucket owners and their addresses.

Clients ask the coordinator once per table and then talk to tablet servers directly. The cache
is dropped whenever a tablet server says the view is stale (bucket hosted elsewhere, table
re-created) or a server cannot be reached (it may have restarted on a new port), and fetched
again on the next call.
"""

from __future__ import annotations

import dataclasses
import functools

from tally.errors import NotFoundError, UnavailableError
from tally.timestamps import iso
from tally.wire.point_keys import PointKeys
from tally.wire.routing import TableRouting


@dataclasses.dataclass(frozen=True)
class Route:
    """Where one (partition, bucket) lives right now."""

    table_id: int
    partition: str | None
    partition_id: int
    bucket: int
    server_id: str
    address: str

    def header(self) -> dict:
        return {"table_id": self.table_id, "partition_id": self.partition_id,
                "bucket": self.bucket}


@dataclasses.dataclass
class TableMeta:
    """A snapshot of the coordinator's `table_info` answer."""

    name: str
    table_id: int
    descriptor_json: str
    created_at: float
    routing: TableRouting
    partitions: dict[str | None, dict]   # name -> {"partition_id", "buckets": [replicas]}
    servers: dict[str, str | None]       # server id -> address (None: not live)
    rollups: tuple = ()                  # the table's rollups (RollupSpec), ready and building
    rollup_of: object = None             # the RollupSpec that derives this table, or None
    # (partition, bucket) -> (server address, a lookup request's head): what a point lookup
    # would otherwise rebuild per call, made once per snapshot (a snapshot never changes)
    _lookup_heads: dict = dataclasses.field(default_factory=dict, init=False, repr=False,
                                            compare=False)

    @classmethod
    def from_info(cls, info: dict) -> "TableMeta":
        from merge_engine.table.rollups import RollupSpec

        of = info.get("rollup_of")
        return cls(info["name"], int(info["table_id"]), info["descriptor"],
                   float(info["created_at"]), TableRouting.from_json(info["routing"]),
                   {p["name"]: p for p in info["partitions"]}, dict(info["servers"]),
                   tuple(RollupSpec.from_json(d) for d in info.get("rollups") or ()),
                   None if of is None else RollupSpec.from_json(of))

    def __repr__(self) -> str:
        return (f"TableMeta({self.name!r}, table id {self.table_id}, created "
                f"{iso(self.created_at)}, partitions {sorted(self.partitions, key=str)}, "
                f"servers {self.servers})")

    @functools.cached_property
    def descriptor(self):
        from merge_engine import TableDescriptor

        return TableDescriptor.from_json(self.descriptor_json)

    @functools.cached_property
    def aggregators(self) -> list:
        """The table's aggregators, in schema order (what client-side validation uses)."""
        descriptor = self.descriptor
        return descriptor.aggregators()

    @functools.cached_property
    def point_keys(self) -> PointKeys:
        """The table's point-lookup key encoder (its key schema's IPC message made once)."""
        return PointKeys(self.routing)

    def partition_names(self) -> list[str | None]:
        return sorted(self.partitions, key=lambda p: (p is not None, p or ""))

    def has_partition(self, partition: str | None) -> bool:
        return partition in self.partitions

    def route(self, partition: str | None, bucket: int) -> Route:
        """The server of (partition, bucket); UnavailableError while its server is down."""
        if not self.routing.partitioned and partition is not None:
            raise NotFoundError(f"table '{self.name}' is not partitioned "
                                f"(asked for partition {partition!r})")
        p = self.partitions.get(partition)
        if p is None:
            raise NotFoundError(f"partition '{partition}' of table '{self.name}' does not exist")
        if not 0 <= bucket < len(p["buckets"]):
            raise NotFoundError(f"table '{self.name}' has buckets 0..{len(p['buckets']) - 1}, "
                                f"not {bucket}")
        replicas = p["buckets"][bucket]
        owner = replicas["leader"] if isinstance(replicas, dict) else replicas
        if owner is None:
            raise UnavailableError(
                f"bucket {bucket} of '{self.name}' has no leader: none of its in-sync replicas "
                f"{replicas['isr']} is live (it waits for one of them to return)")
        address = self.servers.get(owner)
        if not address:
            raise UnavailableError(f"tablet server {owner} leading bucket {bucket} of "
                                   f"'{self.name}' is not live")
        return Route(self.table_id, partition, int(p["partition_id"]), bucket, owner, address)

    def lookup_head(self, partition: str | None, bucket: int) -> tuple[str, bytes]:
        """(server address, the head of a lookup request) of (partition, bucket); route()'s
        errors while it has no live leader."""
        found = self._lookup_heads.get((partition, bucket))
        if found is None:
            route = self.route(partition, bucket)
            found = self._lookup_heads[(partition, bucket)] = (
                route.address, self.point_keys.head(route))
        return found

    def all_buckets(self) -> list[tuple[str | None, int]]:
        return [(p, b) for p in self.partition_names()
                for b in range(len(self.partitions[p]["buckets"]))]

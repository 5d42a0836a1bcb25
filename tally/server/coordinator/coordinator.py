"""The coordinator: the catalog, partition creation, bucket assignment and cluster offsets.

It owns the metadata store (ZooKeeper or embedded), decides which live tablet server hosts each
(table, partition, bucket) when the table or partition is created, and answers clients' and
tablet servers' metadata questions. It never touches row data: writes and reads go straight
from clients to tablet servers.

Each bucket has `table.replication.factor` copies on distinct servers, one of them its leader
(replica_control): writes and reads go to the leader, followers copy its changelog, and when
the leader's server dies a follower that has every acknowledged write takes over. With one
copy a bucket stays with its server while that server is down, and writes to it wait (clients
retry) until the server is back.

Handlers are registered by name in `self.actions`; later features (column locks, commits) add
their own handlers to that table rather than changing the transport.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Callable

from locks.coordinator_actions import CoordinatorLocks
from tally.errors import (AlreadyExistsError, InvalidInputError, NotFoundError,
                          PermissionDeniedError, SchemaError, TableRecreatedError, TallyError,
                          UnavailableError)
from tally.meta import MetadataStore
from tally.server.coordinator.admin_truncation import AdminTruncation
from tally.server.coordinator.bucket_restore import BucketRestore
from tally.server.coordinator.catalog import (DEFAULT_DATABASE, Catalog, PartitionRecord,
                                              TableRecord, split_table_name)
from tally.server.coordinator.column_addition import ColumnAddition
from tally.server.coordinator.consumer_registry import ConsumerRegistry
from tally.server.coordinator.departure_probe import DepartureProbe
from tally.server.coordinator.lake_registry import LakeRegistry
from tally.server.coordinator.lease_grants import LeaseGrants
from tally.server.coordinator.metric_reports import MetricReports
from tally.server.coordinator.option_changes import OptionChanges
from tally.server.coordinator.replica_control import ReplicaControl
from tally.server.coordinator.rollup_catalog import RollupCatalog
from tally.server.coordinator.snapshot_registry import SnapshotRegistry
from tally.server.membership import (COORDINATOR, EphemeralRegistration, HeartbeatLiveness,
                                     ZooKeeperLiveness)
from tally.server.metrics import ServerMetrics
from tally.server.settings import REPLICA_LAG_TIME, SESSION_TIMEOUT, SETTLE_TIMEOUT, TIER_TIMEOUT
from tally.wire.channel import ChannelPool, FlightChannel
from tally.wire.messages import check_json_depth, field, int_items
from tally.wire.routing import TableRouting

log = logging.getLogger(__name__)

Action = Callable[[dict], Any]

# how long a heartbeat that moves a live server waits for that server's old address to answer
HIJACK_PROBE_TIMEOUT = 2.0


class Coordinator:
    """Metadata service of a cluster. `actions` maps DoAction names to handlers."""

    def __init__(self, store: MetadataStore, address: str, token: str | None = None,
                 session_timeout: float = SESSION_TIMEOUT, clock=time.time, tls=None,
                 metrics: ServerMetrics | None = None, default_replication_factor: int = 1,
                 replica_replace_after: float = 60.0, datalake_dir: str | None = None,
                 tier_timeout: float = TIER_TIMEOUT,
                 replica_lag_time: float = REPLICA_LAG_TIME) -> None:
        """`clock`: the time lock expiry is judged by (tests move it; see server.clock).
        `metrics`: the process's (a registry of its own when None).
        `default_replication_factor`: copies of each bucket of a table that names none;
        `replica_replace_after`: seconds a server may be gone before its copies are made
        again on other servers; `datalake_dir`: the root of the lake tables (None: no lake);
        `tier_timeout`: seconds a tiering process may miss heartbeats before its tables move;
        `replica_lag_time`: seconds a follower may go without catching up before it leaves
        the in-sync set (tables may set their own)."""
        self.store = store
        self.metrics = metrics if metrics is not None else ServerMetrics()
        self.clock = clock
        self.address = address
        self.catalog = Catalog(store)
        self.channels = ChannelPool(token, tls=tls)
        self._cluster_token = token
        self._tls = tls
        self._zookeeper = store.kind == "zookeeper"
        self.liveness = ZooKeeperLiveness(store) if self._zookeeper \
            else HeartbeatLiveness(session_timeout)
        self._registration = EphemeralRegistration(store, COORDINATOR, {"address": address}) \
            if self._zookeeper else None
        self._lock = threading.Lock()
        self._problems: dict[str, list[str]] = {}  # server id -> what its last heartbeat said
        swept = self.catalog.sweep_orphans()
        if swept:
            log.info("swept orphaned table ids %s", swept)
        self.catalog.create_database(DEFAULT_DATABASE, ignore_if_exists=True)
        self.actions: dict[str, Action] = {
            "create_database": self.create_database,
            "drop_database": self.drop_database,
            "list_databases": lambda body: self.catalog.list_databases(),
            "create_table": self.create_table,
            "drop_table": self.drop_table,
            "list_tables": lambda body: self.catalog.list_tables(field(body, "database", str)),
            "table_info": self.table_info,
            "create_partition": self.create_partition,
            "drop_partition": self.drop_partition,
            "list_partitions": self.list_partitions,
            "list_offsets": self.list_offsets_action,
            "list_servers": self.list_servers,
            "bucket_info": self.bucket_info,
            "heartbeat": self.heartbeat,
        }
        self.locking = CoordinatorLocks(self)  # adds the lock, commit and retention actions
        self.reports = MetricReports(self)  # adds undo_report; shows the lock holders
        self.consumers = ConsumerRegistry(self)  # adds the changelog consumers' actions
        ColumnAddition(self)  # adds add_column
        OptionChanges(self)  # adds set_table_options
        AdminTruncation(self)  # adds truncate_log
        # every answered heartbeat grants a leader lease; elections wait for it to run out
        self.leases = LeaseGrants(session_timeout)
        self.actions["heartbeat"] = self._heartbeat_granting_lease
        # heartbeats arrive within a session; ZooKeeper's live nodes are read at once
        grace = session_timeout + 1.0 if not self._zookeeper else 1.0
        self.replicas = ReplicaControl(self, default_replication_factor, replica_replace_after,
                                       grace, lag_time=replica_lag_time)
        # a server whose process died is gone at once, not after its session timeout
        self.departures = DepartureProbe(self.liveness, self._departed)
        self.snapshots = SnapshotRegistry(self)  # adds snapshot_register, bucket_snapshots
        BucketRestore(self)  # adds restore_bucket
        self.lake = LakeRegistry(self, datalake_dir, tier_timeout)  # adds the tiering actions
        self.rollups = RollupCatalog(self)  # adds the rollup actions; guards drops of sources

    # --- databases and tables -----------------------------------------------------------

    def create_database(self, body: dict) -> None:
        self.catalog.create_database(field(body, "name", str), bool(body.get("ignore_if_exists")))

    def drop_database(self, body: dict) -> None:
        dropped = self.catalog.drop_database(field(body, "name", str),
                                             bool(body.get("ignore_if_not_exists")),
                                             bool(body.get("cascade")))
        for record in dropped:
            self.forget_table(record, bool(body.get("purge_lake")))

    @staticmethod
    def parse_descriptor(text: Any):
        """The TableDescriptor stored as `text`, validated (a garbage descriptor is refused)."""
        from merge_engine import TableDescriptor

        if not isinstance(text, str):
            raise SchemaError(f"a table descriptor must be JSON text, not {type(text).__name__}")
        check_json_depth(text, "a table descriptor")
        descriptor = TableDescriptor.from_json(text)
        if not descriptor.schema.primary_key:
            raise SchemaError("Tally tables need a primary key: the tablets are key-value stores")
        return descriptor

    def create_table(self, body: dict) -> dict:
        name = field(body, "name", str)
        split_table_name(name)
        descriptor = self.parse_descriptor(body.get("descriptor"))
        try:
            existing = self.catalog.get_table(name)
        except NotFoundError:
            existing = None
        if existing is not None:
            if body.get("ignore_if_exists"):
                return {"table_id": existing.table_id, "created": False}
            raise AlreadyExistsError(f"table '{name}' already exists")
        self.replicas.validate(descriptor)  # partitioned tables place buckets later
        if descriptor.lake.enabled:
            self.lake.check_enable(name)  # a lake nothing could tier is refused at once
        owners = None if descriptor.schema.partition_key else \
            self.assign(descriptor, descriptor.bucket_count, salt=0)
        try:
            record = self.catalog.create_table(name, descriptor.to_json(), owners)
        except AlreadyExistsError:
            if body.get("ignore_if_exists"):
                return {"table_id": self.catalog.get_table(name).table_id, "created": False}
            raise
        if owners is not None:
            self.replicas.created(owners)
        log.info("created table %s (id %d)", name, record.table_id)
        return {"table_id": record.table_id, "created": True}

    def drop_table(self, body: dict) -> None:
        try:
            record = self.catalog.drop_table(field(body, "name", str))
        except NotFoundError:
            if body.get("ignore_if_not_exists"):
                return
            raise
        self.forget_table(record, bool(body.get("purge_lake")))

    def forget_table(self, record: TableRecord, purge_lake: bool = False) -> None:
        """What a dropped table leaves besides its catalog nodes: locks, consumers, snapshots,
        its lake and its tablets."""
        self.locking.drop_table(record.table_id)
        self.consumers.drop_table(record.table_id)
        self.snapshots.drop_table(record.table_id)
        self.lake.drop_table(record, purge_lake)
        self._forget_tablets(record.table_id)

    def _forget_tablets(self, table_id: int) -> None:
        """Tell live tablet servers to close and delete a dropped table's tablets (best effort:
        servers that are down learn it from their next heartbeat)."""
        for server_id, address in self.liveness.live().items():
            try:
                self.channels.get(address).action("drop_tablets", {"table_id": table_id})
            except TallyError as e:
                log.info("tablet server %s will learn of the drop later: %s", server_id, e)

    def named_table(self, body: dict) -> TableRecord:
        """The table a request names; with a `table_id` (what the caller's handle resolved), it
        must still be that table, else TableRecreatedError (never a silent switch to the new
        table of the same name)."""
        record = self.catalog.get_table(field(body, "name", str))
        table_id = field(body, "table_id", int, None)
        if table_id is not None and table_id != record.table_id:
            raise TableRecreatedError.of(record.name, table_id, record.table_id)
        return record

    def routing(self, record: TableRecord) -> TableRouting:
        return TableRouting.from_descriptor(record.name, record.table_id,
                                            self.parse_descriptor(record.descriptor))

    def table_info(self, body: dict) -> dict:
        record = self.catalog.get_table(field(body, "name", str))
        partitions = self.catalog.partitions(record.table_id)
        return {
            "name": record.name, "table_id": record.table_id, "descriptor": record.descriptor,
            "created_at": record.created_at, "routing": self.routing(record).to_json(),
            "partitions": [p.to_json() for p in partitions],
            "servers": self.server_addresses(),
        }

    # --- partitions and assignment ------------------------------------------------------

    def assign(self, descriptor, bucket_count: int, salt: int):
        """Replicas for `bucket_count` new buckets of a table (replica_placement): the live
        servers round robin from `salt`; only the healthy ones while there are enough (a full
        disk should not get new buckets)."""
        live = sorted(self.liveness.live())
        if not live:
            raise UnavailableError("no live tablet server to host new buckets; start one")
        healthy = [sid for sid in live if not self._problems.get(sid)]
        try:
            return self.replicas.place(descriptor, bucket_count, salt, healthy)
        except UnavailableError:
            return self.replicas.place(descriptor, bucket_count, salt, live)

    def create_partition(self, body: dict) -> dict:
        """Create a partition (admin, or a client's first write to it when dynamic creation is
        on); returns the partition, existing or new."""
        record = self.named_table(body)
        routing = self.routing(record)
        if not routing.partitioned:
            raise InvalidInputError(f"table '{record.name}' is not partitioned")
        partition = body.get("partition")
        if not isinstance(partition, str) or not partition:
            raise InvalidInputError(f"partition name must be a non-empty string: {partition!r}")
        existing = self.catalog.get_partition(record.table_id, partition)
        if existing is not None:
            return existing.to_json()
        if body.get("dynamic") and not routing.dynamic_partitions:
            raise NotFoundError(
                f"partition '{partition}' of table '{record.name}' does not exist and dynamic "
                "partition creation is off for this table (table.partition.dynamic-creation."
                "enabled = false); create it with admin.create_partition")
        expected = routing.partition_key
        if len(partition.split("$")) != len(expected):
            raise InvalidInputError(
                f"partition name '{partition}' does not have one value per partition-key "
                f"column {list(expected)} (values are joined with '$')")
        with self._lock:
            owners = self.assign(self.parse_descriptor(record.descriptor), routing.bucket_count,
                                 salt=len(self.catalog.partitions(record.table_id)))
            created = self.catalog.create_partition(record.table_id, partition, owners)
        self.replicas.created(created.buckets)
        log.info("partition %s of %s: id %d", partition, record.name, created.partition_id)
        return created.to_json()

    def drop_partition(self, body: dict) -> None:
        record = self.catalog.get_table(field(body, "name", str))
        self.catalog.drop_partition(record.table_id, field(body, "partition", str))

    def list_partitions(self, body: dict) -> list[str]:
        record = self.catalog.get_table(field(body, "name", str))
        return [p.name for p in self.catalog.partitions(record.table_id) if p.name is not None]

    # --- servers ------------------------------------------------------------------------

    def server_addresses(self) -> dict[str, str | None]:
        """Every known tablet server: its address when live, else None."""
        live = self.liveness.live()
        known = {sid: None for sid in self.catalog.known_servers()}
        known.update(live)
        return known

    def list_servers(self, body: dict) -> list[dict]:
        """Every known tablet server: address, live, and (while live) healthy and the problems
        its last heartbeat reported (such as a bucket whose disk is full)."""
        live = self.liveness.live()
        known = self.catalog.known_servers()
        lagging = self.replicas.out_of_sync()
        out = []
        for sid in sorted(set(known) | set(live)):
            problems = self._problems.get(sid, []) if sid in live else []
            out.append({"server_id": sid, "address": live.get(sid, known.get(sid)),
                        "live": sid in live, "healthy": sid in live and not problems,
                        "problems": problems, "out_of_sync": lagging.get(sid, [])})
        return out

    def heartbeat(self, body: dict) -> dict:
        """A tablet server says it is live at its address (only the cluster credential may call
        this). Every field is checked, and the answer worked out, before the heartbeat counts:
        one that fails anywhere changes nothing, liveness included."""
        server_id, address = field(body, "server_id", str), field(body, "address", str)
        table_ids = int_items(field(body, "table_ids", list, []), "table_ids")
        problems = field(body, "problems", list, [])
        incarnation = field(body, "incarnation", str, None)
        if not all(isinstance(p, str) for p in problems):
            raise InvalidInputError("malformed request: the field 'problems' must hold strings")
        reports = self.snapshots.check_reports(body.get("high_watermarks", []))
        dropped = []
        for table_id in table_ids:
            try:
                self.catalog.table_by_id(table_id)
            except NotFoundError:
                dropped.append(table_id)
        self._refuse_address_hijack(server_id, address)
        self.catalog.remember_server(server_id, address)
        self._problems[server_id] = problems
        # before it counts as live: a new process's copies leave the in-sync sets first
        self.replicas.incarnations.heard(server_id, incarnation)
        self.liveness.heartbeat(server_id, address)
        self.departures.heard(server_id)
        self.snapshots.heartbeat(server_id, reports)
        return {"dropped_table_ids": dropped, "replica_version": self.replicas.version}

    def _heartbeat_granting_lease(self, body: dict) -> dict:
        """A heartbeat, whose answer grants the server a leader lease from its send time
        (lease_grants): the grant is recorded before the answer's replica version is read."""
        received = self.leases.now()
        answer = self.heartbeat(body)
        with self.leases.granting(body["server_id"], received) as seconds:
            answer["replica_version"] = self.replicas.version
            answer["lease_seconds"] = seconds if seconds is not None else 0
        return answer

    def _departed(self, server_id: str) -> None:
        """A live server's port refuses connections: its process, and so its lease, is gone;
        its buckets get new leaders now."""
        self.leases.end(server_id)
        self.replicas.wake()

    def _refuse_address_hijack(self, server_id: str, address: str) -> None:
        """A live server's address moves only when the server itself has moved: if its current
        address still answers as that server, a heartbeat naming another address comes from
        someone else and is refused. A restarted server's old address no longer answers."""
        current = self.liveness.live().get(server_id)
        if current is None or current == address:
            return
        probe = FlightChannel(current, self._cluster_token, timeout=HIJACK_PROBE_TIMEOUT,
                              tls=self._tls)
        try:
            answer = probe.action("server_id")
        except TallyError:
            return  # gone from there: the server moved (restarted on another port)
        finally:
            probe.close()
        if answer == server_id:
            raise PermissionDeniedError(
                f"tablet server {server_id} is live at {current}; a heartbeat moving it to "
                f"{address} was refused (it does not come from that server); nothing changed")

    def bucket_info(self, body: dict) -> dict:
        """What a tablet server needs to open a bucket, checked against the assignment."""
        table_id, partition_id, bucket = field(body, "table_id", int), \
            field(body, "partition_id", int), field(body, "bucket", int)
        record = self.catalog.table_by_id(table_id)
        partition = self.catalog.partition_by_id(table_id, partition_id)
        if not 0 <= bucket < len(partition.buckets):
            raise NotFoundError(f"table '{record.name}' has no bucket {bucket}")
        replicas = partition.buckets[bucket]
        return {"name": record.name, "descriptor": record.descriptor,
                "routing": self.routing(record).to_json(), "partition": partition.name,
                "replicas": replicas.to_json()}

    # --- offsets ------------------------------------------------------------------------

    def log_offsets(self, record: TableRecord, settle: bool = False
                    ) -> dict[tuple[str | None, int], tuple[int, int]]:
        """(log start, log end) of every bucket of every partition, asked of their servers;
        with `settle`, each end only once every record its leader holds is committed."""
        name = record.name
        by_owner: dict[str, list[tuple[PartitionRecord, int]]] = {}
        for p in self.catalog.partitions(record.table_id):
            for bucket, replicas in enumerate(p.buckets):
                if replicas.leader is None:
                    raise UnavailableError(
                        f"bucket {bucket} of '{name}' has no leader: none of its in-sync "
                        f"replicas {list(replicas.isr)} is live")
                by_owner.setdefault(replicas.leader, []).append((p, bucket))
        live = self.liveness.live()
        out: dict[tuple[str | None, int], tuple[int, int]] = {}
        for owner, buckets in by_owner.items():
            if owner not in live:
                raise UnavailableError(
                    f"tablet server {owner} leading buckets of '{name}' is not live")
            body = {"table_id": record.table_id,
                    "buckets": [[p.partition_id, b] for p, b in buckets]}
            if settle:
                body["settle"] = True
            answer = self.channels.get(live[owner]).action(
                "offsets", body, timeout=SETTLE_TIMEOUT + 10.0 if settle else None)
            for (p, bucket), (start, end) in zip(buckets, answer):
                out[(p.name, bucket)] = (int(start), int(end))
        return out

    def list_offsets(self, name: str, settle: bool = False) -> dict[tuple[str | None, int], int]:
        """The current end offset of every bucket (the shape locks and commits record);
        `settle` as for log_offsets."""
        return {key: end for key, (_start, end) in
                self.log_offsets(self.catalog.get_table(name), settle).items()}

    def list_offsets_action(self, body: dict) -> list[list]:
        """[[partition, bucket, start, end], ...] sorted by partition and bucket (of the table
        id the body names, when it names one); settled ends when the body says `settle`."""
        offsets = self.log_offsets(self.named_table(body), field(body, "settle", bool, False))
        return [[p, b, start, end] for (p, b), (start, end) in
                sorted(offsets.items(), key=lambda kv: (kv[0][0] or "", kv[0][1]))]

    def close(self) -> None:
        self.departures.close()
        self.locking.close()
        self.replicas.close()
        if self._registration is not None:
            self._registration.close()
        self.liveness.close()
        self.channels.close()

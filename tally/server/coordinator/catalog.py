"""The coordinator's persistent catalog: databases, tables, partitions and bucket assignments.

Layout in the metadata store (names are quoted with `tally.meta.node_name`):

    /databases/<db>                       {"name"}
    /databases/<db>/tables/<table>        {"name", "table_id", "descriptor", "created_at"}
    /tables/<table_id>                    {"name"}                  (the id's own subtree)
    /tables/<table_id>/partitions/<part>  {"name", "partition_id", "buckets": [replicas]}
    /servers/<server_id>                  {"address", "incarnation"} (every tablet server known)
    /ids/<counter>                        {"next"}

Each bucket's entry in "buckets" is its BucketReplicas: the servers holding a copy, the leader
among them, the in-sync replicas and the leader epoch. They live in the partition node so that
an election or an in-sync change is one compare-and-set of that node (store.update).

An unpartitioned table has one partition node named `none` (partition id 0). A table becomes
visible the moment its name node is created, and everything under /tables/<id> is written
before that, so a crash mid-create leaves an invisible orphan (swept at start) and never a
half-made table. Drop deletes the name node first, for the same reason. Creating a node is how
racing creators are arbitrated: exactly one wins.

Later features keep their own subtrees beside these (/locks/<table_id>, /commits/<table_id>,
/rollups/<source table_id>).
"""

from __future__ import annotations

import dataclasses
import re
import time

from tally.errors import AlreadyExistsError, InvalidInputError, NotFoundError, VersionConflictError
from tally.meta import MetadataStore, join_path, node_name, text_of

# matched whole (fullmatch): with `match`, `$` also matches before a trailing newline
NAME_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_\-]{0,127}")
UNPARTITIONED = "none"
DEFAULT_DATABASE = "default"


def check_name(kind: str, name: str) -> str:
    if not isinstance(name, str) or not NAME_RE.fullmatch(name):
        raise InvalidInputError(
            f"invalid {kind} name {name!r}: use letters, digits, '_' and '-' (at most 128)")
    return name


def split_table_name(full: str) -> tuple[str, str]:
    """('db', 'table') from 'db.table'."""
    if not isinstance(full, str) or full.count(".") != 1:
        raise InvalidInputError(f"table names are '<database>.<table>', not {full!r}")
    db, table = full.split(".")
    return check_name("database", db), check_name("table", table)


@dataclasses.dataclass(frozen=True)
class TableRecord:
    name: str                # "db.table"
    table_id: int
    descriptor: str          # TableDescriptor JSON
    created_at: float


@dataclasses.dataclass(frozen=True)
class BucketReplicas:
    """Who holds one bucket: `replicas` (distinct servers, the preferred leader first), the
    `leader` (None while no in-sync replica is live: the bucket is offline), `isr` (the
    in-sync replicas: the leader and the followers that have every acknowledged write) and
    `leader_epoch` (bumped by every leader change; it fences a deposed leader)."""

    leader: str | None
    replicas: tuple[str, ...]
    isr: tuple[str, ...]
    leader_epoch: int = 0

    @classmethod
    def single(cls, server_id: str) -> "BucketReplicas":
        return cls(server_id, (server_id,), (server_id,), 0)

    def to_json(self) -> dict:
        return {"leader": self.leader, "replicas": list(self.replicas), "isr": list(self.isr),
                "leader_epoch": self.leader_epoch}

    @classmethod
    def from_json(cls, value) -> "BucketReplicas":
        if isinstance(value, str):  # written before replication: one copy, its server leads
            return cls.single(value)
        return cls(value["leader"], tuple(value["replicas"]), tuple(value["isr"]),
                   int(value["leader_epoch"]))


@dataclasses.dataclass(frozen=True)
class PartitionRecord:
    name: str | None         # None for the single partition of an unpartitioned table
    partition_id: int
    buckets: tuple[BucketReplicas, ...]  # per bucket

    def to_json(self) -> dict:
        return {"name": self.name, "partition_id": self.partition_id,
                "buckets": [b.to_json() for b in self.buckets]}

    @classmethod
    def from_json(cls, d: dict) -> "PartitionRecord":
        return cls(d["name"], int(d["partition_id"]),
                   tuple(BucketReplicas.from_json(b) for b in d["buckets"]))


class Catalog:
    """Reads and writes the catalog nodes; knows nothing about live servers or descriptors."""

    def __init__(self, store: MetadataStore) -> None:
        self.store = store

    # --- databases ------------------------------------------------------------------------

    def _db_path(self, db: str) -> str:
        return join_path("databases", node_name(check_name("database", db)))

    def create_database(self, db: str, ignore_if_exists: bool = False) -> None:
        check_name("database", db)
        try:
            self.store.create(self._db_path(db), {"name": db, "created_at": time.time()})
        except AlreadyExistsError:
            if not ignore_if_exists:
                raise AlreadyExistsError(f"database '{db}' already exists") from None

    def database_exists(self, db: str) -> bool:
        return self.store.get(self._db_path(db)) is not None

    def list_databases(self) -> list[str]:
        return sorted(text_of(n) for n in self.store.children("/databases"))

    def drop_database(self, db: str, ignore_if_not_exists: bool = False,
                      cascade: bool = False) -> list[TableRecord]:
        """Drop a database; with `cascade` its tables too (returned so their data can go)."""
        if not self.database_exists(db):
            if ignore_if_not_exists:
                return []
            raise NotFoundError(f"database '{db}' does not exist")
        tables = [self.get_table(f"{db}.{t}") for t in self.list_tables(db)]
        if tables and not cascade:
            raise InvalidInputError(
                f"database '{db}' is not empty ({len(tables)} tables); drop with cascade=True")
        for record in tables:
            self.drop_table(record.name)
        self.store.delete(self._db_path(db), recursive=True)
        return tables

    # --- tables ---------------------------------------------------------------------------

    def _table_path(self, full: str) -> str:
        db, table = split_table_name(full)
        return join_path("databases", node_name(db), "tables", node_name(table))

    def _id_path(self, table_id: int, *rest: str) -> str:
        return join_path("tables", str(table_id), *rest)

    def list_tables(self, db: str) -> list[str]:
        if not self.database_exists(db):
            raise NotFoundError(f"database '{db}' does not exist")
        return sorted(text_of(n) for n in
                      self.store.children(join_path(self._db_path(db), "tables")))

    def get_table(self, full: str) -> TableRecord:
        node = self.store.get(self._table_path(full))
        if node is None:
            db, _ = split_table_name(full)
            where = "" if self.database_exists(db) else f" (database '{db}' does not exist)"
            raise NotFoundError(f"table '{full}' does not exist{where}")
        v = node.value
        return TableRecord(full, int(v["table_id"]), v["descriptor"], float(v["created_at"]))

    def table_by_id(self, table_id: int) -> TableRecord:
        node = self.store.get(self._id_path(table_id))
        if node is None:
            raise NotFoundError(f"table id {table_id} does not exist (dropped or re-created)")
        record = self.get_table(node.value["name"])
        if record.table_id != table_id:
            raise NotFoundError(f"table id {table_id} does not exist (dropped or re-created)")
        return record

    def create_table(self, full: str, descriptor_json: str,
                     first_partition: tuple[BucketReplicas, ...] | None,
                     together=None) -> TableRecord:
        """Create a table; `first_partition` is the buckets' replicas of an unpartitioned
        table. `together(table_id)`: more ops applied in the one transaction that makes the
        table visible (a rollup's record): all of them or none."""
        db, _ = split_table_name(full)
        if not self.database_exists(db):
            raise NotFoundError(f"database '{db}' does not exist")
        if self.store.get(self._table_path(full)) is not None:
            raise AlreadyExistsError(f"table '{full}' already exists")
        table_id = self.store.next_id("table")
        self.store.create(self._id_path(table_id), {"name": full})
        if first_partition is not None:
            self.store.create(self._id_path(table_id, "partitions", UNPARTITIONED),
                              PartitionRecord(None, 0, first_partition).to_json())
        record = TableRecord(full, table_id, descriptor_json, time.time())
        value = {"name": full, "table_id": table_id, "descriptor": descriptor_json,
                 "created_at": record.created_at}
        try:
            if together is None:
                self.store.create(self._table_path(full), value)
            else:
                self.store.transaction([("create", self._table_path(full), value),
                                        *together(table_id)])
        except AlreadyExistsError:
            self.store.delete(self._id_path(table_id), recursive=True)
            raise AlreadyExistsError(f"table '{full}' already exists") from None
        except (VersionConflictError, NotFoundError):
            self.store.delete(self._id_path(table_id), recursive=True)
            raise
        return record

    def set_descriptor(self, full: str, table_id: int, old_json: str, new_json: str) -> None:
        """Replace a table's descriptor (add_column), only if it is still table `table_id`
        with descriptor `old_json`: a concurrent change or re-creation makes it an error."""
        def change(value: dict) -> dict:
            if int(value["table_id"]) != table_id or value["descriptor"] != old_json:
                raise VersionConflictError(f"table '{full}' changed meanwhile; nothing was changed, "
                                    "retry the call")
            return dict(value, descriptor=new_json)

        self.store.update(self._table_path(full), change)

    def drop_table(self, full: str, together: tuple = ()) -> TableRecord:
        """Drop a table; `together`: more ops applied with the removal of its name."""
        record = self.get_table(full)
        if together:
            self.store.transaction([("delete", self._table_path(full), None), *together])
        else:
            self.store.delete(self._table_path(full), recursive=True)
        self.store.delete(self._id_path(record.table_id), recursive=True)
        return record

    def sweep_orphans(self) -> list[int]:
        """Delete /tables/<id> subtrees that no table name points at (a crash mid-create)."""
        swept = []
        for child in self.store.children("/tables"):
            node = self.store.get(join_path("tables", child))
            try:
                alive = node is not None and \
                    self.get_table(node.value["name"]).table_id == int(child)
            except (NotFoundError, InvalidInputError, KeyError):
                alive = False
            if not alive:
                self.store.delete(join_path("tables", child), recursive=True)
                swept.append(int(child))
        return swept

    # --- partitions -----------------------------------------------------------------------

    def _partition_path(self, table_id: int, partition: str | None) -> str:
        # Partition names become metadata node names, held to the metadata stores' name limit
        # (ZooKeeper would also drop a connection over its 1 MB packet limit, and the client
        # retry forever).
        name = UNPARTITIONED if partition is None else node_name(partition, "partition name")
        return self._id_path(table_id, "partitions", name)

    def partitions(self, table_id: int) -> list[PartitionRecord]:
        out = []
        for child in self.store.children(self._id_path(table_id, "partitions")):
            node = self.store.get(self._id_path(table_id, "partitions", child))
            if node is not None:
                out.append(PartitionRecord.from_json(node.value))
        return sorted(out, key=lambda p: (p.name is not None, p.name or ""))

    def get_partition(self, table_id: int, partition: str | None) -> PartitionRecord | None:
        node = self.store.get(self._partition_path(table_id, partition))
        return PartitionRecord.from_json(node.value) if node else None

    def partition_by_id(self, table_id: int, partition_id: int) -> PartitionRecord:
        for p in self.partitions(table_id):
            if p.partition_id == partition_id:
                return p
        raise NotFoundError(f"partition id {partition_id} of table id {table_id} does not exist")

    def create_partition(self, table_id: int, partition: str,
                         buckets: tuple[BucketReplicas, ...]) -> PartitionRecord:
        """Create a partition, or return the existing one (the first creator's assignment)."""
        existing = self.get_partition(table_id, partition)
        if existing is not None:
            return existing
        record = PartitionRecord(partition, self.store.next_id("partition"), buckets)
        try:
            self.store.create(self._partition_path(table_id, partition), record.to_json())
        except AlreadyExistsError:
            return self.get_partition(table_id, partition)
        owner = self.store.get(self._id_path(table_id))
        if owner is None or "name" not in owner.value:  # dropped meanwhile: undo our create
            self.store.delete(self._id_path(table_id), recursive=True)
            raise NotFoundError(f"table id {table_id} was dropped")
        return record

    def update_buckets(self, table_id: int, partition: str | None,
                       change) -> PartitionRecord | None:
        """Apply `change(buckets) -> buckets` to a partition's replicas as one compare-and-set
        (a concurrent change retries it on the fresh value); None if the partition is gone."""
        path = self._partition_path(table_id, partition)
        if self.store.get(path) is None:
            return None

        def apply(value: dict) -> dict:
            record = PartitionRecord.from_json(value)
            return dataclasses.replace(record, buckets=tuple(change(record.buckets))).to_json()

        try:
            return PartitionRecord.from_json(self.store.update(path, apply).value)
        except NotFoundError:
            return None

    def drop_partition(self, table_id: int, partition: str) -> PartitionRecord:
        record = self.get_partition(table_id, partition)
        if record is None:
            raise NotFoundError(f"partition '{partition}' does not exist")
        self.store.delete(self._partition_path(table_id, partition), recursive=True)
        return record

    # --- tablet servers -------------------------------------------------------------------

    def remember_server(self, server_id: str, address: str) -> None:
        path = join_path("servers", node_name(server_id))
        node = self.store.get(path)
        if node is None or node.value["address"] != address:
            self.store.update(path, lambda v: {**v, "address": address, "seen_at": time.time()},
                              create={})

    def known_servers(self) -> dict[str, str]:
        out = {}
        for child in self.store.children("/servers"):
            node = self.store.get(join_path("servers", child))
            if node is not None:
                out[text_of(child)] = node.value["address"]
        return out

    def server_incarnation(self, server_id: str) -> str | None:
        """The process of `server_id` last heard (None: never, or before incarnations)."""
        node = self.store.get(join_path("servers", node_name(server_id)))
        return None if node is None else node.value.get("incarnation")

    def set_server_incarnation(self, server_id: str, incarnation: str) -> bool:
        """Record the process `server_id` now runs as; False when the server is not known yet
        (its first heartbeat remembers it, and records this again)."""
        try:
            self.store.update(join_path("servers", node_name(server_id)),
                              lambda v: {**v, "incarnation": incarnation})
        except NotFoundError:
            return False
        return True

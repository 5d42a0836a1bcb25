"""`conn.admin`: databases, tables, partitions and offsets, answered by the coordinator."""

from __future__ import annotations

import dataclasses

from tally.client.consumer_position import ConsumerPosition
from tally.client.lake_snapshot import LakeSnapshot, LakeStatus
from tally.client.rollup_backfill import BACKFILL_WAIT, backfill
from tally.errors import InvalidInputError, NotFoundError
from tally.timestamps import iso
from tally.wire.messages import SETTLE_WAIT


@dataclasses.dataclass(frozen=True)
class TableInfo:
    """What `describe_table` returns: the table's identity and its descriptor."""

    name: str
    table_id: int
    descriptor: object          # merge_engine.TableDescriptor
    partitions: list[str]
    created_at: float
    # the RollupSpec of each rollup of this table, by name (ready and building ones)
    rollups: list = dataclasses.field(default_factory=list)
    rollup_of: object = None    # the RollupSpec that derives this table, or None

    @property
    def bucket_count(self) -> int:
        return self.descriptor.bucket_count

    def __repr__(self) -> str:
        return (f"TableInfo({self.name!r}, table id {self.table_id}, created "
                f"{iso(self.created_at)}, partitions {self.partitions}, {self.descriptor!r})")


class Admin:
    """Catalog operations. Table names are '<database>.<table>'."""

    def __init__(self, connection) -> None:
        self._conn = connection

    def _call(self, action: str, **body):
        return self._conn.coordinator_action(action, body)

    # --- databases ----------------------------------------------------------------------

    def create_database(self, name: str, ignore_if_exists: bool = False) -> None:
        self._call("create_database", name=name, ignore_if_exists=ignore_if_exists)

    def drop_database(self, name: str, ignore_if_not_exists: bool = False,
                      cascade: bool = False) -> None:
        self._call("drop_database", name=name, ignore_if_not_exists=ignore_if_not_exists,
                   cascade=cascade)

    def list_databases(self) -> list[str]:
        return self._call("list_databases")

    # --- tables -------------------------------------------------------------------------

    def create_table(self, name: str, descriptor, ignore_if_exists: bool = False) -> int:
        """Create a table from a TableDescriptor (or its JSON); returns the table id."""
        text = descriptor if isinstance(descriptor, str) else _descriptor_json(descriptor)
        answer = self._call("create_table", name=name, descriptor=text,
                            ignore_if_exists=ignore_if_exists)
        self._conn.invalidate(name)
        return int(answer["table_id"])

    def create_dictionary(self, name: str, id_type: str = "int32", buckets: int = 1,
                          key_type: str = "string", options: dict | None = None,
                          ignore_if_exists: bool = False) -> int:
        """Create a dictionary table (docs/dictionaries.md): `key_type` ("string" or "binary")
        keys mapped to dense `id_type` ids ("int32": below 2^32, for rbm32; "int64": for
        rbm64), assigned by `conn.table(name).ids(keys)`; `options`: other table options
        (`table.replication.factor`, ...). Returns the table id."""
        from merge_engine.table.dictionary import dictionary_descriptor

        return self.create_table(name, dictionary_descriptor(id_type, buckets, key_type,
                                                             options),
                                 ignore_if_exists=ignore_if_exists)

    def add_column(self, name: str, column: str, arrow_type, agg=None, **params) -> int:
        """Add a nullable column to a live table (docs/tables.md, adding a column): existing
        rows read null; writers, sinks and readers see it once they refresh the table's
        metadata. `agg`: its aggregation function (an aggregation table's default otherwise),
        `params` the function's parameters, validated as at table creation. Returns the new
        column's stable id."""
        import pyarrow as pa

        from merge_engine.table.types_json import type_to_json
        from tally.errors import SchemaError

        if not isinstance(arrow_type, pa.DataType):
            raise SchemaError(f"Column '{column}' needs a pyarrow type, got {arrow_type!r}")
        function = getattr(agg, "value", agg)
        answer = self._call("add_column", name=name, column=column,
                            type=type_to_json(arrow_type), agg=function, params=params)
        self._conn.invalidate(name)
        return int(answer["column_id"])

    def drop_table(self, name: str, ignore_if_not_exists: bool = False,
                   purge_lake: bool = False) -> None:
        """Drop a table. Its lake table (if the lake was enabled) stays where it is, readable
        and no longer updated, unless `purge_lake` deletes it too."""
        self._call("drop_table", name=name, ignore_if_not_exists=ignore_if_not_exists,
                   purge_lake=purge_lake)
        self._conn.invalidate(name)

    def set_table_options(self, name: str, options: dict) -> dict:
        """Change the options a live table may change (the lake's: `table.datalake.*`,
        `table.log.retention.ignore-lake`); a value of None removes an option. The table's
        lake options after the change."""
        answer = self._call("set_table_options", name=name, options=options)
        self._conn.invalidate(name)
        return answer["options"]

    # --- the lake ---------------------------------------------------------------------

    def lake_snapshot(self, name: str) -> LakeSnapshot | None:
        """The table's lake table at its newest version the coordinator knows of (path,
        version, offsets), or None before the first tiering round committed."""
        return self.lake_status(name).snapshot

    def lake_status(self, name: str) -> LakeStatus:
        """How far the table's lake is (`tally lake TABLE`); InvalidInputError when the table
        does not tier to a lake."""
        return LakeStatus.from_json(self._call("lake_status", name=name)[0])

    def lake_statuses(self) -> list[LakeStatus]:
        """The lake status of every table that tiers to a lake."""
        return [LakeStatus.from_json(doc) for doc in self._call("lake_status")]

    def list_tables(self, database: str) -> list[str]:
        return self._call("list_tables", database=database)

    def describe_table(self, name: str) -> TableInfo:
        meta = self._conn.table_meta(name, refresh=True)
        return TableInfo(meta.name, meta.table_id, meta.descriptor,
                         [p for p in meta.partition_names() if p is not None], meta.created_at,
                         list(meta.rollups), meta.rollup_of)

    # --- rollups (docs/rollups.md) ------------------------------------------------------

    def create_rollup(self, source: str, name: str, keys, columns, start: str = "backfill",
                      bucket_count: int | None = None, options: dict | None = None,
                      wait: float = BACKFILL_WAIT):
        """Create rollup `name` of table `source`: `keys` (["product", "date_trunc('hour', ts)
        AS hour"]), `columns` ({"clicks": "sum(clicks)", "n": "count(*)"}); `start`
        "backfill" builds it from the source's rows now (epochs on the source wait meanwhile;
        first up to `wait` s for those in flight), "from-now" starts it empty. The RollupSpec,
        ready."""
        from merge_engine.table.rollups import BUILDING, RollupSpec

        spec = RollupSpec.define(name, source, keys, columns, start)
        body = {"source": source, "spec": spec.to_json(), "options": dict(options or {})}
        if bucket_count is not None:
            body["bucket_count"] = bucket_count
        answer = self._call("create_rollup", **body)
        self._conn.invalidate(source)
        spec = RollupSpec.from_json(answer["spec"])
        if spec.state == BUILDING:
            spec = backfill(self._conn, spec, int(answer["table_id"]), wait)
        return spec

    def backfill_rollup(self, name: str, wait: float = BACKFILL_WAIT):
        """Build rollup `name` again from its source: its table made again, empty, then filled
        from a scan (what a backfill that died needs). The RollupSpec, ready."""
        from merge_engine.table.rollups import RollupSpec

        spec = self.describe_table(name).rollup_of
        if spec is None:
            raise InvalidInputError(f"table '{name}' is not a rollup")
        answer = self._call("rollup_reset", name=name, source=spec.source)
        self._conn.invalidate(name)
        self._conn.invalidate(spec.source)
        return backfill(self._conn, RollupSpec.from_json(answer["spec"]),
                        int(answer["table_id"]), wait)

    def drop_rollup(self, name: str, ignore_if_not_exists: bool = False) -> None:
        """Drop rollup `name`: its table and its record under its source."""
        source = None
        try:
            spec = self.describe_table(name).rollup_of
            source = spec.source if spec is not None else None
        except NotFoundError:
            pass
        self._call("drop_rollup", name=name, ignore_if_not_exists=ignore_if_not_exists)
        self._conn.invalidate(name)
        if source:
            self._conn.invalidate(source)

    def list_rollups(self, source: str) -> list:
        """The RollupSpec of each rollup of table `source`, by name."""
        from merge_engine.table.rollups import RollupSpec

        return [RollupSpec.from_json(d) for d in self._call("list_rollups", source=source)]

    # --- partitions and offsets ---------------------------------------------------------

    def create_partition(self, name: str, partition: str | dict) -> str:
        """Create a partition by name ('v1$v2') or by its partition-key values; its name."""
        if isinstance(partition, dict):
            partition = self._conn.table_meta(name).routing.partition_of(partition)
        answer = self._call("create_partition", name=name, partition=partition)
        self._conn.invalidate(name)
        return answer["name"]

    def drop_partition(self, name: str, partition: str) -> None:
        self._call("drop_partition", name=name, partition=partition)
        self._conn.invalidate(name)

    def list_partitions(self, name: str) -> list[str]:
        return self._call("list_partitions", name=name)

    def list_offsets(self, name: str, table_id: int | None = None, settle: bool = False
                     ) -> dict[tuple[str | None, int], int]:
        """{(partition, bucket): end offset} of every bucket, read from the tablet servers
        (each bucket's high watermark). With `table_id`, TableRecreatedError when the name
        now belongs to another table. With `settle`, each end is given only once every record
        its leader holds is committed: a write that was refused as not acknowledged but stays
        in the leader's log is resolved first (UnavailableError while it cannot be)."""
        return {(p, int(b)): int(end) for p, b, _, end in self._offsets(name, table_id, settle)}

    def list_log_offsets(self, name: str, table_id: int | None = None, settle: bool = False
                         ) -> dict[tuple[str | None, int], tuple[int, int]]:
        """{(partition, bucket): (log start offset, log end offset)} of every bucket;
        `table_id` and `settle` as for list_offsets."""
        return {(p, int(b)): (int(start), int(end))
                for p, b, start, end in self._offsets(name, table_id, settle)}

    def _offsets(self, name: str, table_id: int | None, settle: bool = False) -> list:
        body: dict = {"name": name}
        if table_id is not None:
            body["table_id"] = table_id
        if not settle:
            return self._conn.coordinator_action("list_offsets", body)
        body["settle"] = True
        return self._conn.coordinator_action("list_offsets", body, timeout=SETTLE_WAIT)

    def truncate_log(self, name: str, bucket: int, before: int,
                     partition: str | None = None, force: bool = False) -> int:
        """Drop one bucket's changelog records below offset `before`; the new log start.
        Refused (InvalidInputError, nothing dropped) past the oldest offset an unreleased
        column lock's undo or a registered changelog consumer still needs, unless `force`:
        undo from an offset below the new start is then refused, and the consumer fails."""
        return int(self._call("truncate_log", name=name, bucket=bucket, before=before,
                              partition=partition, force=bool(force)))

    # --- changelog consumers ------------------------------------------------------------

    def commit_consumer(self, name: str, consumer: str, positions, table_id: int | None = None
                        ) -> None:
        """Register `consumer`'s positions on table `name`: per bucket the next changelog
        offset it will read, as [[partition or null, bucket, offset], ...] (what a changelog
        reader's `positions()` returns). They replace what it registered before, and retention
        keeps every record from them on for `table.log.retention.consumer-ms`."""
        body = {"name": name, "consumer": consumer, "positions": positions}
        if table_id is not None:
            body["table_id"] = table_id
        self._call("consumer_commit", **body)

    def consumer_positions(self, name: str, table_id: int | None = None
                           ) -> list[ConsumerPosition]:
        """Every consumer registered on table `name`, sorted by name."""
        body = {"name": name} if table_id is None else {"name": name, "table_id": table_id}
        return [ConsumerPosition.from_json(doc) for doc in self._call("consumer_positions",
                                                                      **body)]

    def consumer(self, name: str, consumer: str, table_id: int | None = None
                 ) -> ConsumerPosition | None:
        """One consumer's registered positions, or None."""
        return next((c for c in self.consumer_positions(name, table_id)
                     if c.consumer == consumer), None)

    def remove_consumer(self, name: str, consumer: str) -> bool:
        """Forget a consumer (it then holds back no retention); False when there was none."""
        return bool(self._call("consumer_remove", name=name, consumer=consumer))

    def bucket_replicas(self, name: str) -> dict[tuple[str | None, int], dict]:
        """Who holds each bucket of a table: `{(partition, bucket): {"leader": server id (None
        while no in-sync copy is live), "replicas": [server ids], "isr": [the in-sync ones],
        "leader_epoch": n}}`."""
        return {(p, b): {"leader": leader, "replicas": replicas, "isr": isr,
                         "leader_epoch": epoch}
                for p, b, leader, replicas, isr, epoch in self._call("bucket_replicas",
                                                                     name=name)}

    def restore_bucket(self, name: str, bucket: int, partition: str | None = None,
                       server: str | None = None) -> dict:
        """Rebuild a bucket whose every copy is gone from its newest remote snapshot and the
        remote changelog after it, on live tablet server `server` (default: the least loaded),
        which then leads it. The answer says what was restored and, in `lost` ([first, end)
        offsets, or None), what was acknowledged but never uploaded; `message` says it in
        words. Refused while the bucket has a live leader."""
        return self._call("restore_bucket", name=name, bucket=bucket, partition=partition,
                          server=server)

    def bucket_snapshots(self, name: str) -> dict[tuple[str | None, int], dict]:
        """Per bucket, what its leaders registered of their remote uploads: `snapshot_id`,
        `snapshot_offset`, `segment_end` (where the uploaded changelog ends),
        `high_watermark` (the last one reported) and `leader_epoch`; {} before any."""
        return {(p, b): record for p, b, record in self._call("bucket_snapshots", name=name)}

    def move_leader(self, name: str, bucket: int, partition: str | None = None,
                    to: str | None = None) -> dict:
        """Hand bucket `bucket`'s leadership to server `to` (default: its first replica, the
        preferred leader), which must be live and in sync; the bucket's new replicas."""
        return self._call("move_leader", name=name, bucket=bucket, partition=partition, to=to)

    def list_servers(self) -> list[dict]:
        """Every tablet server the coordinator knows: id, address, live, healthy and the
        problems a live one reported (a bucket whose disk is full, ...)."""
        return self._call("list_servers")


def _descriptor_json(descriptor) -> str:
    to_json = getattr(descriptor, "to_json", None)
    if to_json is None:
        raise InvalidInputError(
            f"create_table needs a TableDescriptor, not {type(descriptor).__name__}")
    return to_json()

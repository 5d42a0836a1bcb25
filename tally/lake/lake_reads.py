"""Reading a table's lake copy: the Delta table alone, or united with the changelog since.

`read_lake` reads the Delta table at the version the coordinator knows of, its columns cast
back to the table's own types (the lake widens unsigned integers, half floats and the like, see
merge_engine.table.lake_options), so it compares equal to a live read of the table at the lake's
offsets.

`read_union` is the lake plus everything since: each bucket's changelog from the lake's offset
to the bucket's end offset, folded to the newest image (or removal) of each key changed, and
applied to the lake's rows. It equals a live read at those end offsets while asking the tablet
servers only for the changed part. `union_plan` is its first half (the snapshot, the end
offsets and the net changes), which the Spark reader sends to its tasks.
"""

from __future__ import annotations

import dataclasses

import pyarrow as pa
import pyarrow.compute as pc

from tally.client.lake_snapshot import LakeSnapshot, Offsets
from tally.errors import LakeError, OffsetOutOfRangeError
from tally.lake.changelog_fold import CHANGE_TYPE, DELETED, OFFSET, apply_changes, net_changes
from tally.lake.delta_table import deltalake
from tally.wire.routing import partition_names

CHUNK_RECORDS = 50_000  # changelog records per request
PLAN_ATTEMPTS = 3       # retention may remove a snapshot's changelog while it is read


def lake_snapshot(conn, name: str) -> LakeSnapshot:
    """The table's newest lake snapshot; LakeError naming the table before its first round."""
    snapshot = conn.admin.lake_snapshot(name)
    if snapshot is None:
        raise LakeError(f"table {name} has no lake snapshot yet: its first tiering round has "
                        "not committed (read it live, or wait for `tally lake` to show a "
                        "version)")
    return snapshot


def lake_dataset(snapshot: LakeSnapshot):
    """The Delta table at the snapshot's version as a pyarrow dataset (one fragment a file)."""
    dl = deltalake()
    try:
        table = dl.DeltaTable(snapshot.path, version=snapshot.version)
    except dl.exceptions.TableNotFoundError:
        raise LakeError(f"the lake table at {snapshot.path} is gone (version "
                        f"{snapshot.version} cannot be read)") from None
    return table.to_pyarrow_dataset()


def tally_rows(rows: pa.Table | pa.RecordBatch, schema: pa.Schema) -> pa.Table:
    """Lake rows in the table's own `schema`: each column cast back from its lake type, and
    columns the lake version does not have yet (added since) all null."""
    columns = []
    for field in schema:
        if field.name in rows.schema.names:
            columns.append(pc.cast(rows.column(field.name), field.type))
        else:
            columns.append(pa.nulls(rows.num_rows, field.type))
    return pa.Table.from_arrays(columns, schema=schema)


def live_partitions_only(rows: pa.Table, partition_key: list[str],
                         partitions: frozenset | None) -> pa.Table:
    """`rows` of the partitions that still exist (the lake keeps a dropped partition's rows);
    all of them when `partitions` is None (the table is not partitioned)."""
    if partitions is None or not partition_key or rows.num_rows == 0:
        return rows
    names = pa.array(partition_names(rows, partition_key), pa.string())
    return rows.filter(pc.is_in(names, value_set=pa.array(sorted(partitions), pa.string())))


def without_keys(rows: pa.Table, keys: pa.Table, primary_key: list[str]) -> pa.Table:
    """`rows` but those whose primary key is in `keys` (both in the table's types)."""
    if keys.num_rows == 0 or rows.num_rows == 0:
        return rows
    # join the keys only: Arrow's joins carry no list or map columns
    index = rows.select(primary_key).append_column(
        "_tally_index", pa.array(range(rows.num_rows), pa.int64()))
    kept = index.join(keys.select(primary_key), keys=primary_key, join_type="left anti",
                      use_threads=False)
    return rows.take(kept.column("_tally_index").combine_chunks().sort())


def _sorted(rows: pa.Table, primary_key: list[str]) -> pa.Table:
    if rows.num_rows < 2:
        return rows
    return rows.sort_by([(c, "ascending") for c in primary_key])


def read_lake(conn, name: str, snapshot: LakeSnapshot | None = None) -> pa.Table:
    """The table's rows as its lake copy holds them at `snapshot` (default: the newest the
    coordinator knows of), in the table's column types, ordered by primary key like
    `Table.to_arrow()`. LakeError naming the table when it has no lake snapshot yet."""
    snapshot = snapshot or lake_snapshot(conn, name)
    routing = conn.table(name).routing
    rows = tally_rows(lake_dataset(snapshot).to_table(), routing.arrow_schema)
    return _sorted(rows, list(routing.primary_key))


@dataclasses.dataclass(frozen=True)
class UnionPlan:
    """A union read's driver half: the lake snapshot, the end offset each bucket's changelog
    was read to, and the net change of every key changed in between (the table's columns in
    its types, plus DELETED)."""

    name: str
    snapshot: LakeSnapshot
    offsets: Offsets
    changes: pa.Table
    primary_key: tuple[str, ...]
    partitions: frozenset | None  # the partitions that exist (None: not partitioned)

    @property
    def changed_keys(self) -> pa.Table:
        return self.changes.select(list(self.primary_key))

    @property
    def live_images(self) -> pa.Table:
        """The newest rows of the changed keys that still exist."""
        return self.changes.filter(pc.invert(self.changes.column(DELETED))) \
            .drop_columns([DELETED])

    def rows(self, conn) -> pa.Table:
        """The union: the lake's rows with every changed key replaced or removed."""
        routing = conn.table(self.name).routing
        lake = read_lake(conn, self.name, self.snapshot)
        lake = live_partitions_only(lake, list(routing.partition_key), self.partitions)
        return _sorted(apply_changes(lake, self.changes, list(self.primary_key)),
                       list(self.primary_key))


def union_plan(conn, name: str) -> UnionPlan:
    """The newest lake snapshot and the net changes since it, up to each bucket's end offset
    now. A snapshot whose changelog retention has meanwhile removed is planned again from a
    newer one; LakeError when the changelog does not reach back to the lake."""
    failure = None
    for _attempt in range(PLAN_ATTEMPTS):
        try:
            return _plan(conn, name, lake_snapshot(conn, name))
        except OffsetOutOfRangeError as e:
            failure = e
    raise LakeError(f"table {name}: the changelog no longer reaches back to the lake's "
                    f"offsets ({failure}): a union read cannot be made; read it live")


def _plan(conn, name: str, snapshot: LakeSnapshot) -> UnionPlan:
    table = conn.table(name)
    routing = table.routing
    columns = list(routing.arrow_schema.names)
    log_offsets = conn.admin.list_log_offsets(name, table.table_id)
    ends, records = {}, []
    for key, (start, end) in sorted(log_offsets.items(), key=lambda kv: (kv[0][0] or "",
                                                                       kv[0][1])):
        begin = snapshot.offsets.get(key, 0)  # a bucket the lake has not seen: all of it
        if end < begin:
            raise LakeError(f"table {name} {_where(key)}: its changelog ends at {end}, before "
                            f"the lake's offset {begin}: the lake holds changes the table "
                            "lost (the bucket was restored from an older copy)")
        if begin < start:
            raise OffsetOutOfRangeError(f"{_where(key)} starts at {start}, past the lake's "
                                        f"offset {begin}")
        ends[key] = end
        records.extend(_changelog(table, key, begin, end, routing.arrow_schema))
    if records:
        merged = pa.concat_tables(records, promote_options="default")
        changes = net_changes(merged, list(routing.primary_key), columns)
    else:
        changes = pa.schema([*routing.arrow_schema,
                             pa.field(DELETED, pa.bool_())]).empty_table()
    partitions = frozenset(p for p, _b in log_offsets) if routing.partitioned else None
    return UnionPlan(name, snapshot, ends, changes, tuple(routing.primary_key), partitions)


def _changelog(table, key, begin: int, end: int, schema: pa.Schema) -> list[pa.Table]:
    """The bucket's records in [begin, end): the offset, change type and row columns (a
    column added since a record was written is null in it)."""
    partition, bucket = key
    out = []
    for start in range(begin, end, CHUNK_RECORDS):
        records = table.changelog(bucket, start, min(end, start + CHUNK_RECORDS),
                                  partition=partition)
        got = records.column(OFFSET)
        if records.num_rows != min(end, start + CHUNK_RECORDS) - start:
            raise LakeError(f"table {table.name} {_where(key)}: asked for its changelog "
                            f"[{start}, {min(end, start + CHUNK_RECORDS)}), got "
                            f"{records.num_rows} records (up to offset "
                            f"{pc.max(got).as_py()})")
        columns = [records.column(c) if c in records.schema.names
                   else pa.nulls(records.num_rows, f.type) for c, f in
                   ((f.name, f) for f in schema)]
        out.append(pa.Table.from_arrays(
            [records.column(CHANGE_TYPE), got, *columns],
            names=[CHANGE_TYPE, OFFSET, *schema.names]))
    return out


def _where(key) -> str:
    partition, bucket = key
    return f"bucket {bucket}" if partition is None else f"partition '{partition}' bucket {bucket}"


def read_union(conn, name: str) -> pa.Table:
    """The table's rows as the lake copy plus every change since (see the module docstring),
    in its column types, ordered by primary key: equal to `Table.to_arrow()` read at the end
    offsets it read to (`union_plan(conn, name).offsets` tells them, with the rows from
    `.rows(conn)`)."""
    return union_plan(conn, name).rows(conn)

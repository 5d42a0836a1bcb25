"""Where a row goes: a table's routing facts, partition names and row grouping.

`TableRouting` is what a client needs to send a row to the right tablet: the table id, the key
columns, the bucket count and the Arrow schema. The coordinator derives it from the stored
descriptor and ships it as JSON, so clients never re-validate descriptors. Tablet servers use
the very same functions to check what they receive.

Partition names follow Fluss: the partition-key values as text, joined with '$' in partition-key
order ("2024-05-17$eu"). The bucket key is the primary key minus the partition key (all of the
primary key when that would leave nothing).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tally.errors import InvalidInputError
from tally.wire.bucket_hash import bucket_ids, bucket_of_key
from tally.wire.messages import schema_from_b64, schema_to_b64

PARTITION_SEPARATOR = "$"
DYNAMIC_PARTITIONS = "table.partition.dynamic-creation.enabled"


@dataclasses.dataclass(frozen=True)
class TableRouting:
    """The routing facts of one table (one table id: a re-created table gets new ones)."""

    name: str
    table_id: int
    primary_key: tuple[str, ...]
    partition_key: tuple[str, ...]
    bucket_key: tuple[str, ...]
    bucket_count: int
    arrow_schema: pa.Schema
    dynamic_partitions: bool = True

    @property
    def partitioned(self) -> bool:
        return bool(self.partition_key)

    @classmethod
    def from_descriptor(cls, name: str, table_id: int, descriptor) -> "TableRouting":
        schema = descriptor.schema
        pk = tuple(schema.primary_key)
        part = tuple(schema.partition_key)
        bucket_key = tuple(c for c in pk if c not in part) or pk
        dynamic = descriptor.bool_option(DYNAMIC_PARTITIONS, True)
        return cls(name, table_id, pk, part, bucket_key, descriptor.bucket_count,
                   schema.to_arrow(), dynamic)

    def to_json(self) -> dict:
        return {"name": self.name, "table_id": self.table_id,
                "primary_key": list(self.primary_key), "partition_key": list(self.partition_key),
                "bucket_key": list(self.bucket_key), "bucket_count": self.bucket_count,
                "arrow_schema": schema_to_b64(self.arrow_schema),
                "dynamic_partitions": self.dynamic_partitions}

    @classmethod
    def from_json(cls, d: dict) -> "TableRouting":
        return cls(d["name"], int(d["table_id"]), tuple(d["primary_key"]),
                   tuple(d["partition_key"]), tuple(d["bucket_key"]), int(d["bucket_count"]),
                   schema_from_b64(d["arrow_schema"]), bool(d["dynamic_partitions"]))

    # --- keys -------------------------------------------------------------------------------

    def key_schema(self, columns) -> pa.Schema:
        return pa.schema([self.arrow_schema.field(c) for c in columns])

    def bucket_of(self, key: dict) -> int:
        """The bucket of one key given as a dict of at least the bucket-key columns."""
        return bucket_of_key(key, self.key_schema(self.bucket_key), self.bucket_count)

    def partition_of(self, key: dict) -> str | None:
        """The partition name of one key given as a dict (None for unpartitioned tables)."""
        if not self.partitioned:
            return None
        missing = [c for c in self.partition_key if c not in key]
        if missing:
            raise InvalidInputError(f"key is missing partition-key column(s) {missing}")
        row = pa.table({c: pa.array([key[c]], self.arrow_schema.field(c).type)
                        for c in self.partition_key})
        return partition_names(row, self.partition_key)[0]

    def check_key(self, key: dict) -> None:
        missing = [c for c in self.primary_key if c not in key]
        if missing:
            raise InvalidInputError(
                f"lookup key of table {self.name} is missing primary-key column(s) {missing}")
        nulls = [c for c in self.primary_key if key[c] is None]
        if nulls:
            raise InvalidInputError(f"primary-key column(s) {nulls} of the key are null")

    def key_table(self, key: dict) -> pa.Table:
        """A one-row Arrow table of the primary-key values, typed like the table's columns."""
        self.check_key(key)
        try:
            return pa.table({c: pa.array([key[c]], self.arrow_schema.field(c).type)
                             for c in self.primary_key})
        except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, OverflowError) as e:
            raise InvalidInputError(f"key {key!r} does not fit table {self.name}: {e}") from e


def partition_names(rows: pa.Table | pa.RecordBatch, partition_key) -> list[str]:
    """The partition name of every row ('$'-joined text of the partition-key values)."""
    texts = []
    for c in partition_key:
        column = rows.column(c)
        if column.null_count:
            row = pc.index(pc.is_null(column), True).as_py()
            raise InvalidInputError(f"partition-key column '{c}' is null in row {row}")
        try:
            texts.append(pc.cast(column, pa.string()))
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as e:
            raise InvalidInputError(f"partition-key column '{c}' cannot be named: {e}") from e
    if len(texts) == 1:
        names = texts[0]
    else:
        names = pc.binary_join_element_wise(*texts, PARTITION_SEPARATOR)
    return names.to_pylist()


@dataclasses.dataclass
class Group:
    """The rows of one (partition, bucket), in their original order."""

    partition: str | None
    bucket: int
    rows: pa.Table


def group_rows(routing: TableRouting, rows: pa.Table) -> list[Group]:
    """Split rows by (partition, bucket), keeping each group's rows in input order.

    One stable sort and one `take`, then zero-copy slices: a key's rows stay in batch order, so
    the tablet folds them exactly as an in-process put of the whole batch would.
    """
    n = rows.num_rows
    if n == 0:
        return []
    buckets = bucket_ids(rows, list(routing.bucket_key), routing.bucket_count)
    if routing.partitioned:
        names = pa.array(partition_names(rows, routing.partition_key)).dictionary_encode()
        dictionary = names.dictionary.to_pylist()
        codes = names.indices.to_numpy(zero_copy_only=False).astype(np.int64)
    else:
        dictionary, codes = [None], np.zeros(n, dtype=np.int64)
    group_of = codes * routing.bucket_count + buckets
    order = np.argsort(group_of, kind="stable")
    ordered = rows.take(pa.array(order)) if not _is_sorted(group_of) else rows
    sorted_groups = group_of[order]
    bounds = np.flatnonzero(np.diff(sorted_groups)) + 1
    starts = np.concatenate([[0], bounds])
    ends = np.concatenate([bounds, [n]])
    out = []
    for s, e in zip(starts.tolist(), ends.tolist()):
        g = int(sorted_groups[s])
        out.append(Group(dictionary[g // routing.bucket_count], g % routing.bucket_count,
                         ordered.slice(s, e - s)))
    return out


def _is_sorted(values: np.ndarray) -> bool:
    return bool(np.all(values[1:] >= values[:-1])) if len(values) > 1 else True

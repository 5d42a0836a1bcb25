"""One Spark task per bucket: rows get their bucket from the client's own bucket function.

The first stage (`BucketAssigner`, in mapInArrow) computes each row's bucket with
`tally.wire.bucket_hash.bucket_ids` (the function tablet servers check writes against) and a
position column that makes folding deterministic; `repartitionById(bucket_count, bucket)` then sends
bucket i to partition i, so task i holds every row of every key of bucket i. Spark's
`repartition(n, col)` is never used: it hashes with Murmur3 and makes buckets collide.

A null primary key, or a key value that does not fit the key column's type, fails this first
stage, before any task of the write stage starts: nothing of the batch is applied.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from sink.plan import BUCKET_COLUMN, ORDER_COLUMN, WritePlan
from tally.errors import InvalidInputError

# Position = input partition << 36 | row number within that partition: the order Spark read
# the rows in, stable across a replay of the same input partitions.
ROW_BITS = 36


class BucketMismatchError(InvalidInputError):
    """A write task received rows of a bucket other than its own (a partitioning bug)."""


class BucketAssigner:
    """mapInArrow function adding the bucket and position columns (runs on executors)."""

    def __init__(self, plan: WritePlan, epoch_label: str):
        self.plan = plan
        self.epoch_label = epoch_label

    def __call__(self, batches):
        from pyspark import TaskContext

        from tally.wire.bucket_hash import bucket_ids

        context = TaskContext.get()
        partition = context.partitionId() if context is not None else 0
        base = np.int64(partition) << np.int64(ROW_BITS)
        seen = 0
        key_types = self.plan.key_types()
        for batch in batches:
            n = batch.num_rows
            keys = {}
            for name in self.plan.key_columns:
                keys[name] = self._key_column(batch.column(batch.schema.get_field_index(name)),
                                              name, key_types[name], seen)
            buckets = bucket_ids(pa.table(keys), list(self.plan.bucket_key),
                                 self.plan.bucket_count) if n else np.zeros(0, np.int64)
            if self.plan.partitioned:
                self._check_partition_values(keys, seen)
            order = base + np.arange(seen, seen + n, dtype=np.int64)
            seen += n
            yield batch.append_column(BUCKET_COLUMN, pa.array(buckets.astype(np.int32))) \
                .append_column(ORDER_COLUMN, pa.array(order, type=pa.int64()))

    def _key_column(self, values: pa.Array, name: str, key_type: pa.DataType,
                    seen: int) -> pa.Array:
        if values.null_count:
            row = int(pc.index(pc.is_null(values), True).as_py())
            raise InvalidInputError(
                f"{self.epoch_label}: primary-key column '{name}' is null in row {seen + row} "
                f"of an input partition; the whole batch was refused and nothing of it was "
                f"written to {self.plan.table}. Filter out or fill null keys before writing.")
        if values.type == key_type:
            return values
        try:
            return values.cast(key_type, safe=True)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as e:
            raise InvalidInputError(
                f"{self.epoch_label}: primary-key column '{name}' holds a value that does not "
                f"fit the key type {key_type}: {e}; nothing of the batch was written") from None

    def _check_partition_values(self, keys: dict, seen: int) -> None:
        from tally.wire.routing import partition_names

        schema = self.plan.descriptor.schema
        partition_names(pa.table({c: keys[c] for c in schema.partition_key}),
                        schema.partition_key)


def check_bucket(buckets: pa.ChunkedArray | pa.Array, expected: int, table: str) -> None:
    """Raise unless every row belongs to bucket `expected` (the task's partition id)."""
    values = buckets.to_numpy() if isinstance(buckets, pa.Array) else \
        np.concatenate([c.to_numpy(zero_copy_only=False) for c in buckets.chunks]) \
        if buckets.num_chunks else np.zeros(0, np.int32)
    wrong = np.flatnonzero(values != expected)
    if len(wrong):
        raise BucketMismatchError(
            f"Spark task {expected} of the write to {table} received {len(wrong)} row(s) of "
            f"bucket {int(values[wrong[0]])}: one task must write exactly one bucket. Is "
            "adaptive query execution coalescing the repartitionById shuffle?")


def check_task_coverage(task_buckets: list[int], bucket_count: int, table: str) -> None:
    """Every bucket must have been visited by exactly one successful task (driver side), so a
    bucket written before a crash is undone even when the replay has no rows for it."""
    if sorted(task_buckets) != list(range(bucket_count)):
        raise BucketMismatchError(
            f"The write to {table} ran tasks for buckets {sorted(task_buckets)}, expected one "
            f"task for each of the {bucket_count} buckets; the epoch was not committed")

"""How TallySink delivers an epoch's rows: one Spark job, one task per bucket.

The first stage (`BucketAssigner`, in mapInArrow) computes each row's bucket with
`tally.wire.bucket_hash.bucket_ids` (the function tablet servers check writes against) and a
position column that makes folding deterministic; `repartitionById(bucket_count, bucket)` then
sends bucket i to partition i, so task i holds every row of every key of bucket i. Spark's
`repartition(n, col)` is never used: it hashes with Murmur3 and makes buckets collide. A null
primary key, or a key value that does not fit the key column's type, fails this first stage,
before any task of the write stage starts: nothing of the batch is applied. The data source
uses the same first stage.

    df ─select─▶ table-named columns ─mapInArrow(BucketAssigner)─▶ + bucket, position
       ─repartitionById(bucket_count, bucket)─▶ partition i = bucket i
       ─mapInArrow(BucketTask)─▶ one report row per task (the per-bucket step, sink.task)
       ─collect─▶ driver

One action per epoch, so the micro-batch is evaluated once.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import functions as F
from pyspark.sql.types import IntegerType, LongType, StructField, StructType

from sink.plan import BUCKET_COLUMN, HIDDEN_SEQUENCE_COLUMN, ORDER_COLUMN, WritePlan
from sink.task import (
    RESULT_DDL,
    BucketReport,
    BucketTask,
    EpochContext,
    report_from_row,
)
from tally.errors import InvalidInputError


# Position = input partition << 36 | row number within that partition: the order Spark read
# the rows in, stable across a replay of the same input partitions.
ROW_BITS = 36


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


def _column(name: str):
    return F.col("`" + name.replace("`", "``") + "`")


def table_named(df, plan: WritePlan):
    """The columns the write reads, under their table names (and the hidden sequence)."""
    columns = [_column(src).alias(dst) for src, dst in zip(plan.input_columns, plan.table_columns)]
    if plan.sequence_column is not None and plan.sequence_column not in plan.input_columns:
        columns.append(_column(plan.sequence_column).alias(HIDDEN_SEQUENCE_COLUMN))
    return df.select(*columns)


def bucketed(df, plan: WritePlan, label: str):
    """The DataFrame the write stage reads: partition i holds exactly bucket i's rows."""
    selected = table_named(df, plan)
    schema = StructType(selected.schema.fields + [
        StructField(BUCKET_COLUMN, IntegerType(), False),
        StructField(ORDER_COLUMN, LongType(), False)])
    assigned = selected.mapInArrow(BucketAssigner(plan, label), schema)
    return assigned.repartitionById(plan.bucket_count, BUCKET_COLUMN)


def run_write_job(df, plan: WritePlan, epoch: EpochContext, label: str) -> list[BucketReport]:
    """Run the epoch's write stage; one report per successful task."""
    spark = df.sparkSession
    spark.sparkContext.setJobDescription(f"tally sink: {label} into {plan.table}")
    try:
        rows = bucketed(df, plan, label).mapInArrow(BucketTask(plan, epoch), RESULT_DDL) \
            .collect()
    finally:
        spark.sparkContext.setJobDescription(None)
    return [report_from_row(row) for row in rows]


class SparkJob:
    """TallySink's delivery of an epoch (see sink.protocol): the write job over `df`."""

    def __init__(self, df):
        self.df = df

    def __call__(self, conn, plan: WritePlan, epoch: EpochContext,
                 label: str) -> list[BucketReport]:
        return run_write_job(self.df, plan, epoch, label)

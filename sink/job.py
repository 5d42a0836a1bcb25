"""How TallySink delivers a large epoch's rows: one Spark job, one task per bucket.

The first stage (`PartitionFolder`, in mapInArrow) computes each row's bucket with
`tally.wire.bucket_hash.bucket_ids` (the function tablet servers check writes against), its
partition name and a position (`BucketAssigner`), then folds its input partition's rows of each
(bucket, partition) per key (sink.fold: one row per key and run instead of every row, validated
here) and sends each bucket its folded parts as Arrow IPC values, each with its partition name:
the bucket and the name are computed here once and travel with the rows to the bucket writer.
`repartitionById(bucket_count, bucket)` then sends bucket i's parts to partition i, so task i
holds every folded row of every key of bucket i; it folds each partition's parts again, in
input-partition order, into what one fold of all the bucket's rows gives. Spark's
`repartition(n, col)` is never used: it hashes with Murmur3 and makes buckets collide. A null
primary key, a key value that does not fit the key column's type, or a value that does not fit
its column fails the first stage, before any task of the write stage starts: nothing of the
batch is applied. The data source and the driver delivery use the same bucket assignment.

    df ─select─▶ table-named columns ─mapInArrow(PartitionFolder)─▶ (bucket, position, rows,
       folded part, partition name) per input partition, bucket and table partition
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

from sink.dictionary_ids import map_ids
from sink.fold import fold_part
from sink.plan import (BUCKET_COLUMN, HIDDEN_SEQUENCE_COLUMN, ORDER_COLUMN, PARTITION_COLUMN,
                       WritePlan)
from sink.task import RESULT_DDL, BucketReport, BucketTask, EpochContext, report_from_row
from tally.errors import InvalidInputError

# Position = input partition << 36 | row number within that partition: the order Spark read
# the rows in, stable across a replay of the same input partitions.
ROW_BITS = 36
# An input partition is folded in chunks of at most this many rows, so that one folded part
# (one binary value crossing the shuffle) stays far below Arrow's 2 GiB per binary array.
CHUNK_ROWS = 1 << 20

# What crosses the shuffle: one row per (chunk of an input partition, bucket, table partition).
PART_DDL = (f"{BUCKET_COLUMN} int, {ORDER_COLUMN} long, rows long, folded boolean, "
            f"payload binary, {PARTITION_COLUMN} string")
PART_SCHEMA = pa.schema([(BUCKET_COLUMN, pa.int32()), (ORDER_COLUMN, pa.int64()),
                         ("rows", pa.int64()), ("folded", pa.bool_()), ("payload", pa.binary()),
                         (PARTITION_COLUMN, pa.string())])


class BucketAssigner:
    """mapInArrow function adding the bucket and position columns (runs on executors), and
    with `names` the partition name column of a partitioned table's rows: whoever writes
    them then splits by it instead of naming every row again."""

    def __init__(self, plan: WritePlan, epoch_label: str, names: bool = False):
        self.plan = plan
        self.epoch_label = epoch_label
        self.names = names

    def __call__(self, batches):
        from pyspark import TaskContext

        from tally.wire.bucket_hash import bucket_ids

        context = TaskContext.get()
        partition = context.partitionId() if context is not None else 0
        base = np.int64(partition) << np.int64(ROW_BITS)
        seen = 0
        key_types = self.plan.key_types()
        for batch in batches:
            if self.plan.dictionaries:  # string ids become their dictionary's ints first
                batch = map_ids(self.plan.dictionaries, batch, self.epoch_label)
            n = batch.num_rows
            keys = {}
            for name in self.plan.key_columns:
                keys[name] = self._key_column(batch.column(batch.schema.get_field_index(name)),
                                              name, key_types[name], seen)
            buckets = bucket_ids(pa.table(keys), list(self.plan.bucket_key),
                                 self.plan.bucket_count) if n else np.zeros(0, np.int64)
            names = self._partition_names(keys) if self.plan.partitioned else None
            if self.names and names is not None:
                names = pa.array(names, pa.string()).dictionary_encode()
            order = base + np.arange(seen, seen + n, dtype=np.int64)
            seen += n
            batch = batch.append_column(BUCKET_COLUMN, pa.array(buckets.astype(np.int32))) \
                .append_column(ORDER_COLUMN, pa.array(order, type=pa.int64()))
            if self.names and names is not None:
                batch = batch.append_column(PARTITION_COLUMN, names)
            yield batch

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

    def _partition_names(self, keys: dict) -> list[str]:
        """Every row's partition name; InvalidInputError for a partition value that cannot
        be named."""
        from tally.wire.routing import partition_names

        schema = self.plan.descriptor.schema
        names = partition_names(pa.table({c: keys[c] for c in schema.partition_key}),
                                schema.partition_key)
        return names


def _column(name: str):
    return F.col("`" + name.replace("`", "``") + "`")


def table_named(df, plan: WritePlan):
    """The columns the write reads, under their table names (and the hidden sequence): the
    DataFrame itself when it has those already (a select costs a py4j call per column and
    plans the batch again)."""
    if not plan.renames:
        return df
    columns = [_column(src).alias(dst) for src, dst in zip(plan.input_columns, plan.table_columns)]
    if plan.sequence_column is not None and plan.sequence_column not in plan.input_columns:
        columns.append(_column(plan.sequence_column).alias(HIDDEN_SEQUENCE_COLUMN))
    return df.select(*columns)


def rows_by_part(rows: pa.Table) -> dict[tuple[int, str | None], pa.Table]:
    """{(bucket, partition name): its rows, in their order} of rows with a bucket column and,
    for a partitioned table, the partition names BucketAssigner gave them."""
    if PARTITION_COLUMN not in rows.column_names:
        return {(bucket, None): part for bucket, part in rows_by_bucket(rows).items()}
    names = rows.column(PARTITION_COLUMN).combine_chunks()
    dictionary = names.dictionary.to_pylist()
    codes = rows.column(BUCKET_COLUMN).to_numpy().astype(np.int64) * len(dictionary) + \
        names.indices.to_numpy(zero_copy_only=False)
    order = np.argsort(codes, kind="stable")
    ordered = rows.drop_columns([PARTITION_COLUMN]).take(pa.array(order, type=pa.int64()))
    parts, start = {}, 0
    for code, count in enumerate(np.bincount(codes)):
        if count:
            bucket, name = divmod(code, len(dictionary))
            parts[(bucket, dictionary[name])] = ordered.slice(start, int(count))
        start += int(count)
    return parts


def rows_by_bucket(rows: pa.Table) -> dict[int, pa.Table]:
    """{bucket: its rows, in their order} of rows with a bucket column."""
    buckets = rows.column(BUCKET_COLUMN).to_numpy()
    order = np.argsort(buckets, kind="stable")
    ordered = rows.take(pa.array(order, type=pa.int64()))
    parts, start = {}, 0
    for bucket, count in enumerate(np.bincount(buckets)):
        if count:
            parts[bucket] = ordered.slice(start, int(count))
        start += int(count)
    return parts


class PartitionFolder:
    """mapInArrow function of the first stage (runs on executors): bucket and name the input
    partition's rows, fold each (bucket, partition)'s rows per key, one row per folded part."""

    def __init__(self, plan: WritePlan, epoch_label: str, project=None):
        self.plan = plan
        self.epoch_label = epoch_label
        # A rollup's write: its rows are the input's projected (sink.rollup_feeds.RollupFeed).
        self.project = project

    def __call__(self, batches):
        pending, count = [], 0
        if self.project is not None:
            batches = (b for batch in batches for b in self.project(batch).to_batches())
        for batch in BucketAssigner(self.plan, self.epoch_label, names=True)(batches):
            if batch.num_rows:
                pending.append(batch)
                count += batch.num_rows
            if count >= CHUNK_ROWS:
                yield from self._parts(pending)
                pending, count = [], 0
        if pending:
            yield from self._parts(pending)

    def _parts(self, batches):
        rows = pa.Table.from_batches(batches)
        position = int(rows.column(ORDER_COLUMN)[0].as_py())  # orders the chunks of the input
        for (bucket, name), part in rows_by_part(rows).items():
            folded = fold_part(part, self.plan, position, None)
            yield pa.RecordBatch.from_arrays([
                pa.array([bucket], pa.int32()), pa.array([position], pa.int64()),
                pa.array([folded.rows], pa.int64()), pa.array([folded.folded]),
                pa.array([folded.payload], pa.binary()), pa.array([name], pa.string())],
                schema=PART_SCHEMA)


def bucketed(df, plan: WritePlan, label: str, project=None):
    """The DataFrame the write stage reads: partition i holds exactly bucket i's folded parts
    (PART_SCHEMA rows). `project`: a rollup's, of `df`'s table-named source rows."""
    named = df if project is not None else table_named(df, plan)
    folded = named.mapInArrow(PartitionFolder(plan, label, project), PART_DDL)
    return folded.repartitionById(plan.bucket_count, BUCKET_COLUMN)


def run_write_job(df, plan: WritePlan, epoch: EpochContext, label: str,
                  project=None) -> list[BucketReport]:
    """Run the epoch's write stage; one report per successful task."""
    spark = df.sparkSession
    spark.sparkContext.setJobDescription(f"tally sink: {label} into {plan.table}")
    try:
        rows = bucketed(df, plan, label, project) \
            .mapInArrow(BucketTask(plan, epoch), RESULT_DDL).collect()
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

    def rollup(self, feed, source: WritePlan) -> "RollupJob":
        """The delivery of a rollup's rows: a write job of its own over the same batch."""
        return RollupJob(table_named(self.df, source), feed)


class RollupJob:
    """A rollup's delivery in TallySink's task delivery: the write job over the source's
    table-named rows, each input partition's projected into the rollup's before bucketing."""

    def __init__(self, named, feed):
        self.named = named
        self.feed = feed

    def __call__(self, conn, plan: WritePlan, epoch: EpochContext,
                 label: str) -> list[BucketReport]:
        return run_write_job(self.named, plan, epoch, label, project=self.feed.project)

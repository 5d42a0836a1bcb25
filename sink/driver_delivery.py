"""TallySink's delivery of a small epoch: the rows collected to the driver, which writes the buckets.

The task delivery (sink.job) costs two stages of Python tasks and a shuffle per epoch whatever
the batch's size: for a micro-batch of a thousand rows, most of its time. The driver delivery
runs one Spark job with no Python worker and no shuffle, `toArrow()` of the batch's columns
under their table names (the batch is evaluated once), and does the rest on the driver. Steps
1 and 2 are its `prepare`, which the epoch protocol runs while the coordinator begins the epoch:

1. the tasks' first stage over the collected rows (sink.job.BucketAssigner: the client's bucket
   function, the null-key and key-type checks, and the position column; the rows arrive in
   input-partition order, so positions order them as the tasks' positions do);
2. every bucket's rows folded as its task would fold them (sink.fold.fold_rows; a small batch
   in one call, split by bucket after), all buckets before any write: a value that does not fit
   its column refuses the batch, nothing written;
3. every bucket, rows or not, through the per-bucket step under the attempts the epoch's start
   registered (sink.task.write_every_bucket, as the data source's commit process does),
   several buckets at once.

The whole batch passes through the driver's memory: TallySink takes this delivery for batches
Spark estimates small (the `delivery` option, sink.options), never for a batch of unknown size.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from merge_engine import MergeMode
from sink.file_batch import read_file_batch
from sink.job import BucketAssigner, rows_by_bucket, table_named
from sink.plan import BUCKET_COLUMN, WritePlan
from sink.fold import fold_rows
from sink.task import BucketReport, EpochContext, write_every_bucket
from tally.wire.bucket_hash import bucket_ids


# Batches up to this many rows are folded in one call (the per-call cost dominates), larger
# ones bucket by bucket (the sort dominates): the two cross near 20,000 rows here.
ONE_FOLD_ROWS = 16_384
# Buckets written at once: the tablet servers apply them in parallel, the driver waits once.
WRITE_THREADS = 8


def size_estimate(df) -> int | None:
    """Spark's estimate of the DataFrame's size in bytes (the optimized plan's statistics: a
    file source's file sizes, a range's rows; a source without statistics, such as an RDD
    or Kafka, says 8 EiB), or None when the plan cannot be asked."""
    try:
        size = df._jdf.queryExecution().optimizedPlan().stats().sizeInBytes()
        size = int(size if isinstance(size, int) else size.toString())  # py4j: int or BigInt
    except Exception:  # noqa: BLE001 - py4j raises its own error types; unknown means no estimate
        return None
    return size if size >= 0 else None


def fold_by_bucket(data: pa.Table, plan: WritePlan, label: str):
    """({bucket: its folded rows}, the mode to send them in, {bucket: its input rows}).

    A small batch is folded in one call and split by bucket after: a key lives in one bucket
    and the fold groups by key, in input order, so each bucket gets what folding its rows
    alone gives (the folded rows' buckets come from their keys, by the function that placed
    the input rows). A large one is split first and each bucket folded alone: the fold sorts,
    so several smaller sorts beat one past ONE_FOLD_ROWS."""
    assigned = [b for b in BucketAssigner(plan, label)(data.to_batches()) if b.num_rows]
    if not assigned:
        return {}, None, {}
    rows = pa.Table.from_batches(assigned)
    counts = np.bincount(rows.column(BUCKET_COLUMN).to_numpy(), minlength=plan.bucket_count)
    counts = {bucket: int(n) for bucket, n in enumerate(counts) if n}
    if rows.num_rows > ONE_FOLD_ROWS:
        folded, mode = {}, None
        for bucket, part in rows_by_bucket(rows).items():
            folded[bucket], mode = fold_rows(part, plan)
        return folded, mode, counts
    folded, mode = fold_rows(rows, plan)
    buckets = bucket_ids(folded.select(list(plan.key_columns)), list(plan.bucket_key),
                         plan.bucket_count)
    parts = rows_by_bucket(folded.append_column(BUCKET_COLUMN,
                                                pa.array(buckets.astype(np.int32))))
    return ({bucket: part.drop_columns([BUCKET_COLUMN]) for bucket, part in parts.items()},
            mode, counts)


class DriverDelivery:
    """The driver delivery of an epoch over `df` (see the module docstring). `prepare` reads
    and folds the batch (the epoch's start runs meanwhile); the call writes it."""

    def __init__(self, df, selected=None, query=None):
        self.df = df
        self.selected = selected  # table_named(df, plan), when the choice built it already
        self.query = query        # the JVM streaming query whose micro-batch `df` is, if any
        self.prepared = None      # (folded per bucket, mode, input rows per bucket)
        self.read_by = None       # "file" (read on the driver) or "job" (Spark's toArrow)
        self.data = None          # the batch's table-named rows, kept for the rollups

    def prepare(self, plan: WritePlan, label: str) -> None:
        selected = self.selected if self.selected is not None else table_named(self.df, plan)
        data = None
        if self.query is not None and selected is self.df:
            data = read_file_batch(self.query, self.df)
        self.read_by = "job" if data is None else "file"
        if data is None:
            data = self._collect(selected, plan, label)
        folded, mode, counts = fold_by_bucket(data, plan, label)
        self.prepared = (folded, mode or MergeMode.MERGE_STATE, counts)
        self.data = data

    def _collect(self, selected, plan: WritePlan, label: str) -> pa.Table:
        """The batch's rows through Spark's one job."""
        context = self.df.sparkSession.sparkContext
        context.setJobDescription(f"tally sink: {label} into {plan.table} (driver)")
        try:
            return selected.toArrow()
        finally:
            context.setJobDescription(None)

    def __call__(self, conn, plan: WritePlan, epoch: EpochContext,
                 label: str) -> list[BucketReport]:
        if self.prepared is None:
            self.prepare(plan, label)
        folded, mode, counts = self.prepared
        return write_every_bucket(conn, plan, epoch, folded, mode, counts,
                                  threads=WRITE_THREADS)

    def rollup(self, feed, source: WritePlan) -> "DriverRollup":
        """The delivery of a rollup's rows: the batch read once, projected here."""
        return DriverRollup(self, feed)


class DriverRollup:
    """A rollup's delivery in the driver delivery: the rows the source's delivery read,
    projected into the rollup's, folded by bucket and written from the driver."""

    def __init__(self, source: DriverDelivery, feed):
        self.source = source
        self.feed = feed

    def __call__(self, conn, plan: WritePlan, epoch: EpochContext,
                 label: str) -> list[BucketReport]:
        folded, mode, counts = fold_by_bucket(self.feed.project(self.source.data), plan, label)
        return write_every_bucket(conn, plan, epoch, folded, mode or MergeMode.MERGE_STATE,
                                  counts, threads=WRITE_THREADS)

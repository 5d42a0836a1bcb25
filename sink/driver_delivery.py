"""TallySink's delivery of a small epoch: the rows collected to the driver, which writes the buckets.

The task delivery (sink.job) costs two stages of Python tasks and a shuffle per epoch whatever
the batch's size: for a micro-batch of a thousand rows, most of its time. The driver delivery
runs one Spark job with no Python worker and no shuffle, `toArrow()` of the batch's columns
under their table names (the batch is evaluated once), and does the rest on the driver:

1. the tasks' first stage over the collected rows (sink.job.BucketAssigner: the client's bucket
   function, the null-key and key-type checks, and the position column; the rows arrive in
   input-partition order, so positions order them as the tasks' positions do);
2. every bucket's rows folded as its task would fold them (sink.fold.fold_rows), all buckets
   before any write: a value that does not fit its column refuses the batch, nothing written;
3. every bucket, rows or not, through the per-bucket step under the attempts the epoch's start
   registered (sink.task.write_every_bucket, as the data source's commit process does),
   several buckets at once.

The whole batch passes through the driver's memory: TallySink takes this delivery for batches
Spark estimates small (the `delivery` option, sink.options), never for a batch of unknown size.
"""

from __future__ import annotations

import pyarrow as pa

from merge_engine import MergeMode
from sink.job import BucketAssigner, rows_by_bucket, table_named
from sink.plan import WritePlan
from sink.fold import fold_rows
from sink.task import BucketReport, EpochContext, write_every_bucket


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


def bucket_parts(data: pa.Table, plan: WritePlan, label: str) -> dict[int, pa.Table]:
    """{bucket: its collected rows, with their bucket and position columns, in input order}."""
    assigned = list(BucketAssigner(plan, label)(data.to_batches()))
    return rows_by_bucket(pa.Table.from_batches(assigned)) if assigned else {}


def fold_by_bucket(parts: dict[int, pa.Table], plan: WritePlan):
    """({bucket: its folded rows}, the mode to send them in)."""
    folded, mode = {}, None
    for bucket, part in parts.items():
        folded[bucket], mode = fold_rows(part, plan)
    return folded, mode


class DriverDelivery:
    """The driver delivery of an epoch over `df` (see the module docstring)."""

    def __init__(self, df, selected=None):
        self.df = df
        self.selected = selected  # table_named(df, plan), when the choice built it already

    def __call__(self, conn, plan: WritePlan, epoch: EpochContext,
                 label: str) -> list[BucketReport]:
        spark = self.df.sparkSession
        spark.sparkContext.setJobDescription(f"tally sink: {label} into {plan.table} (driver)")
        try:
            selected = self.selected if self.selected is not None else \
                table_named(self.df, plan)
            data = selected.toArrow()
        finally:
            spark.sparkContext.setJobDescription(None)
        parts = bucket_parts(data, plan, label)
        folded, mode = fold_by_bucket(parts, plan)
        counts = {bucket: part.num_rows for bucket, part in parts.items()}
        return write_every_bucket(conn, plan, epoch, folded, mode or MergeMode.MERGE_STATE,
                                  counts, threads=WRITE_THREADS)

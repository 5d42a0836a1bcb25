"""The per-bucket step of every epoch, and the Spark task that runs it for TallySink.

`write_bucket` is the one way an epoch's rows reach a bucket, whoever runs it: the Spark task
of a bucket (TallySink: `BucketTask`, task i owns bucket i in every partition of the table)
or the data source's commit process (sink.funnel, one bucket after another). For bucket b:

1. take a new task attempt for b, so tablet servers reject, from now on, the owner's writes
   to b from any earlier attempt still running (an executor that lost contact, a task of a run
   that failed), together with the end offsets read once that fencing holds: one coordinator
   call (`begin_epoch` for b). A delivery that runs in one process and visits each bucket once
   uses the attempts its driver registered for every bucket when the epoch began instead;
2. undo every (partition, b) whose end offset is past the epoch baseline: writes of an earlier
   attempt, or of an earlier run of this epoch before a crash. This runs whether or not there
   are rows to write, so a replay with other data still cleans up;
3. write the epoch's folded rows of b (one row per key, MERGE_STATE, or OVERWRITE's last row)
   under the lease and that attempt;
4. report b's end offsets, which the driver commits once every bucket is done.

`BucketTask` checks that every folded part it received (one per chunk of an input partition
and table partition, folded per key where it was read, sink.fold) belongs to its bucket and
combines each partition's parts into one row per key with the table's own aggregators (less to
send, fewer RocksDB writes), in input order, before the step (the engine's fold checks the
parts' states again as its input: it has no entry for states it made itself). The first stage
validated the values and named each row's partition; the folded rows then go to the bucket as
they are, under the partition names they came with, through the client's bucket-addressed
writer, and the tablet server checks them at its trust boundary.
"""

from __future__ import annotations

import dataclasses
import time
from concurrent.futures import ThreadPoolExecutor, wait

import numpy as np
import pyarrow as pa

from merge_engine import MergeMode
from sink import remote
from sink.fold import FoldedPart, combine_by_partition
from sink.plan import BUCKET_COLUMN, ORDER_COLUMN, PARTITION_COLUMN, WritePlan
from tally.errors import InvalidInputError, RecoveryError

RESULT_DDL = ("bucket int, rows long, keys long, undone long, attempt int, seconds double, "
              "ends array<struct<partition: string, end_offset: long>>")
RESULT_SCHEMA = pa.schema([
    ("bucket", pa.int32()),
    ("rows", pa.int64()),           # input rows that reached the bucket
    ("keys", pa.int64()),           # rows written (one per key)
    ("undone", pa.int64()),         # (partition, bucket) pairs undone by this attempt
    ("attempt", pa.int32()),        # Spark's attempt number (0 in the commit process)
    ("seconds", pa.float64()),
    ("ends", pa.list_(pa.struct([("partition", pa.string()), ("end_offset", pa.int64())]))),
])


@dataclasses.dataclass(frozen=True)
class EpochContext:
    """What the driver decided for this epoch (picklable, shipped to every task)."""

    url: str
    token: str | None
    lease: object                  # locks.Lease
    epoch: int
    baseline: dict                 # {(partition, bucket): end offset before the epoch}
    fail_hook: str | None = None   # tests only: "module:function" called after half the rows
    tls: object = None             # tally.wire.tls.TlsFiles of a grpc+tls:// cluster
    # The attempts the driver registered when the epoch began ({bucket: number}), and every
    # bucket's end offsets read after that registration fenced all earlier attempts: for a
    # delivery that visits each bucket once in the driver's process (see `write_bucket`).
    attempts: dict = dataclasses.field(default_factory=dict)
    offsets: dict = dataclasses.field(default_factory=dict)
    # The epoch's run the driver began: a task's own registration is refused once the
    # driver's rollback aborted it, so a straggler of a failed job cannot write after it.
    run: int = 0


@dataclasses.dataclass
class BucketReport:
    """What the step did to one bucket: its end offsets (for the commit) and counts."""

    bucket: int
    ends: dict                     # {(partition, bucket): end offset after the step}
    rows: int = 0
    keys: int = 0
    undone: int = 0
    attempt: int = 0
    seconds: float = 0.0


def write_bucket(conn, plan: WritePlan, epoch: EpochContext, bucket: int,
                 folded: pa.Table | dict | None, mode: MergeMode, *, rows: int = 0,
                 attempt_number: int = 0, registered: bool = False) -> BucketReport:
    """The per-bucket step (see the module docstring): take an attempt, undo the bucket to
    the epoch baseline, write `folded` under that attempt, report the end offsets. `folded`:
    the bucket's folded rows, or {partition name: its folded rows} when the caller named them.

    `registered`: use the attempt the epoch's start registered for the bucket. Only for the
    driver's own delivery, where this call is the bucket's only step in this run of the
    epoch: a Spark task never knows that (a resubmitted stage runs attempt 0 again while the
    first may still run), so it registers its own."""
    started = time.monotonic()
    table = table_handle(conn, plan)
    lease = epoch.lease
    if registered and bucket in epoch.attempts:
        attempt, offsets = epoch.attempts[bucket], epoch.offsets
    else:
        start = remote.begin_epoch(conn, lease, epoch.epoch, [bucket], run=epoch.run)
        attempt, offsets = start.attempts[bucket], start.offsets
    ends: dict = {}
    undone = 0
    for (partition, b), end in offsets.items():
        baseline = epoch.baseline.get((partition, b), 0)
        if b == bucket and end > baseline:
            result = remote.undo_bucket(table, b, baseline, partition, plan.writer_target,
                                        lease, attempt)
            ends[(partition, b)] = int(result.end_after if result.end_after is not None
                                       else result.end)
            undone += 1
    keys = folded_rows(folded)
    if keys:
        writer = remote.bucket_writer(table, bucket, plan.writer_target, mode, lease, attempt)
        ends.update(_write(writer, folded, plan, epoch, attempt_number, bucket))
    return BucketReport(bucket, ends, rows, keys, undone, attempt_number,
                        time.monotonic() - started)


def write_every_bucket(conn, plan: WritePlan, epoch: EpochContext,
                       folded: dict[int, pa.Table], mode: MergeMode,
                       rows: dict[int, int] | None = None, *,
                       threads: int = 1) -> list[BucketReport]:
    """Every bucket, rows or not, through the per-bucket step, in this process, under the
    attempts the epoch's start registered (a delivery that runs in the driver's or the commit
    process: each bucket is visited once). `folded`: {bucket: its folded rows}; `rows`:
    {bucket: the input rows that reached it} (default: folded rows). With `threads` > 1 that
    many buckets are written at once (the connection is shared safely between threads, each
    bucket has its own writer); a failure is raised once every started bucket has ended, so
    a rollback never runs beside a write of this epoch."""
    def step(bucket: int) -> BucketReport:
        part = folded.get(bucket)
        count = (0 if part is None else part.num_rows) if rows is None else rows.get(bucket, 0)
        return write_bucket(conn, plan, epoch, bucket, part, mode, rows=count, registered=True)

    buckets = range(plan.bucket_count)
    if threads <= 1 or plan.bucket_count == 1:
        return [step(bucket) for bucket in buckets]
    with ThreadPoolExecutor(max_workers=min(threads, plan.bucket_count),
                            thread_name_prefix="tally-bucket") as pool:
        futures = [pool.submit(step, bucket) for bucket in buckets]
        wait(futures)
    return [future.result() for future in futures]


def table_handle(conn, plan: WritePlan):
    """A handle on the plan's table, from the connection's cached metadata (no round trip for
    a connection a worker reuses); RecoveryError when the name now belongs to another table.
    Its writes carry the table id, so one dropped later is refused by the tablet servers."""
    from tally.client.table import Table

    if conn.table_meta(plan.table).table_id != plan.table_id and \
            conn.table_meta(plan.table, refresh=True).table_id != plan.table_id:
        raise RecoveryError(
            f"Table {plan.table} was dropped and re-created while the job ran "
            f"(table id {plan.table_id}, now {conn.table_meta(plan.table).table_id}); "
            "nothing written")
    return Table(conn, plan.table, plan.table_id)


def folded_rows(folded: pa.Table | dict | None) -> int:
    """How many folded rows `folded` (write_bucket's) holds."""
    if folded is None:
        return 0
    if isinstance(folded, dict):
        return sum(part.num_rows for part in folded.values())
    return folded.num_rows


def _write(writer, folded: pa.Table | dict, plan: WritePlan, epoch: EpochContext,
           attempt_number: int, bucket: int) -> dict:
    """Write the rows, returning the end offsets; with a test hook, write half, call the
    hook, write the rest."""
    put = writer.put if isinstance(folded, pa.Table) else writer.put_partitions
    hook = epoch.fail_hook
    total = folded_rows(folded)
    if hook is None or total < 2:
        return put(folded if isinstance(folded, pa.Table) else list(folded.items()))
    halves = _halves(folded, total // 2)
    ends = put(halves[0])
    module, _, name = hook.partition(":")
    import importlib

    getattr(importlib.import_module(module), name)(plan, epoch, attempt_number, bucket)
    ends.update(put(halves[1]))
    return ends


def _halves(folded: pa.Table | dict, half: int) -> tuple:
    """The first `half` folded rows and the rest, in the form `folded` has (a table, or
    (partition name, rows) pairs in order)."""
    if isinstance(folded, pa.Table):
        return folded.slice(0, half), folded.slice(half)
    first, rest, left = [], [], half
    for name, part in folded.items():
        taken = min(left, part.num_rows)
        if taken:
            first.append((name, part.slice(0, taken)))
        if taken < part.num_rows:
            rest.append((name, part.slice(taken)))
        left -= taken
    return first, rest


class BucketTask:
    """mapInArrow function of TallySink's write stage (runs on executors, one call per
    bucket): check the parts' bucket, combine them, run the per-bucket step."""

    def __init__(self, plan: WritePlan, epoch: EpochContext):
        self.plan = plan
        self.epoch = epoch

    def __call__(self, batches):
        from pyspark import TaskContext

        context = TaskContext.get()
        yield report_batch(self.write(batches, context.partitionId(), context.attemptNumber()))

    def write(self, batches, bucket: int, attempt_number: int) -> BucketReport:
        """The task's work on the batches of its bucket's folded parts."""
        parts = received_parts(batches, bucket, self.plan.table)
        folded, mode = combine_by_partition(parts, self.plan)
        conn = remote.shared_connection(self.epoch.url, self.epoch.token, self.epoch.tls)
        return write_bucket(conn, self.plan, self.epoch, bucket, folded, mode,
                            rows=sum(p.rows for p in parts), attempt_number=attempt_number)


def received_parts(batches, bucket: int, table: str) -> list[FoldedPart]:
    """The folded parts a write task received (rows of the first stage's part schema), each
    checked to belong to the task's bucket, with the partition name its rows came with."""
    parts = []
    for batch in batches:
        check_bucket(batch.column(BUCKET_COLUMN), bucket, table)
        columns = [batch.column(name)
                   for name in (ORDER_COLUMN, "rows", "folded", "payload", PARTITION_COLUMN)]
        for position, rows, folded, payload, partition in zip(*columns):
            parts.append(FoldedPart(position.as_py(), rows.as_py(), payload.as_buffer(),
                                    folded.as_py(), table_partition=partition.as_py()))
    return parts


class BucketMismatchError(InvalidInputError):
    """A write task received rows of a bucket other than its own (a partitioning bug)."""


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


def report_batch(report: BucketReport) -> pa.RecordBatch:
    """A task's report as its one result row (RESULT_SCHEMA)."""
    ends = [{"partition": p, "end_offset": int(end)}
            for (p, _), end in sorted(report.ends.items(), key=lambda kv: kv[0][0] or "")]
    return pa.RecordBatch.from_pylist([{
        "bucket": report.bucket, "rows": report.rows, "keys": report.keys,
        "undone": report.undone, "attempt": report.attempt, "seconds": report.seconds,
        "ends": ends}], schema=RESULT_SCHEMA)


def report_from_row(row) -> BucketReport:
    """A collected result row (a pyspark Row of RESULT_SCHEMA) as a BucketReport."""
    bucket = int(row["bucket"])
    return BucketReport(bucket, {(e["partition"], bucket): int(e["end_offset"])
                                 for e in row["ends"] or []},
                        int(row["rows"]), int(row["keys"]), int(row["undone"]),
                        int(row["attempt"]), float(row["seconds"]))

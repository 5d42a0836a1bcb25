"""The write task of one bucket: fence earlier attempts, undo to the epoch baseline, fold, write.

Task i of the write stage owns bucket i (in every partition of the table). Each attempt:

1. checks that every row it received belongs to bucket i;
2. registers itself as the bucket's writer, so tablet servers reject any earlier attempt of the
   same owner and bucket that is still running (an executor that lost contact) from now on;
3. undoes every (partition, bucket i) whose end offset is past the epoch baseline: writes of an
   earlier attempt of this task, or of an earlier run of this epoch before a crash. This runs
   whether or not the attempt has rows, so a replay with other data still cleans up;
4. folds the rows per key in MERGE_STATE form with the table's own aggregators (one row per key:
   less to send, fewer RocksDB writes) in a deterministic order, and writes them under the lease;
5. reports its end offsets, which the driver commits once every task has succeeded.
"""

from __future__ import annotations

import dataclasses
import time

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from merge_engine import MergeMode
from merge_engine.keys import encode_keys
from merge_engine.preaggregate import preaggregate
from sink import remote
from sink.bucketing import check_bucket
from sink.plan import BUCKET_COLUMN, ORDER_COLUMN, WritePlan
from tally.errors import RecoveryError

SEQUENCE_COLUMN = "__tally_sequence"

RESULT_SCHEMA = pa.schema([
    ("kind", pa.string()),          # "task" (one per attempt that succeeded) or "offset"
    ("bucket", pa.int32()),
    ("partition", pa.string()),
    ("end_offset", pa.int64()),
    ("rows", pa.int64()),
    ("keys", pa.int64()),
    ("undone", pa.int64()),         # (partition, bucket) pairs undone by this attempt
    ("attempt", pa.int32()),
    ("seconds", pa.float64()),
])
RESULT_DDL = ("kind string, bucket int, partition string, end_offset long, rows long, "
              "keys long, undone long, attempt int, seconds double")


@dataclasses.dataclass(frozen=True)
class EpochContext:
    """What the driver decided for this epoch (picklable, shipped to every task)."""

    url: str
    token: str | None
    lease: object                  # locks.Lease
    epoch: int
    baseline: dict                 # {(partition, bucket): end offset before the epoch}
    fail_hook: str | None = None   # tests only: "module:function" called after half the rows


def order_of(data: pa.Table, plan: WritePlan) -> np.ndarray:
    """The fold order: by the sequence column (ascending, nulls first) when there is one, then
    by input position (input partition, row within it), so a replay folds identically."""
    names = [ORDER_COLUMN]
    if plan.sequence_column is not None:
        names.insert(0, _sequence_name(plan))
    try:  # pyarrow >= 25 takes the null placement per key
        keys = [(name, "ascending", "at_start") for name in names]
        return pc.sort_indices(data, sort_keys=keys).to_numpy()
    except (TypeError, ValueError, pa.ArrowInvalid):
        keys = [(name, "ascending") for name in names]
        return pc.sort_indices(data, sort_keys=keys, null_placement="at_start").to_numpy()


def _sequence_name(plan: WritePlan) -> str:
    if plan.sequence_column in plan.input_columns:
        return plan.table_columns[plan.input_columns.index(plan.sequence_column)]
    return SEQUENCE_COLUMN


def last_per_key(rows: pa.Table, key_columns, order: np.ndarray) -> pa.Table:
    """OVERWRITE folding: the last row of each key in `order`."""
    ordered = rows.take(pa.array(order, type=pa.int64()))
    keys = pa.array(encode_keys([ordered.column(k).combine_chunks() for k in key_columns]),
                    type=pa.binary())
    codes = keys.dictionary_encode().indices.to_numpy(zero_copy_only=False)
    last = np.full(int(codes.max()) + 1 if len(codes) else 0, -1, dtype=np.int64)
    last[codes] = np.arange(len(codes))
    return ordered.take(pa.array(np.sort(last), type=pa.int64()))


def fold_rows(data: pa.Table, plan: WritePlan) -> tuple[pa.Table, MergeMode]:
    """One row per key, and the mode to send it in."""
    order = order_of(data, plan)
    rows = data.select(list(plan.target_columns))
    if plan.mode is MergeMode.OVERWRITE:
        return last_per_key(rows, plan.key_columns, order), MergeMode.OVERWRITE
    folded = preaggregate(rows, plan.descriptor, list(plan.target_columns), plan.mode, order)
    return folded, MergeMode.MERGE_STATE


class BucketWriter:
    """mapInArrow function of the write stage (runs on executors, one call per bucket)."""

    def __init__(self, plan: WritePlan, epoch: EpochContext):
        self.plan = plan
        self.epoch = epoch

    def __call__(self, batches):
        from pyspark import TaskContext

        started = time.monotonic()
        context = TaskContext.get()
        bucket = context.partitionId()
        attempt_number = context.attemptNumber()
        data = _collect(batches)
        check_bucket(data.column(BUCKET_COLUMN), bucket, self.plan.table)
        conn = remote.shared_connection(self.epoch.url, self.epoch.token)
        table = conn.table(self.plan.table)
        if table.meta.table_id != self.plan.table_id:
            raise RecoveryError(
                f"Table {self.plan.table} was dropped and re-created while the job ran "
                f"(table id {self.plan.table_id}, now {table.meta.table_id}); nothing written")
        lease = self.epoch.lease
        attempt = remote.register_attempt(conn, lease, bucket)
        ends: dict = {}
        undone = 0
        for (partition, b), end in table.list_offsets().items():
            if b != bucket:
                continue
            baseline = self.epoch.baseline.get((partition, b), 0)
            if end > baseline:
                result = remote.undo_bucket(table, b, baseline, partition,
                                            self.plan.writer_target, lease, attempt)
                ends[(partition, b)] = int(result.end_after if result.end_after is not None
                                           else result.end)
                undone += 1
        keys = 0
        if data.num_rows:
            folded, mode = fold_rows(data, self.plan)
            keys = folded.num_rows
            writer = remote.bucket_writer(table, self.plan.writer_target, mode, lease, attempt)
            try:
                self._write(writer, folded, attempt_number)
                ends.update(writer.flush())
            finally:
                writer.close()
        yield _results(bucket, ends, data.num_rows, keys, undone, attempt_number,
                       time.monotonic() - started)

    def _write(self, writer, folded: pa.Table, attempt_number: int) -> None:
        hook = self.epoch.fail_hook
        if hook is None or folded.num_rows < 2:
            writer.upsert(folded)
            return
        half = folded.num_rows // 2
        writer.upsert(folded.slice(0, half))
        writer.flush()
        module, _, name = hook.partition(":")
        import importlib

        getattr(importlib.import_module(module), name)(self.plan, self.epoch, attempt_number)
        writer.upsert(folded.slice(half))


def _collect(batches) -> pa.Table:
    batches = list(batches)
    if not batches:
        return pa.table({BUCKET_COLUMN: pa.array([], pa.int32()),
                         ORDER_COLUMN: pa.array([], pa.int64())})
    return pa.Table.from_batches(batches)


def _results(bucket: int, ends: dict, rows: int, keys: int, undone: int, attempt: int,
             seconds: float) -> pa.RecordBatch:
    records = [{"kind": "task", "bucket": bucket, "partition": None, "end_offset": None,
                "rows": rows, "keys": keys, "undone": undone, "attempt": attempt,
                "seconds": seconds}]
    for (partition, b), end in sorted(ends.items(), key=lambda kv: (kv[0][0] or "", kv[0][1])):
        records.append({"kind": "offset", "bucket": b, "partition": partition,
                        "end_offset": int(end), "rows": None, "keys": None, "undone": None,
                        "attempt": attempt, "seconds": None})
    return pa.RecordBatch.from_pylist(records, schema=RESULT_SCHEMA)

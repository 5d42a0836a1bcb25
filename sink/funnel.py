"""The data source's commit side: every task's folded rows, written once, by one process.

A Python data source cannot repartition its input, so its tasks cannot own buckets. Instead each
task folds its own rows per key and returns them in its commit message (it writes nothing), and
`commit()`, which Spark calls once, with the messages of the winning attempts only, after every
task succeeded, runs the epoch protocol of sink.protocol in one process: lock, recover, skip a
committed epoch, baseline, undo what an earlier run of the epoch wrote, write, commit. Failed,
retried and speculative attempts therefore never touch the table. The price: all folded rows of
a batch pass through the commit process (bounded by spark.driver.maxResultSize).
"""

from __future__ import annotations

import dataclasses
import io
import threading

import numpy as np
import pyarrow as pa

from merge_engine import MergeMode
from merge_engine.preaggregate import preaggregate
from sink import remote
from sink.plan import ORDER_COLUMN, WritePlan
from sink.task import SEQUENCE_COLUMN, fold_rows, last_per_key


@dataclasses.dataclass
class FoldedPart:
    """One task's contribution (picklable; travels inside a WriterCommitMessage)."""

    partition: int
    rows: int
    payload: bytes          # Arrow IPC stream: folded states, or ordered raw rows (sequence)
    folded: bool
    query_id: str | None = None


def to_ipc(table: pa.Table) -> bytes:
    sink = io.BytesIO()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue()


def from_ipc(payload: bytes) -> pa.Table:
    return pa.ipc.open_stream(io.BytesIO(payload)).read_all()


def fold_part(data: pa.Table, plan: WritePlan, partition: int, query_id: str | None) -> FoldedPart:
    """A task's rows folded per key (in input order), or, with a sequence column, its rows as
    they are: states of order-sensitive functions cannot be merged across tasks by sequence."""
    if plan.sequence_column is not None:
        keep = list(plan.target_columns) + [_sequence(plan), ORDER_COLUMN]
        return FoldedPart(partition, data.num_rows, to_ipc(data.select(list(dict.fromkeys(keep)))),
                          False, query_id)
    folded, _ = fold_rows(data, plan)
    return FoldedPart(partition, data.num_rows, to_ipc(folded), True, query_id)


def _sequence(plan: WritePlan) -> str:
    if plan.sequence_column in plan.input_columns:
        return plan.table_columns[plan.input_columns.index(plan.sequence_column)]
    return SEQUENCE_COLUMN


def combine(parts: list[FoldedPart], plan: WritePlan) -> tuple[pa.Table | None, MergeMode]:
    """All parts folded into one row per key, in task order (deterministic)."""
    parts = sorted((p for p in parts if p is not None and p.rows), key=lambda p: p.partition)
    if not parts:
        return None, MergeMode.MERGE_STATE
    tables = [from_ipc(p.payload) for p in parts]
    if not parts[0].folded:
        data = pa.concat_tables(tables, promote_options="default")
        return fold_rows(data, plan)
    states = pa.concat_tables(tables, promote_options="default")
    if plan.mode is MergeMode.OVERWRITE:
        order = np.arange(states.num_rows)
        return last_per_key(states, plan.key_columns, order), MergeMode.OVERWRITE
    return preaggregate(states, plan.descriptor, list(plan.target_columns),
                        MergeMode.MERGE_STATE), MergeMode.MERGE_STATE


class FunnelWriter:
    """The epoch protocol in one process (see the module docstring)."""

    _cache: dict[tuple, "FunnelWriter"] = {}
    _guard = threading.Lock()

    def __init__(self, options, plan: WritePlan, owner_id: str):
        self.options = options
        self.plan = plan
        self.owner_id = owner_id
        self.conn = remote.connect(options.url, options.token)
        self.lease = remote.acquire(self.conn, plan.table, owner_id, plan.lock_columns,
                                    options.ttl)
        remote.recover(self.conn, plan.table, self.lease, plan.writer_target)

    @classmethod
    def for_stream(cls, options, plan: WritePlan, owner_id: str) -> "FunnelWriter":
        """One writer per owner in this process, kept across micro-batches (the lease keeper
        renews the lock between them; it expires after the ttl once the query stops)."""
        key = (options.url, plan.table, owner_id)
        with cls._guard:
            writer = cls._cache.get(key)
            if writer is None:
                writer = cls._cache[key] = cls(options, plan, owner_id)
            return writer

    def write_epoch(self, epoch: int | None, parts: list[FoldedPart]) -> int | None:
        """Write the epoch (None: the one after the last commit); the epoch, or None when it
        was already committed."""
        last = remote.last_commit(self.conn, self.plan.table, self.owner_id)
        committed = None if last is None else int(last[0])
        if epoch is None:
            epoch = 0 if committed is None else committed + 1
        elif committed is not None and committed >= epoch:
            return None
        baseline = dict(remote.epoch_baseline(self.conn, self.lease, epoch))
        table = self.conn.table(self.plan.table)
        offsets = dict(baseline)
        for (partition, bucket), end in table.list_offsets().items():
            start = baseline.get((partition, bucket), 0)
            if end > start:
                result = remote.undo_bucket(table, bucket, start, partition,
                                            self.plan.writer_target, self.lease, None)
                offsets[(partition, bucket)] = int(result.end_after or result.end)
        rows, mode = combine(parts, self.plan)
        if rows is not None and rows.num_rows:
            writer = remote.bucket_writer(table, self.plan.writer_target, mode, self.lease, None)
            try:
                writer.upsert(rows)
                offsets.update(writer.flush())
            finally:
                writer.close()
        remote.commit(self.conn, self.lease, epoch, offsets)
        return epoch

    def release(self) -> None:
        try:
            remote.release(self.conn, self.lease)
        finally:
            self.conn.close()

    def abandon(self) -> None:
        self.conn.close()

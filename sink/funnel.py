"""The data source's delivery of an epoch: every task's folded rows, written by one process.

A Python data source cannot repartition its input, so its tasks cannot own buckets. Instead each
task folds its own rows per key and returns them in its commit message (it writes nothing), and
`commit()`, which Spark calls once, with the messages of the winning attempts only, after every
task succeeded, runs the epoch protocol of sink.protocol (`WriterRun`, the same code as
TallySink's) with `FunnelDelivery`: the parts are combined into one row per key, split by
bucket, and every bucket goes through the same per-bucket step as a TallySink task
(sink.task.write_bucket: register an attempt, undo to the epoch baseline, write, report).
Failed, retried and speculative task attempts therefore never touch the table. The price: all
folded rows of a batch pass through the commit process (bounded by spark.driver.maxResultSize).
"""

from __future__ import annotations

import logging
import threading

import numpy as np
import pyarrow as pa

from sink import remote
from sink.fold import FoldedPart, combine, fold_part
from sink.plan import WritePlan
from sink.protocol import WriterRun
from sink.task import BucketReport, EpochContext, write_every_bucket
from tally.errors import LeaseLostError

log = logging.getLogger("tally.sink")


def fold_task_rows(plan: WritePlan, feeds, batches, partition: int, label: str,
                   query_id: str | None) -> tuple[FoldedPart | None, dict[str, FoldedPart]]:
    """What a task returns of its input partition's table-named rows: its folded part (None
    without rows), and {rollup table: the part of the rows projected into it} for each of
    the write's rollup feeds. Keys are checked, and buckets computed, as the task delivery
    does (sink.job.BucketAssigner)."""
    from sink.job import BucketAssigner

    source = list(batches)
    out = [b for b in BucketAssigner(plan, label)(source) if b.num_rows]
    if not out:
        return None, {}
    rollup_parts = {}
    for feed in feeds:
        projected = (b for batch in source for b in feed.project(batch).to_batches())
        rows = [b for b in BucketAssigner(feed.plan, f"{label} (rollup {feed.table})")(projected)]
        rollup_parts[feed.table] = fold_part(pa.Table.from_batches(rows), feed.plan, partition,
                                             query_id)
    return fold_part(pa.Table.from_batches(out), plan, partition, query_id), rollup_parts


def split_by_bucket(rows: pa.Table, plan: WritePlan) -> dict[int, pa.Table]:
    """{bucket: its rows}, with the client's bucket function (as BucketAssigner does)."""
    from tally.wire.bucket_hash import bucket_ids

    ids = bucket_ids(rows.select(list(plan.key_columns)), list(plan.bucket_key),
                     plan.bucket_count)
    return {int(b): rows.filter(pa.array(ids == b)) for b in np.unique(ids)}


class FunnelDelivery:
    """The data source's delivery of an epoch (see the module docstring): every bucket, with
    or without rows, one after another, through the per-bucket step."""

    def __init__(self, parts: list[FoldedPart], feeds=(), messages=()):
        self.parts = parts
        # The rollups the tasks projected their rows into, and each one's parts.
        self.fed = {feed.table for feed in feeds}
        self.rollup_parts: dict[str, list[FoldedPart]] = {}
        for message in messages:
            for table, part in (getattr(message, "rollup_parts", None) or {}).items():
                self.rollup_parts.setdefault(table, []).append(part)

    def __call__(self, conn, plan: WritePlan, epoch: EpochContext,
                 label: str) -> list[BucketReport]:
        rows, mode = combine(self.parts, plan)
        by_bucket = {} if rows is None else split_by_bucket(rows, plan)
        return write_every_bucket(conn, plan, epoch, by_bucket, mode)

    def rollup(self, feed, source: WritePlan) -> "FunnelDelivery | None":
        """The delivery of a rollup's parts; None for a rollup the tasks did not project
        into (added after the write was planned)."""
        if feed.table not in self.fed:
            return None
        return FunnelDelivery(self.rollup_parts.get(feed.table, []))


class StreamRuns:
    """The commit process's `WriterRun` of each streaming owner, kept across micro-batches
    (the lease keeper renews the lock between them; it expires after the ttl once the query
    stops). Before each batch the lease is renewed: Spark may run a batch's commit in another
    Python worker, whose own run re-acquired the owner's lock and so fenced this one; then this
    process opens a new run (acquire, recover) as a restarted writer does."""

    _runs: dict[tuple, WriterRun] = {}
    _guard = threading.Lock()

    @classmethod
    def get(cls, options, plan: WritePlan, owner_id: str) -> WriterRun:
        key = (options.url, plan.table, owner_id)
        with cls._guard:
            run = cls._runs.pop(key, None)
        if run is not None:
            try:
                remote.renew(run.conn, run.lease)
            except LeaseLostError as e:
                log.info("tally data source %s: lease lost (%s); re-acquiring", owner_id, e)
                run.abandon()
                run = None
        if run is None:
            run = WriterRun.connect(options, plan, owner_id)
        with cls._guard:
            cls._runs[key] = run
        return run

    @classmethod
    def drop(cls, run: WriterRun) -> None:
        """Forget a run whose epoch failed without a complete rollback: the next batch opens
        a new one, whose recovery undoes what is left."""
        with cls._guard:
            for key, found in list(cls._runs.items()):
                if found is run:
                    del cls._runs[key]
        run.abandon()

"""The driver's side of exactly-once: one `WriterRun` per run of a writer, one epoch per batch.

A run (a streaming query run, or one batch job) first acquires the column lock under its owner
id (a restarted owner gets its lock back with its original initial offsets) and undoes
everything the owner wrote since its last commit, or since the lock's initial offsets when it
never committed (`recovery.recover`). Then, for each epoch (a micro-batch id):

1. skip it when the owner's last commit is at or past it: the batch finished before a crash
   that came before Spark recorded it;
2. fetch the epoch baseline, stored insert-if-absent before any write of the epoch, so a
   replayed epoch keeps the offsets it had before its first run;
3. run the write job: every bucket's task undoes its bucket to the baseline when needed, then
   writes its folded rows (sink.task);
4. check that every bucket was visited by exactly one task, then commit the epoch with the end
   offsets of every bucket.

The lease keeper (started by acquire) renews the lease throughout; a lost lease makes writes
and the commit fail, so a fenced run can never commit.
"""

from __future__ import annotations

import dataclasses
import logging
import time

from sink import remote
from sink.bucketing import check_task_coverage
from sink.job import run_write_job
from sink.options import SinkOptions
from sink.plan import WritePlan
from sink.task import EpochContext
from tally.errors import TallyError

log = logging.getLogger("tally.sink")


@dataclasses.dataclass
class EpochResult:
    epoch: int
    skipped: bool
    rows: int = 0
    keys: int = 0
    undone: int = 0
    retried_tasks: int = 0
    seconds: float = 0.0
    offsets: dict = dataclasses.field(default_factory=dict)


class WriterRun:
    """One run of one writer: lease, recovery, epochs (see the module docstring)."""

    def __init__(self, conn, options: SinkOptions, plan: WritePlan, owner_id: str,
                 fail_hook: str | None = None):
        self.conn = conn
        self.options = options
        self.plan = plan
        self.owner_id = owner_id
        self.fail_hook = fail_hook
        self.lease = None
        self.recovery = None
        self.in_epoch = False
        self.epochs: list[EpochResult] = []

    def open(self) -> "WriterRun":
        self.lease = remote.acquire(self.conn, self.plan.table, self.owner_id,
                                    self.plan.lock_columns, self.options.ttl)
        self.recovery = remote.recover(self.conn, self.plan.table, self.lease,
                                       self.plan.writer_target)
        summary = getattr(self.recovery, "summary", None)
        log.info("tally sink %s: %s", self.owner_id, summary() if summary else self.recovery)
        return self

    def last_committed(self) -> int | None:
        last = remote.last_commit(self.conn, self.plan.table, self.owner_id)
        return None if last is None else int(last[0])

    def write_epoch(self, df, epoch: int, label: str) -> EpochResult:
        started = time.monotonic()
        committed = self.last_committed()
        if committed is not None and committed >= epoch:
            log.info("tally sink %s: %s already committed (last commit %s); skipped",
                     self.owner_id, label, committed)
            result = EpochResult(epoch, skipped=True)
            self.epochs.append(result)
            return result
        self.in_epoch = True
        baseline = remote.epoch_baseline(self.conn, self.lease, epoch)
        context = EpochContext(self.options.url, self.options.token, self.lease, epoch,
                               dict(baseline), self.fail_hook)
        rows = run_write_job(df, self.plan, context, label)
        result = self._summarize(epoch, rows, baseline)
        remote.commit(self.conn, self.lease, epoch, result.offsets)
        self.in_epoch = False
        result.seconds = time.monotonic() - started
        self.epochs.append(result)
        return result

    def _summarize(self, epoch: int, rows: list, baseline: dict) -> EpochResult:
        tasks = [r for r in rows if r["kind"] == "task"]
        check_task_coverage([r["bucket"] for r in tasks], self.plan.bucket_count, self.plan.table)
        offsets = dict(baseline)
        for r in rows:
            if r["kind"] == "offset":
                offsets[(r["partition"], int(r["bucket"]))] = int(r["end_offset"])
        return EpochResult(
            epoch, skipped=False, rows=sum(r["rows"] for r in tasks),
            keys=sum(r["keys"] for r in tasks), undone=sum(r["undone"] for r in tasks),
            retried_tasks=sum(1 for r in tasks if r["attempt"] > 0), offsets=offsets)

    def release(self) -> None:
        """A clean end: drop the lock (its commits stay) and close the connection."""
        try:
            if self.lease is not None:
                remote.release(self.conn, self.lease)
        except TallyError as e:
            log.warning("tally sink %s: releasing the lock failed: %s", self.owner_id, e)
        finally:
            self.conn.close()

    def abandon(self) -> None:
        """A failed end: stop renewing without releasing, so the lock expires after its ttl
        (a restart of the same owner gets it back, with its original initial offsets)."""
        self.conn.close()

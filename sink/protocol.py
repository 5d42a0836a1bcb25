"""The epoch protocol, once for every writer: one `WriterRun` per run, one epoch per batch.

TallySink (foreachBatch, `start`, `write`) and the `format("tally")` data source (batch and
streaming) run this same code; they differ only in how an epoch's rows reach the buckets, the
*delivery*: a Spark job with one task per bucket (sink.job.SparkJob), or the data source's
commit process writing the folded parts its tasks returned (sink.funnel.FunnelDelivery). Both
deliveries send every bucket through the same per-bucket step (sink.task.write_bucket).

A run (a streaming query run, one batch job, a data source commit process) first acquires the
column lock under its owner id (a restarted owner gets its unreleased lock back, continuing its
tenure) and undoes everything the owner wrote in that tenure since its last commit
(`recovery.recover`). Then, for each epoch (a micro-batch id, or a batch write's epoch):

1. skip it when the owner's last commit is at or past it: the batch finished before a crash
   that came before Spark recorded it (asked of the coordinator once per run; after that the
   run knows, since only the lease holder commits and a fenced run can neither write nor
   commit);
2. begin the epoch in one coordinator call: a new attempt for every bucket (fencing every
   earlier attempt of the owner), the end offsets after that, and the epoch baseline, stored
   insert-if-absent before any write of the epoch, so a replayed epoch keeps the offsets it had
   before its first run;
3. deliver the rows: every bucket goes through the per-bucket step (register an attempt, undo
   to the baseline, write, report its end offsets). A delivery with a `prepare` step, which
   changes nothing in Tally (TallySink choosing its delivery, the driver delivery reading the
   batch), runs it while step 2's call runs; what it raises fails the begun epoch like a
   failed delivery;
4. check that every bucket was visited by exactly one step, then commit the epoch with the
   end offsets of every bucket.

If 3 or 4 fails while this process lives (bad data in one bucket, a task out of retries, a
lost lease), the run rolls the whole epoch back before it raises: it registers a new attempt
for every bucket (fencing any task attempt still running) and undoes every bucket past the
baseline (`recovery.undo_since`). The error (sink.errors.EpochFailedError, typed after its
cause) then says that nothing was applied. Only a dead process leaves a partial epoch; the
owner's next run undoes it in step 0. The lease keeper (started by acquire) renews the lease
throughout; a fenced run can never write or commit.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Callable

from sink import remote
from sink.epoch_errors import epoch_failed
from sink.epoch_log import epoch_line, show_by_default
from sink.options import SinkOptions
from sink.plan import WritePlan, plan_write
from sink.rollup_runs import RollupMembers
from sink.task import BucketMismatchError, BucketReport, EpochContext
from tally.errors import AttemptSupersededError, RollupBuildingError, TallyError
from tally.timestamps import duration

log = logging.getLogger("tally.sink")

# How an epoch's rows reach the buckets: (conn, plan, epoch context, label) -> reports.
Delivery = Callable[[object, WritePlan, EpochContext, str], list[BucketReport]]

# How long ending a run waits for an epoch still running (a query stopped mid-batch).
END_WAIT_SECONDS = 60.0
# A rollback that a straggling task of the failed job outran (it registered a newer attempt
# after the rollback's) registers again and undoes again, this many times at most.
ROLLBACK_TRIES = 10
# How long an epoch's begin waits while a rollup of its table is being backfilled.
ROLLUP_BUILD_WAIT = 600.0


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
    # {rollup table: its EpochResult}: the rollups this epoch wrote and committed with it
    rollups: dict = dataclasses.field(default_factory=dict)

    def __repr__(self) -> str:
        return (f"EpochResult(epoch {self.epoch}, skipped {self.skipped}, {self.rows} rows, "
                f"{self.keys} keys, {self.undone} undone, {self.retried_tasks} task(s) retried, "
                f"{duration(round(self.seconds, 2))}, offsets {self.offsets})")


class WriterRun:
    """One run of one writer: lease, recovery, epochs (see the module docstring)."""

    def __init__(self, conn, options: SinkOptions, plan: WritePlan, owner_id: str, *,
                 shares_connection: bool = False):
        self.conn = conn
        # A rollup's run writes through its source run's connection, which only that closes.
        self.shares_connection = shares_connection
        self.options = options
        self.plan = plan
        self.owner_id = owner_id
        self.lease = None
        self.recovery = None
        # True from an epoch's first write until its commit or complete rollback: the table
        # may then hold part of the epoch, and only the owner's recovery may remove it.
        self.dirty = False
        self.epochs: list[EpochResult] = []
        self._epoch_lock = threading.Lock()
        # The owner's last committed epoch as this run knows it: asked once, then updated by
        # the run's own commits (None: not asked yet; see step 1 of the module docstring).
        self._committed: tuple[int | None] | None = None
        self.rollups = RollupMembers(self)

    @classmethod
    def connect(cls, options: SinkOptions, plan: WritePlan | None, owner_of, *,
                schema=None) -> "WriterRun":
        """Connect, plan (unless given; from the DataFrame `schema`), pick the owner id
        (`owner_of(plan)`, or a string) and open the run; the connection is closed on failure."""
        conn = remote.connect(options.url, options.token, options.tls)
        try:
            if plan is None:
                plan = plan_write(conn, options, schema)
            owner = owner_of if isinstance(owner_of, str) else owner_of(plan)
            return cls(conn, options, plan, owner).open()
        except BaseException:
            conn.close()
            raise

    def open(self) -> "WriterRun":
        show_by_default()
        feeds = self.rollups.check()  # before the lock: a write they refuse takes nothing
        self.lease = remote.acquire(self.conn, self.plan.table, self.owner_id,
                                    self.plan.lock_columns, self.options.ttl)
        self.recovery = remote.recover(self.conn, self.plan.table, self.lease,
                                       self.plan.writer_target)
        log.info("%s", self.recovery.summary())
        self.rollups.open(feeds)  # every rollup's lock taken and its tenure recovered too
        return self

    def last_committed(self) -> int | None:
        last = remote.last_commit(self.conn, self.plan.table, self.owner_id)
        return None if last is None else int(last[0])

    def _known_commit(self) -> int | None:
        if self._committed is None:
            self._committed = (self.last_committed(),)
        return self._committed[0]

    def batch_epoch(self) -> int:
        """A batch write's epoch: the `epoch` option, else the one after the last commit."""
        if self.options.epoch is not None:
            return self.options.epoch
        committed = self.last_committed()
        return 0 if committed is None else committed + 1

    def write_epoch(self, epoch: int, label: str, deliver: Delivery) -> EpochResult:
        with self._epoch_lock:
            return self._write_epoch(epoch, label, deliver)

    def _write_epoch(self, epoch: int, label: str, deliver: Delivery) -> EpochResult:
        started = time.monotonic()
        committed = self._known_commit()
        if committed is not None and committed >= epoch:
            log.info("tally sink %s: %s already committed (last commit %s); skipped",
                     self.owner_id, label, committed)
            result = EpochResult(epoch, skipped=True)
            self.epochs.append(result)
            return result
        start, prepare_error = self._begin(epoch, deliver, label)
        context = self._context(epoch, start)
        self.dirty = True
        members: list = []
        try:
            if prepare_error is not None:
                raise prepare_error
            # The rollups are read once the source's epoch is begun: a rollup added since
            # is fed from this epoch on, and one being backfilled refused the begin above.
            members = self.rollups.begin(epoch, deliver)
            reports = deliver(self.conn, self.plan, context, label)
            result = self._summarize(epoch, reports, context.baseline)
            member_results = [member.deliver(label) for member in members]
        except Exception as failure:
            raise self._roll_back(epoch, context.baseline, label, failure, members) from failure
        commits = [(self.lease, result.offsets)] + \
            [(member.run.lease, done.offsets) for member, done in zip(members, member_results)]
        try:
            remote.commit_together(self.conn, commits, epoch)
        except Exception as failure:
            if not self._commit_landed(epoch, label, failure):
                raise self._roll_back(epoch, context.baseline, label, failure,
                                      members) from failure
        for run in [self] + [member.run for member in members]:
            run._committed = (epoch,)
            run.dirty = False
        result.seconds = time.monotonic() - started
        result.rollups = {member.feed.table: done for member, done in zip(members, member_results)}
        self.epochs.append(result)
        log.info("%s", epoch_line(self.plan.table, label, result))
        return result

    def _context(self, epoch: int, start) -> EpochContext:
        return EpochContext(self.options.url, self.options.token, self.lease, epoch,
                            dict(start.baseline), self.options.fail_hook, self.options.tls,
                            attempts=dict(start.attempts), offsets=dict(start.offsets),
                            run=start.run)

    def _begin(self, epoch: int, deliver: Delivery, label: str):
        """Begin the epoch (step 2); a delivery with a `prepare` step (reading the batch,
        which changes nothing in Tally) runs it meanwhile, so the coordinator call overlaps
        Spark's job. (the epoch's start, the error `prepare` raised or None): that error
        fails the begun epoch as a failed delivery would, rolled back."""
        prepare = getattr(deliver, "prepare", None)
        buckets = range(self.plan.bucket_count)
        if prepare is None:
            return begin_waiting(self.conn, self.lease, epoch, buckets, label), None
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="tally-begin") as pool:
            begun = pool.submit(begin_waiting, self.conn, self.lease, epoch, buckets, label)
            try:
                prepare(self.plan, label)
                failure = None
            except Exception as error:  # noqa: BLE001 - raised once the epoch is begun
                failure = error
            return begun.result(), failure

    def _summarize(self, epoch: int, reports: list[BucketReport], baseline: dict) -> EpochResult:
        check_task_coverage([r.bucket for r in reports], self.plan.bucket_count, self.plan.table)
        offsets = dict(baseline)
        for report in reports:
            offsets.update(report.ends)
        return EpochResult(
            epoch, skipped=False, rows=sum(r.rows for r in reports),
            keys=sum(r.keys for r in reports), undone=sum(r.undone for r in reports),
            retried_tasks=sum(1 for r in reports if r.attempt > 0), offsets=offsets)

    def _commit_landed(self, epoch: int, label: str, failure: Exception) -> bool:
        """Whether a commit that raised was recorded after all (its answer was lost). When
        that cannot be told either, neither roll back nor claim success."""
        try:
            committed = self.last_committed()
        except Exception as unknown:
            raise TallyError(
                f"{label} into {self.plan.table}: its commit failed ({failure}) and whether it "
                f"was recorded cannot be told ({unknown}). Restart the writer with the same "
                f"owner id '{self.owner_id}': a recorded epoch is skipped, an unrecorded one "
                "is undone and written again.") from failure
        landed = committed is not None and committed >= epoch
        if landed:
            log.warning("tally sink %s: the commit of %s raised (%s) but was recorded",
                        self.owner_id, label, failure)
        return landed

    def _roll_back(self, epoch: int, baseline: dict, label: str, failure: Exception,
                   members: list = ()) -> Exception:
        """Undo every bucket of a failed epoch to its baseline, in the source and in every
        rollup the epoch began; the error to raise."""
        details = dict(label=label, table=self.plan.table, owner_id=self.owner_id, epoch=epoch)
        try:
            undone = self._undo_epoch(epoch, baseline)
            for member in members:
                undone += member.run._undo_epoch(epoch, member.context.baseline)
                member.run.dirty = False
        except Exception as undo_error:
            log.error("tally sink %s: rolling back %s failed: %s", self.owner_id, label,
                      undo_error)
            return epoch_failed(failure, rolled_back=False, undo_error=undo_error, **details)
        self.dirty = False
        log.warning("tally sink %s: %s failed and was rolled back (%d bucket(s) undone)",
                    self.owner_id, label, len(undone))
        return epoch_failed(failure, rolled_back=True, buckets_undone=len(undone), **details)

    def _undo_epoch(self, epoch: int, baseline: dict) -> list:
        """Spark cancels a failed job's running tasks without waiting for them, so a task may
        still try to begin its bucket after the rollback. The epoch's run is aborted first: no
        task of it can register an attempt from then on. Then every bucket gets a new attempt,
        not only those written so far, fencing the tasks that registered before the abort, and
        is undone. A task registering by itself, outside the run's guard, can still outrun the
        rollback's registration and fence its undo: then the rollback registers again and undoes
        what that task wrote too."""
        remote.abort_epoch(self.conn, self.lease, epoch)
        for tried in range(1, ROLLBACK_TRIES + 1):
            remote.register_attempts(self.conn, self.lease, range(self.plan.bucket_count))
            try:
                return remote.undo_since(self.conn, self.plan.table, self.lease, baseline,
                                         self.plan.writer_target)
            except AttemptSupersededError as outrun:
                if tried == ROLLBACK_TRIES:
                    raise
                log.warning("tally sink %s: a task of the failed job registered after the "
                            "rollback began (%s); registering and undoing again",
                            self.owner_id, outrun)
                time.sleep(min(0.2 * tried, 2.0))
        raise AssertionError("unreachable")

    def end(self) -> None:
        """The end of the run: release the lock when no epoch is partly applied (its commits
        stay), else only close, so the lock expires and keeps the columns for the owner's
        restart, whose recovery undoes the partial epoch. Waits for an epoch still running
        (a query stopped mid-batch) so that a lock is never released under a partial epoch."""
        if not self._epoch_lock.acquire(timeout=END_WAIT_SECONDS):
            log.warning("tally sink %s: an epoch is still running; the lock is left to expire",
                        self.owner_id)
            self.abandon()
            return
        try:
            if self.dirty:
                self.abandon()
            else:
                self.release()
        finally:
            self._epoch_lock.release()

    def release(self) -> None:
        """A clean end: drop the locks, the rollups' and its own (the commits stay), and close
        the connection."""
        try:
            self.rollups.release()
            if self.lease is not None:
                remote.release(self.conn, self.lease)
        except TallyError as e:
            log.warning("tally sink %s: releasing the lock failed: %s", self.owner_id, e)
        finally:
            self.close()

    def abandon(self) -> None:
        """A failed end: stop renewing without releasing, so the locks expire after their ttl
        (a restart of the same owner gets them back and recovers its tenure)."""
        self.close()

    def close(self) -> None:
        if not self.shares_connection:
            self.conn.close()


def begin_waiting(conn, lease, epoch: int, buckets, label: str):
    """`remote.begin_epoch`, begun again while a rollup of the table is being backfilled (its
    scan must see no epoch in flight), for at most ROLLUP_BUILD_WAIT seconds."""
    deadline = time.monotonic() + ROLLUP_BUILD_WAIT
    waited = False
    while True:
        try:
            return remote.begin_epoch(conn, lease, epoch, buckets)
        except RollupBuildingError as building:
            if time.monotonic() >= deadline:
                raise RollupBuildingError(
                    f"{label} into {lease.table} waited {ROLLUP_BUILD_WAIT:.0f} s for a rollup's "
                    f"backfill to end and gave up; nothing of it was written ({building})"
                ) from None
            if not waited:
                log.info("tally sink %s: %s waits for a rollup's backfill: %s",
                         lease.owner_id, label, building)
                waited = True
            time.sleep(1.0)


def check_task_coverage(task_buckets: list[int], bucket_count: int, table: str) -> None:
    """Every bucket must have been visited by exactly one successful task (driver side), so a
    bucket written before a crash is undone even when the replay has no rows for it."""
    if sorted(task_buckets) != list(range(bucket_count)):
        raise BucketMismatchError(
            f"The write to {table} ran tasks for buckets {sorted(task_buckets)}, expected one "
            f"task for each of the {bucket_count} buckets; the epoch was not committed")

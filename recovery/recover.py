"""recover(): bring an owner's columns back to its last commit after a crash.

Baselines come from the owner's last commit in its lock tenure; before a commit in it, from the
offsets the tenure began at (a failover before the first commit); buckets of partitions created
after the baseline start from 0. Every bucket whose end offset is past its baseline is undone.
Nothing is changed when any check fails: the table was re-created, or some bucket's log no
longer reaches back to its baseline, or ends before it.

`acquire` is the lock acquisition that takes over expired, unrecovered locks by undoing them.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from aggfuncs import aggregator_class
from recovery.bucket_undo import UndoResult
from recovery.remote_bucket import undo_remote
from tally.errors import RecoveryError, UnrecoveredLockError
from tally.timestamps import duration


@dataclass
class RecoveryReport:
    table: str
    owner_id: str
    baseline_source: str
    buckets: list[UndoResult] = field(default_factory=list)
    skipped: str | None = None
    seconds: float = 0.0

    @property
    def keys_restored(self) -> int:
        return sum(b.keys_restored for b in self.buckets)

    @property
    def keys_deleted(self) -> int:
        return sum(b.keys_deleted for b in self.buckets)

    def __repr__(self) -> str:
        return (f"RecoveryReport({self.table!r}, owner {self.owner_id!r}, from "
                f"{self.baseline_source}, {len(self.buckets)} bucket(s), skipped "
                f"{self.skipped!r}, {duration(self.seconds)})")

    def summary(self) -> str:
        if self.skipped:
            return f"undo skipped for {self.owner_id} on {self.table}: {self.skipped}"
        ranges = ", ".join(
            f"{'' if b.partition is None else b.partition + '/'}{b.bucket}:[{b.baseline},{b.end})"
            for b in self.buckets) or "nothing to undo"
        return (f"undo of {self.owner_id} on {self.table} from {self.baseline_source}: "
                f"{len(self.buckets)} bucket(s) {ranges}; {self.keys_restored} key(s) restored, "
                f"{self.keys_deleted} removed, in {self.seconds:.2f}s")


def undo_can_be_skipped(schema, target_columns, writer_deletes: bool) -> str | None:
    """Why undo cannot matter for this writer, or None. Conservative: only when the writer never
    deletes and every target column's function gives the same result for rows written twice
    (its aggregator class says `replay_idempotent`). This assumes a replay re-sends the same
    rows, as Spark does for a batch replayed from its recorded offsets."""
    if writer_deletes:
        return None
    names = target_columns or schema.names
    functions = [schema.column(n).agg for n in names if n not in schema.primary_key]
    if functions and all(f is not None and aggregator_class(f).replay_idempotent
                         for f in functions):
        return ("every target column is idempotent under replay "
                f"({', '.join(sorted({f.value for f in functions}))}) and the writer never deletes")
    return None


def recover(conn, table: str, lease, target_columns=None, writer_deletes: bool = True,
            skip_idempotent: bool = True) -> RecoveryReport:
    """Undo every change of `lease.owner_id` to `target_columns` of `table` since its last
    commit in the lease's tenure (or the tenure's start): never further back, so nothing
    another owner wrote before this tenure began is touched."""
    started = time.monotonic()
    handle = check_table(conn, table, lease)
    conn.locks.check(lease)
    baselines, source = conn.locks.undo_baselines(lease)
    report = RecoveryReport(table, lease.owner_id, source)
    reason = skip_idempotent and undo_can_be_skipped(handle.meta.descriptor.schema,
                                                     target_columns, writer_deletes)
    if reason:
        report.skipped = reason
        return report
    report.buckets = undo_since(conn, table, lease, baselines, target_columns)
    report.seconds = time.monotonic() - started
    return report


def check_table(conn, table: str, lease):
    """A handle on the table; refused when the table was dropped and re-created since the
    lease was granted. Everything undo reads and writes goes through that handle, so a
    re-creation later on raises TableRecreatedError instead of mixing the two tables."""
    handle = conn.table(table)
    table_id = handle.table_id
    if table_id != lease.table_id:
        raise RecoveryError(
            f"Table {table} was dropped and re-created (table id {lease.table_id} recorded with "
            f"the lock, now {table_id}): its changelog is not the one the baselines refer "
            "to. Nothing was changed; start the job afresh with a new owner id.")
    return handle


def undo_since(conn, table: str, lease, baselines: dict, target_columns=None) -> list[UndoResult]:
    """Undo the owner's columns of every bucket whose changelog goes past its baseline
    (`baselines.get((partition, bucket), 0)`), fencing the owner's earlier task attempts on
    that bucket first. Every bucket is checked before anything changes: a log that no longer
    reaches back to the baseline (retention) or ends before it (a restored backup) is refused."""
    handle = check_table(conn, table, lease)
    todo = []
    # settled ends: a write refused as not acknowledged that stays in a leader's log is
    # resolved (committed, or cut by a new leader) first, so it is undone if it ever counts
    current = conn.admin.list_log_offsets(table, handle.table_id, settle=True)
    for (partition, bucket), (start, end) in sorted(current.items(),
                                                    key=lambda kv: (kv[0][0] or "", kv[0][1])):
        baseline = baselines.get((partition, bucket), 0)  # a partition made since: from 0
        where = f"bucket {bucket}{'' if partition is None else f' of partition {partition}'} of {table}"
        if end < baseline:
            raise RecoveryError(
                f"Cannot undo {where} back to offset {baseline}: its changelog ends at {end}, "
                "before the baseline (the bucket was restored from an older copy, or lost "
                "records). The owner's writes can no longer be told apart. Nothing was changed.")
        if end == baseline:
            continue
        if baseline < start:
            raise RecoveryError(
                f"Cannot undo {where} from offset {baseline}: its changelog now starts at "
                f"{start} (retention removed the records undo needs). Nothing was changed.")
        todo.append((partition, bucket, baseline, end))
    attempts: dict[int, int] = {}
    results = []
    for partition, bucket, baseline, end in todo:
        if bucket not in attempts:
            # A new attempt for the bucket first: any task of the crashed run that still
            # writes is fenced before the undo starts.
            attempts[bucket] = conn.locks.register_attempt(lease, bucket)
        results.append(undo_remote(handle, bucket, baseline, partition=partition, end=end,
                                   target_columns=target_columns, lease=lease,
                                   attempt=attempts[bucket]))
    return results


def acquire(conn, table: str, owner_id: str, columns, ttl: float = 60):
    """`conn.locks.acquire`, taking over expired, unrecovered locks in the way: each one's
    tenure is undone back to its last commit (over its own columns) and then released, so
    that no uncommitted write of an expired tenure survives another owner's takeover."""
    for _ in range(10):
        try:
            return conn.locks.acquire(table, owner_id, columns, ttl=ttl)
        except UnrecoveredLockError:
            pass
        key = list(conn.admin.describe_table(table).descriptor.schema.primary_key)
        for expired in conn.locks.take_over(table, owner_id, columns, ttl=ttl):
            recover(conn, table, expired, key + list(expired.columns), skip_idempotent=False)
            conn.locks.release(expired)
    raise UnrecoveredLockError(
        f"Expired locks on columns {list(columns)} of {table} kept coming back while owner "
        f"'{owner_id}' took them over; try again")

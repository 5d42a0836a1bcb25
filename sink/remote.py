"""Every call the sink makes into the client, the lock service and recovery, in one place.

The sink runs on both sides of Spark: the driver (locks, commits, baselines, recovery) and the
executors (bucket undo and writes). Keeping these calls here means one module to read to know
what the sink needs from the rest of Tally.
"""

from __future__ import annotations

import threading

from merge_engine import MergeMode

_connections: dict[tuple, object] = {}
_connections_lock = threading.Lock()


def connect(url: str, token: str | None, tls=None, timeouts=()):
    """A fresh connection (the driver owns and closes its own); `timeouts`: (tally.connect
    keyword, seconds) pairs of a read's `client.*-timeout` options."""
    from tally import client

    return client.connect(url, token, tls=tls, **dict(timeouts))


def shared_connection(url: str, token: str | None, tls=None, timeouts=()):
    """One connection per Python worker process and cluster, reused by every task it runs
    (Spark reuses Python workers), so a task does not pay for a new connection."""
    key = (url, token, tls, tuple(timeouts))
    with _connections_lock:
        conn = _connections.get(key)
        if conn is None or getattr(conn, "_closed", False):
            conn = connect(url, token, tls, timeouts)
            _connections[key] = conn
        return conn


# --- locks, commits, baselines (driver) -----------------------------------------------------

def acquire(conn, table: str, owner_id: str, columns, ttl: float):
    """Lock the writer's columns. An expired lock of another job in the way is taken over:
    its uncommitted writes are undone first (recovery.acquire), so a new job never builds on
    a crashed job's half-written epoch."""
    import recovery

    return recovery.acquire(conn, table, owner_id, list(columns), ttl=ttl)


def release(conn, lease) -> None:
    conn.locks.release(lease)


def renew(conn, lease):
    """Extend the lease now; LeaseLostError when it expired or another run of the same owner
    re-acquired the lock since."""
    return conn.locks.renew(lease)


def last_commit(conn, table: str, owner_id: str):
    """The owner's last commit, (epoch, offsets, tenure), or None."""
    return conn.locks.last_commit(table, owner_id)


def epoch_baseline(conn, lease, epoch: int) -> dict:
    return conn.locks.epoch_baseline(lease, epoch)


def begin_epoch(conn, lease, epoch: int, buckets, run: int | None = None):
    """One call: a new attempt for each of `buckets` (fencing the owner's earlier attempts on
    them), every bucket's end offsets after that, and the epoch's baseline (stored on the
    first call): `locks.commits.EpochStart`. Refused for an epoch the owner committed, and,
    for a task (`run`: the run its driver began), for a run a rollback aborted."""
    return conn.locks.begin_epoch(lease, epoch, buckets, run=run)


def abort_epoch(conn, lease, epoch: int) -> int:
    """Abort the epoch's run before its rollback: its tasks can no longer begin a bucket."""
    return conn.locks.abort_epoch(lease, epoch)


def commit(conn, lease, epoch: int, offsets: dict) -> bool:
    return conn.locks.commit(lease, epoch, offsets)


def commit_together(conn, commits, epoch: int) -> list[bool]:
    """Commit `epoch` for every (lease, offsets) in one metadata transaction: all or none."""
    return conn.locks.commit_together(commits, epoch)


def recover(conn, table: str, lease, target_columns):
    """Undo everything of the owner since its last commit (or the lock's initial offsets).

    Never skipped for replay-idempotent functions: a replay need not send the same rows (a
    batch job re-run, a non-deterministic source), so the sink always undoes.
    """
    import recovery

    return recovery.recover(conn, table, lease, target_columns, writer_deletes=False,
                            skip_idempotent=False)


def undo_since(conn, table: str, lease, baselines: dict, target_columns) -> list:
    """Undo the owner's columns of every (partition, bucket) past `baselines` (a new attempt
    registered for each such bucket first); every bucket is checked before anything changes."""
    import recovery

    return recovery.undo_since(conn, table, lease, baselines, target_columns)


# --- buckets (executors) --------------------------------------------------------------------

def register_attempt(conn, lease, bucket: int) -> int:
    """Register this task attempt as the owner's only writer of `bucket` (in every partition);
    from then on tablet servers reject the owner's writes to that bucket from any earlier
    attempt, so an executor that lost contact but still runs cannot write after this one's
    undo. Returns the attempt's number, carried by its undo and its writes."""
    return conn.locks.register_attempt(lease, bucket)


def register_attempts(conn, lease, buckets) -> dict:
    """`register_attempt` for several buckets in one call: {bucket: attempt number}."""
    return conn.locks.register_attempts(lease, buckets)


def undo_bucket(table, bucket: int, baseline: int, partition, target_columns, lease, attempt):
    import recovery

    return recovery.undo_remote(table, bucket, baseline, partition=partition,
                                target_columns=target_columns, lease=lease, attempt=attempt)


def bucket_writer(table, bucket: int, target_columns, mode: MergeMode, lease, attempt):
    """The client's bucket-addressed writer: the task's rows are validated, bucketed and
    folded already, so they go to the bucket as they are."""
    return table.bucket_writer(bucket, target_columns, mode, lease=lease, attempt=attempt)

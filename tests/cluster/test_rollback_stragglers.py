"""A failed epoch's rollback against the tasks of the failed job that are still running.

Spark cancels a failed job's tasks without waiting for them, so a task of the failed epoch may
still begin its bucket, or register an attempt and write, while the driver rolls the epoch back
or after it did. Whatever such stragglers do, the epoch must be applied not at all once the
rollback returns, and a re-run of it exactly once.

The writer here is the real epoch protocol (`sink.protocol.WriterRun`) on a real cluster; only
the delivery is the test's own: it writes some buckets as Spark tasks do (each task registers
its own attempt under the run its driver began) and then fails. Stragglers come at three points:

- after the rollback aborted the epoch's run, before it registered its attempts: a task that
  begins its bucket now must be refused (EpochAbortedError) and write nothing;
- right after the rollback registered its attempts: a writer that registers an attempt by
  itself (outside the run's guard, as an older task would) writes and fences the rollback's
  undo; the rollback must register again and undo that write too (up to ROLLBACK_TRIES times);
- after the rollback returned: a task that begins its bucket must be refused.

A plain dict of sums is the reference model.
"""

from __future__ import annotations

import itertools

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pyspark.sql.types import LongType, StructField, StructType

from merge_engine import MergeMode, Schema, TableDescriptor
from sink import protocol, remote
from sink.epoch_errors import EpochFailedError
from sink.options import SinkOptions
from sink.task import write_bucket
from tally.errors import EpochAbortedError

BUCKETS = 4
KEYS = 24
SPARK_SCHEMA = StructType([StructField("k", LongType(), False), StructField("a", LongType())])
_runs = itertools.count()


class TaskFailed(RuntimeError):
    """The failure of the delivered epoch (a task out of retries, in a real job)."""


def make_table(conn, name: str):
    schema = (Schema.builder().column("k", pa.int64()).agg_column("a", pa.int64(), "sum")
              .primary_key("k").build())
    conn.admin.create_table(name, TableDescriptor(schema, bucket_count=BUCKETS, properties={
        "table.merge-engine": "aggregation"}))
    return conn.table(name)


def rows_by_bucket(table, rows: dict[int, int]) -> dict[int, pa.Table]:
    """The epoch's rows (one per key: already folded), split by bucket."""
    split: dict[int, dict[str, list]] = {}
    for k, a in sorted(rows.items()):
        part = split.setdefault(table.bucket_of({"k": k})[1], {"k": [], "a": []})
        part["k"].append(k)
        part["a"].append(a)
    return {b: pa.table({"k": pa.array(p["k"], pa.int64()), "a": pa.array(p["a"], pa.int64())})
            for b, p in split.items()}


def bucket_key(table, bucket: int) -> int:
    return next(k for k in range(1000) if table.bucket_of({"k": k})[1] == bucket)


def stored(table) -> dict[int, int]:
    return {r["k"]: r["a"] for r in table.to_arrow().to_pylist()}


def task_delivery(by_bucket: dict[int, pa.Table], buckets, fail: bool):
    """Each of `buckets` written as a Spark task would (its own attempt, under the run);
    then the epoch fails when `fail`."""
    def deliver(conn, plan, epoch, label):
        reports = [write_bucket(conn, plan, epoch, b, by_bucket.get(b), MergeMode.AGGREGATE,
                                rows=0 if b not in by_bucket else by_bucket[b].num_rows)
                   for b in buckets]
        if fail:
            raise TaskFailed(f"{label}: a task ran out of retries")
        return reports
    return deliver


def straggle(conn, run: protocol.WriterRun, epoch, by_bucket, bucket: int) -> None:
    """A task of the failed run beginning its bucket: it must be refused, writing nothing."""
    with pytest.raises(EpochAbortedError, match="rolled back"):
        write_bucket(conn, run.plan, epoch, bucket, by_bucket.get(bucket), MergeMode.AGGREGATE)


@settings(max_examples=8, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    first=st.dictionaries(st.integers(0, KEYS - 1), st.integers(-50, 50), max_size=KEYS),
    failed=st.dictionaries(st.integers(0, KEYS - 1), st.integers(1, 50), min_size=1,
                           max_size=KEYS),
    written=st.sets(st.integers(0, BUCKETS - 1)),
    begins_after_abort=st.sets(st.integers(0, BUCKETS - 1), max_size=2),
    outruns=st.integers(0, 3),
    begins_after_rollback=st.sets(st.integers(0, BUCKETS - 1), max_size=2),
)
def test_stragglers_of_a_failed_epoch_never_outlive_its_rollback(
        cluster, conn, monkeypatch, first, failed, written, begins_after_abort, outruns,
        begins_after_rollback):
    name = f"default.stragglers{next(_runs)}"
    table = make_table(conn, name)
    options = SinkOptions.parse({}, url=cluster.url, table=name)
    owner = f"job-{name}"
    model: dict[int, int] = {}

    run = protocol.WriterRun.connect(options, None, owner, schema=SPARK_SCHEMA)
    try:
        first_rows = rows_by_bucket(table, first)
        run.write_epoch(0, "epoch 0", task_delivery(first_rows, range(BUCKETS), fail=False))
        for k, a in first.items():
            model[k] = model.get(k, 0) + a
        assert stored(table) == model

        failed_rows = rows_by_bucket(table, failed)
        seen: dict = {}

        def deliver(conn_, plan, epoch, label):
            seen["epoch"] = epoch
            return task_delivery(failed_rows, sorted(written), fail=True)(
                conn_, plan, epoch, label)

        real_register = remote.register_attempts
        real_register_one = run.conn.locks.register_attempt
        left = {"outruns": outruns, "after_abort": True}

        def register_at_rollback_start(conn_, lease, buckets):
            if left["after_abort"]:  # the run is aborted, the rollback has not registered yet
                left["after_abort"] = False
                for b in sorted(begins_after_abort):
                    straggle(conn, run, seen["epoch"], failed_rows, b)
            return real_register(conn_, lease, buckets)

        def register_before_undo(lease, bucket):
            """The undo's own attempt for a bucket, outrun by a writer outside the run's
            guard that registers a newer one and writes before the undo starts."""
            number = real_register_one(lease, bucket)
            if left["outruns"]:
                left["outruns"] -= 1
                attempt = conn.locks.register_attempts(lease, [bucket])[bucket]
                writer = table.bucket_writer(bucket, ["k", "a"], MergeMode.AGGREGATE,
                                             lease=lease, attempt=attempt)
                writer.put(pa.table({"k": pa.array([bucket_key(table, bucket)], pa.int64()),
                                     "a": pa.array([7], pa.int64())}))
            return number

        monkeypatch.setattr(protocol.remote, "register_attempts", register_at_rollback_start)
        monkeypatch.setattr(run.conn.locks, "register_attempt", register_before_undo)
        with pytest.raises(EpochFailedError) as raised:
            run.write_epoch(1, "epoch 1", deliver)
        monkeypatch.undo()
        assert raised.value.rolled_back, str(raised.value)
        assert isinstance(raised.value.__cause__, TaskFailed)
        assert not left["after_abort"]
        # each outrun writes, so the next undo round has that bucket to undo again: all of
        # them happen once the failed epoch wrote anything
        assert left["outruns"] == 0 or not any(b in failed_rows for b in written)
        assert stored(table) == model
        for b in sorted(begins_after_rollback):
            straggle(conn, run, seen["epoch"], failed_rows, b)
        assert stored(table) == model
    finally:
        run.end()

    # The owner's next run writes the same epoch again: applied exactly once.
    again = protocol.WriterRun.connect(options, None, owner, schema=SPARK_SCHEMA)
    try:
        again.write_epoch(1, "epoch 1", task_delivery(rows_by_bucket(table, failed),
                                                      range(BUCKETS), fail=False))
    finally:
        again.end()
    for k, a in failed.items():
        model[k] = model.get(k, 0) + a
    assert stored(table) == model
    assert conn.locks.describe(name) == []

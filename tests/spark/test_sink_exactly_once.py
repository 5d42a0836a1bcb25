"""In-process exactly-once tests on the shared SparkSession: injected task failures, two
concurrent streaming jobs on disjoint columns plus a third overlapping one, a batch job whose
tasks run out of retries (rolled back), then dies without rollback and is re-run with the same
owner id, and the lock lifecycle of a clean stop."""

from __future__ import annotations

import os
import time

import pytest

from sink import TallySink
from sink.epoch_errors import EpochFailedError
from sink.protocol import WriterRun
from tests.spark import sink_data
from tests.spark.test_kill_restart import run_job

FAIL_FIRST = "tests.spark.hooks:fail_first_attempt"


def stream(spark, source):
    return (spark.readStream.schema(sink_data.SCHEMA_DDL).option("maxFilesPerTrigger", 1)
            .json(source))


def wait_for_locks(conn, table, count, timeout=120.0):
    deadline = time.monotonic() + timeout
    while True:
        locks = conn.locks.describe(table)
        if len(locks) == count or time.monotonic() > deadline:
            return locks
        time.sleep(0.2)


def test_injected_task_failures_are_applied_once(spark, cluster, conn, tmp_path, table_name):
    sink_data.create_table(conn, table_name)
    files = sink_data.write_source_files(str(tmp_path / "src"), 3, 40, 12, seed=5)
    # task retries: the task delivery (the driver delivery has no retries; a failure rolls
    # its epoch back and stops the query, test_driver_delivery)
    sink = TallySink(cluster.url, table_name, fail_hook=FAIL_FIRST, options={"delivery": "tasks"})
    query = sink.start(stream(spark, str(tmp_path / "src")), str(tmp_path / "ckpt"),
                       trigger={"availableNow": True})
    query.awaitTermination()
    assert query.exception() is None
    rows = [r for f in files for r in f]
    assert sink_data.table_state(conn, table_name) == sink_data.expected(rows)
    # a clean stop between batches releases the lock
    assert wait_for_locks(conn, table_name, 0) == []


def test_concurrent_jobs_on_disjoint_columns_and_an_overlapping_one(
        spark, cluster, conn, tmp_path, table_name):
    sink_data.create_table(conn, table_name)
    files = sink_data.write_source_files(str(tmp_path / "src"), 4, 40, 12, seed=7)
    rows = [r for f in files for r in f]
    one = TallySink(cluster.url, table_name, target_columns=["v", "s"])
    two = TallySink(cluster.url, table_name, target_columns=["c", "a", "l"])
    source = stream(spark, str(tmp_path / "src"))
    q1 = one.start(source.select("k", "v", "s"), str(tmp_path / "ck1"),
                   trigger={"processingTime": "200 milliseconds"})
    q2 = two.start(source.select("k", "c", "a", "l"), str(tmp_path / "ck2"),
                   trigger={"processingTime": "200 milliseconds"})
    try:
        assert len(wait_for_locks(conn, table_name, 2, timeout=300)) == 2
        # a third job overlapping column 's' fails fast with the lock conflict
        spec = {"url": cluster.url, "table": table_name, "source": str(tmp_path / "src"),
                "checkpoint": str(tmp_path / "ck3"), "schema": sink_data.SCHEMA_DDL,
                "columns": ["s", "l"], "select": ["k", "s", "l"], "options": {}}
        third = run_job(spec)
        assert third.returncode == 2, third.stderr[-2000:]
        # refused at once by the live locks (not after waiting for them): the conflict names
        # the holder and when its lock would expire
        assert "locked by owner 'spark-query:" in third.stderr
        assert "s from now)" in third.stderr
        for q in (q1, q2):
            q.processAllAvailable()
    finally:
        q1.stop()
        q2.stop()
    state = sink_data.table_state(conn, table_name)
    assert sink_data.project(state, ("v", "s")) == sink_data.project(
        sink_data.expected(rows, ("v", "s")), ("v", "s"))
    assert sink_data.project(state, ("c", "a", "l")) == sink_data.project(
        sink_data.expected(rows, ("c", "a", "l")), ("c", "a", "l"))
    assert wait_for_locks(conn, table_name, 0) == []


def test_failed_batch_job_applies_nothing_and_a_dead_drivers_rerun_repairs_it(
        spark, cluster, conn, table_name, monkeypatch):
    sink_data.create_table(conn, table_name)
    rows = sink_data.make_rows(200, 20, seed=3)
    df = spark.createDataFrame(rows, sink_data.SCHEMA_DDL)
    options = {"client.column-lock.owner-id": "nightly-rollup-2024-05-17",
               "client.column-lock.ttl": "20"}
    crashing = TallySink(cluster.url, table_name, options=options,
                         fail_hook="tests.spark.hooks:fail_always")
    # tasks out of retries while the driver lives: rolled back, nothing applied, lock released
    with pytest.raises(EpochFailedError, match="injected failure") as raised:
        crashing.write(df)
    assert raised.value.rolled_back and "nothing of it was applied" in str(raised.value)
    assert conn.table(table_name).to_arrow().num_rows == 0
    assert conn.locks.describe(table_name) == []
    # a driver that dies before it can roll back leaves the epoch half-written and its lock
    monkeypatch.setattr(WriterRun, "_roll_back",
                        lambda self, epoch, baseline, label, failure, members=():
                        SystemExit("died"))
    with pytest.raises(SystemExit):
        crashing.write(df)
    monkeypatch.undo()
    assert conn.table(table_name).to_arrow().num_rows > 0  # half-written before the failure
    assert [lock["owner_id"] for lock in conn.locks.describe(table_name)] == \
        [options["client.column-lock.owner-id"]]
    # the re-run under the same owner id undoes it, then writes everything once
    result = TallySink(cluster.url, table_name, options=options).write(df)
    assert not result.skipped
    assert sink_data.table_state(conn, table_name) == sink_data.expected(rows)
    assert conn.locks.describe(table_name) == []  # a successful batch job releases its lock
    # the same epoch again is skipped: batch writes with an explicit epoch are idempotent
    again = TallySink(cluster.url, table_name, options={**options, "epoch": str(result.epoch)})
    assert again.write(df).skipped
    assert sink_data.table_state(conn, table_name) == sink_data.expected(rows)


def test_restart_after_another_owner_wrote_the_columns_keeps_both_owners_data(
        spark, cluster, conn, tmp_path, table_name):
    """A query stops cleanly (its lock is released); another owner locks the same column, adds
    100 to five keys, commits and releases; the query restarts from its checkpoint. Its
    recovery must not undo the other owner's writes: they belong to another lock tenure."""
    sink_data.create_table(conn, table_name)
    staging, source = tmp_path / "staging", tmp_path / "src"
    files = sink_data.write_source_files(str(staging), 4, 30, 10, seed=13)
    source.mkdir()

    def publish(*numbers):
        for n in numbers:
            os.rename(staging / f"part-{n:04d}.json", source / f"part-{n:04d}.json")

    publish(0, 1)
    sink_ = TallySink(cluster.url, table_name, target_columns=["v"],
                      options={"client.column-lock.ttl": "60"})
    frame = stream(spark, str(source)).select("k", "v")
    query = sink_.start(frame, str(tmp_path / "ckpt"), trigger={"availableNow": True})
    query.awaitTermination()
    assert query.exception() is None
    assert wait_for_locks(conn, table_name, 0, timeout=60) == []
    lease = conn.locks.acquire(table_name, "backfill-v", ["v"], ttl=30)
    writer = conn.table(table_name).upsert_writer(["k", "v"], lease=lease)
    writer.upsert([{"k": k, "v": 100} for k in range(5)])
    writer.flush()
    writer.close()
    conn.locks.commit(lease, 0, conn.table(table_name).list_offsets())
    conn.locks.release(lease)
    publish(2, 3)
    query = sink_.start(frame, str(tmp_path / "ckpt"), trigger={"availableNow": True})
    query.awaitTermination()
    assert query.exception() is None
    wanted = sink_data.project(sink_data.expected([r for f in files for r in f], ("v",)), ("v",))
    for k in range(5):
        row = wanted.setdefault(k, {"k": k, "v": None})
        row["v"] = 100 + (row["v"] or 0)
    assert sink_data.project(sink_data.table_state(conn, table_name), ("v",)) == wanted
    assert wait_for_locks(conn, table_name, 0, timeout=60) == []

"""Column locks through a real cluster: conflicts, fencing of zombies, restarts, concurrency."""

from __future__ import annotations

import json
import threading
import time

import pyarrow as pa
import pytest

import recovery
from locks import Lease
from merge_engine import Schema, TableDescriptor
from tally.errors import (ColumnLockConflict, EpochAbortedError, InvalidInputError,
                          LeaseLostError, UnrecoveredLockError)
from tests.conftest import zookeeper_chroot
from tests.waiting import wait_until
from tests.zookeeper_server import running_zookeeper


def make_table(conn, name, buckets=2, **props):
    schema = (Schema.builder().column("k", pa.int64()).agg_column("a", pa.int64(), "sum")
              .agg_column("b", pa.int64(), "sum").agg_column("c", pa.string(), "string_agg")
              .primary_key("k").build())
    conn.admin.create_table(name, TableDescriptor(schema, bucket_count=buckets, properties={
        "table.merge-engine": "aggregation", **props}))
    return conn.table(name)


def unkept_lease(conn, table, owner, columns, ttl):
    """A lease whose owner never renews it: a paused (or partitioned) job."""
    return Lease.from_json(conn.coordinator_action("lock_acquire", {
        "table": table, "owner_id": owner, "columns": columns, "ttl": ttl}))


def rows(table):
    return {r["k"]: r for r in table.to_arrow().to_pylist()}


def test_conflict_names_the_holder_and_disjoint_locks_coexist(conn, table_name):
    make_table(conn, table_name)
    a = conn.locks.acquire(table_name, "job-a", ["k", "a", "c"], ttl=30)
    assert a.columns == ("a", "c") and set(a.initial_offsets) == {(None, 0), (None, 1)}
    with pytest.raises(ColumnLockConflict, match="locked by owner 'job-a'"):
        conn.locks.acquire(table_name, "job-x", ["c"], ttl=30)
    b = conn.locks.acquire(table_name, "job-b", ["b"], ttl=30)
    assert [d["owner_id"] for d in conn.locks.describe(table_name)] == ["job-a", "job-b"]
    conn.locks.release(a)
    conn.locks.release(b)
    assert conn.locks.describe(table_name) == []


def test_writes_to_locked_columns_need_the_lease(conn, table_name):
    table = make_table(conn, table_name)
    lease = conn.locks.acquire(table_name, "owner", ["a"], ttl=30)
    with table.upsert_writer(target_columns=["k", "b"]) as free:  # unlocked column: free
        free.upsert([{"k": 1, "b": 5}])
    intruder = table.upsert_writer(target_columns=["k", "a"])
    intruder.upsert([{"k": 1, "a": 100}])
    with pytest.raises(ColumnLockConflict, match="locked by owner 'owner'"):
        intruder.flush()
    full = table.upsert_writer()  # a full-row write touches every column
    full.upsert([{"k": 2, "a": 1, "b": 1, "c": "x"}])
    with pytest.raises(ColumnLockConflict):
        full.flush()
    with table.upsert_writer(target_columns=["k", "a"], lease=lease) as owner:
        owner.upsert([{"k": 1, "a": 7}])
    assert rows(table) == {1: {"k": 1, "a": 7, "b": 5, "c": None}}
    conn.locks.release(lease)


def test_zombie_is_fenced_after_expiry_and_takeover(conn, table_name):
    table = make_table(conn, table_name)
    zombie = unkept_lease(conn, table_name, "A", ["a"], ttl=5)  # first write in time, even loaded
    a_writer = table.upsert_writer(target_columns=["k", "a"], lease=zombie)
    a_writer.upsert([{"k": 1, "a": 1}])
    a_writer.flush()
    wait_until_expired(conn, table_name, "A")  # A pauses past its ttl
    a_writer.upsert([{"k": 1, "a": 1000}])
    with pytest.raises(LeaseLostError, match="expired"):
        a_writer.flush()
    with pytest.raises(UnrecoveredLockError, match="expired lock of owner 'A'"):
        conn.locks.acquire(table_name, "B", ["a"], ttl=30)
    # Taking over undoes A's uncommitted write first (it was never committed).
    b = recovery.acquire(conn, table_name, "B", ["a"], ttl=30)
    assert b.token > zombie.token and sum(b.initial_offsets.values()) == 2  # +I, then its undo: -D
    with table.upsert_writer(target_columns=["k", "a"], lease=b) as bw:
        bw.upsert([{"k": 1, "a": 10}, {"k": 2, "a": 20}])
    for _ in range(3):  # A resumes: every write is rejected
        a_writer.upsert([{"k": 2, "a": 5000}])
        with pytest.raises((LeaseLostError, ColumnLockConflict)):
            a_writer.flush()
    assert {k: r["a"] for k, r in rows(table).items()} == {1: 10, 2: 20}
    conn.locks.release(b)


def test_reacquire_fences_the_previous_incarnation(conn, table_name):
    table = make_table(conn, table_name)
    old = unkept_lease(conn, table_name, "job", ["a"], ttl=30)
    old_writer = table.upsert_writer(target_columns=["k", "a"], lease=old)
    new = conn.locks.acquire(table_name, "job", ["a"], ttl=30)
    assert new.initial_offsets == old.initial_offsets and new.token > old.token
    old_writer.upsert([{"k": 1, "a": 1}])
    with pytest.raises(LeaseLostError, match="fenced|superseded|no longer held"):
        old_writer.flush()
    with pytest.raises(LeaseLostError, match="superseded"):
        conn.locks.renew(old)
    assert conn.locks.release(old) is False
    conn.locks.release(new)


def test_lost_lease_fails_the_next_write_with_a_clear_error(conn, table_name):
    table = make_table(conn, table_name)
    # A ttl long enough that the lease cannot expire before the re-acquire on a loaded
    # machine; its keeper renews every 2 s and is then told the lease was superseded.
    lease = conn.locks.acquire(table_name, "short", ["a"], ttl=6)
    writer = table.upsert_writer(target_columns=["k", "a"], lease=lease)
    unkept_lease(conn, table_name, "short", ["a"], ttl=30)  # the owner re-acquired elsewhere

    def lost() -> bool:
        try:
            conn.locks.check(lease)
        except LeaseLostError:
            return True
        return False

    wait_until(lost, "the keeper's renewal finding the lease superseded")
    with pytest.raises(LeaseLostError, match="superseded"):
        writer.upsert([{"k": 1, "a": 1}])


def test_disjoint_partial_writers_under_locks_concurrently(conn, table_name):
    table = make_table(conn, table_name, buckets=4)
    expected = {}
    def job(owner, column, values):
        lease = conn.locks.acquire(table_name, owner, [column], ttl=30)
        with table.upsert_writer(target_columns=["k", column], lease=lease) as w:
            for start in range(0, len(values), 50):
                w.upsert([{"k": k, column: v} for k, v in values[start:start + 50]])
        conn.locks.release(lease)
    inputs = {col: [(i % 37, i * (n + 1)) for i in range(400)] for n, col in enumerate(["a", "b"])}
    for col, values in inputs.items():
        for k, v in values:
            expected.setdefault(k, {"k": k, "a": None, "b": None, "c": None})
            expected[k][col] = (expected[k][col] or 0) + v
    threads = [threading.Thread(target=job, args=(f"job-{c}", c, v)) for c, v in inputs.items()]
    [t.start() for t in threads]
    [t.join() for t in threads]
    assert rows(table) == expected


def test_locks_survive_a_coordinator_restart(cluster, table_name):
    from tally import client

    with client.connect(cluster.url) as conn:
        make_table(conn, table_name)
        lease = unkept_lease(conn, table_name, "survivor", ["a"], ttl=60)
    cluster.restart_coordinator(kill=True)
    with client.connect(cluster.url, retry_timeout=60) as conn:
        described = conn.locks.describe(table_name)
        assert [(d["owner_id"], d["token"]) for d in described] == [("survivor", lease.token)]
        renewed = conn.locks.renew(lease)
        assert renewed.token == lease.token and renewed.initial_offsets == lease.initial_offsets
        with conn.table(table_name).upsert_writer(target_columns=["k", "a"], lease=lease) as w:
            w.upsert([{"k": 1, "a": 1}])
        conn.locks.release(lease)


def test_column_locks_off_means_writes_are_never_checked(conn, table_name):
    table = make_table(conn, table_name, **{"table.column-lock.enabled": "false"})
    conn.locks.acquire(table_name, "holder", ["a"], ttl=30)
    with table.upsert_writer(target_columns=["k", "a"]) as w:
        w.upsert([{"k": 1, "a": 1}])
    assert rows(table)[1]["a"] == 1


def test_locks_survive_a_zookeeper_restart(cluster, table_name, tmp_path):
    """A private ZooKeeper and cluster: the run's shared ZooKeeper serves other tests meanwhile."""
    if cluster.store_kind != "zookeeper":
        pytest.skip("the embedded store has no ZooKeeper to restart")
    from tally import client
    from tally.server import LocalCluster

    with running_zookeeper(str(tmp_path / "zookeeper")) as zk, \
            LocalCluster(str(tmp_path / "cluster"), tablet_servers=1,
                         zookeeper=zookeeper_chroot(zk)) as private, \
            client.connect(private.url, retry_timeout=60) as conn:
        make_table(conn, table_name)
        lease = conn.locks.acquire(table_name, "zk-survivor", ["a"], ttl=20)
        zk.stop()
        time.sleep(1.0)  # an outage of a second, shorter than the lease and the session
        zk.start()
        renewed = conn.locks.renew(lease)
        assert renewed.token == lease.token and renewed.initial_offsets == lease.initial_offsets
        described = conn.locks.describe(table_name)
        assert [(d["owner_id"], d["token"]) for d in described] == [("zk-survivor", lease.token)]
        with conn.table(table_name).upsert_writer(target_columns=["k", "a"], lease=lease) as w:
            w.upsert([{"k": 1, "a": 1}])
        conn.locks.release(lease)


def test_tally_locks_prints_owner_columns_token_and_offsets(cluster, conn, table_name, capsys):
    from tally.cli.main import main

    make_table(conn, table_name)
    lease = conn.locks.acquire(table_name, "spark-query-1/default.t/a", ["a"], ttl=30)
    assert main(["locks", table_name, "--url", cluster.url, "--format", "json"]) == 0
    printed = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(p["owner"], p["columns"], p["token"], p["initial_offsets"]) for p in printed] == \
        [("spark-query-1/default.t/a", "a", lease.token, "0:0 1:0")]
    assert main(["locks", table_name, "--url", cluster.url]) == 0  # the table for people
    assert "spark-query-1/default.t/a" in capsys.readouterr().out
    conn.locks.release(lease)
    assert main(["locks", table_name, "--url", cluster.url]) == 0
    assert "no column locks" in capsys.readouterr().out


def test_task_attempts_fence_earlier_attempts_of_the_same_bucket(conn, table_name):
    table = make_table(conn, table_name, buckets=2)
    lease = conn.locks.acquire(table_name, "spark", ["a"], ttl=30)
    key0 = next(k for k in range(100) if table.bucket_of({"k": k})[1] == 0)
    key1 = next(k for k in range(100) if table.bucket_of({"k": k})[1] == 1)
    first = conn.locks.register_attempt(lease, 0)
    old = table.upsert_writer(target_columns=["k", "a"], lease=lease, attempt=first)
    old.upsert([{"k": key0, "a": 1}])
    old.flush()
    second = conn.locks.register_attempt(lease, 0)  # the task was retried
    assert second > first
    old.upsert([{"k": key0, "a": 100}])
    with pytest.raises(LeaseLostError, match=f"attempt {first}, and attempt {second}"):
        old.flush()
    unnumbered = table.upsert_writer(target_columns=["k", "a"], lease=lease)
    unnumbered.upsert([{"k": key0, "a": 100}])
    with pytest.raises(LeaseLostError, match="attempt None"):
        unnumbered.flush()
    with table.upsert_writer(target_columns=["k", "a"], lease=lease) as other_bucket:
        other_bucket.upsert([{"k": key1, "a": 5}])  # bucket 1 registered no attempt: free
    again = conn.locks.acquire(table_name, "spark", ["a"], ttl=30)  # a restarted job
    assert conn.locks.register_attempt(again, 0) == second + 1  # attempt numbers only grow
    with table.upsert_writer(target_columns=["k", "a"], lease=again, attempt=second + 1) as new:
        new.upsert([{"k": key0, "a": 10}])
    assert {r["k"]: r["a"] for r in table.to_arrow().to_pylist()} == {key0: 11, key1: 5}
    conn.locks.release(again)


def test_an_aborted_run_of_an_epoch_refuses_its_tasks(conn, table_name):
    """A rollback aborts the epoch's run before it fences and undoes: a task of that run that
    asks to begin its bucket afterwards is refused and registers nothing. The next run of the
    epoch (its driver begins again) is accepted, and a new tenure starts the runs afresh."""
    table = make_table(conn, table_name, buckets=2)
    lease = conn.locks.acquire(table_name, "spark", ["a"], ttl=30)
    driver = conn.locks.begin_epoch(lease, 1, [0, 1])
    assert driver.run == 0
    task = conn.locks.begin_epoch(lease, 1, [0], run=driver.run)
    assert task.run == 0 and task.attempts[0] == driver.attempts[0] + 1
    assert conn.locks.abort_epoch(lease, 1) == 1
    with pytest.raises(EpochAbortedError, match="rolled back"):
        conn.locks.begin_epoch(lease, 1, [1], run=driver.run)
    # the refused task registered nothing: the next attempt of bucket 1 follows the driver's
    assert conn.locks.register_attempts(lease, [1]) == {1: driver.attempts[1] + 1}
    again = conn.locks.begin_epoch(lease, 1, [0, 1])
    assert again.run == 1 and again.baseline == driver.baseline
    assert conn.locks.begin_epoch(lease, 1, [1], run=1).attempts[1] == driver.attempts[1] + 3
    assert conn.locks.abort_epoch(lease, 7) == 0  # never begun: nothing to abort
    conn.locks.begin_epoch(lease, 7, [0])  # ... and its run is still 0
    assert conn.locks.begin_epoch(lease, 7, [0], run=0).run == 0
    with pytest.raises(InvalidInputError, match="run"):
        conn.coordinator_action("epoch_begin", {"lease": lease.to_json(), "epoch": 1,
                                                "buckets": [0], "run": -1})
    conn.locks.release(lease)
    fresh = conn.locks.acquire(table_name, "spark", ["a"], ttl=30)
    assert conn.locks.begin_epoch(fresh, 1, [0, 1]).run == 0  # a new tenure: a new baseline
    with pytest.raises(EpochAbortedError):
        conn.locks.begin_epoch(fresh, 1, [0], run=1)  # the old tenure's run
    assert table.to_arrow().num_rows == 0
    conn.locks.release(fresh)


def test_beginning_an_epoch_fences_earlier_attempts_and_keeps_the_first_baseline(conn,
                                                                                 table_name):
    """begin_epoch: one call registers a new attempt per bucket (an earlier attempt's writes
    are refused from then on), returns end offsets read after that fencing, and stores the
    baseline once: a second begin of the same epoch (a retried task, a replay) gets the first
    baseline back. A committed epoch cannot be begun again."""
    table = make_table(conn, table_name, buckets=2)
    lease = conn.locks.acquire(table_name, "spark", ["a"], ttl=30)
    key0 = next(k for k in range(100) if table.bucket_of({"k": k})[1] == 0)
    first = conn.locks.begin_epoch(lease, 1, [0, 1])
    assert first.baseline == first.offsets and set(first.attempts) == {0, 1}
    old = table.upsert_writer(target_columns=["k", "a"], lease=lease, attempt=first.attempts[0])
    old.upsert([{"k": key0, "a": 1}])
    old.flush()
    retried = conn.locks.begin_epoch(lease, 1, [0])  # the bucket's task, retried
    assert retried.baseline == first.baseline and retried.attempts[0] > first.attempts[0]
    assert sum(retried.offsets.values()) == sum(first.offsets.values()) + 1
    old.upsert([{"k": key0, "a": 100}])
    with pytest.raises(LeaseLostError, match="attempt"):
        old.flush()
    assert conn.locks.commit(lease, 1, retried.offsets)
    with pytest.raises(LeaseLostError, match="committed already"):
        conn.locks.begin_epoch(lease, 1, [0])
    assert conn.locks.begin_epoch(lease, 2, [0, 1]).baseline == retried.offsets
    assert conn.locks.register_attempts(lease, [0, 1]) == {
        0: retried.attempts[0] + 2, 1: first.attempts[1] + 2}
    assert {r["k"]: r["a"] for r in table.to_arrow().to_pylist()} == {key0: 1}
    conn.locks.release(lease)


def wait_until_expired(conn, table, owner, deadline=60.0):
    """Poll the coordinator (no fixed sleep) until `owner`'s lock on `table` has expired."""
    def expired() -> bool:
        locks = {d["owner_id"]: d for d in conn.locks.describe(table, include_expired=True)}
        return bool(locks.get(owner, {}).get("expired"))

    wait_until(expired, f"the lock of {owner} on {table} expiring", deadline=deadline)


def test_expired_lock_refuses_lease_less_writes_until_discarded(cluster, conn, table_name, capsys):
    from tally.cli.main import main

    table = make_table(conn, table_name)
    lease = unkept_lease(conn, table_name, "gone", ["a"], ttl=60)
    with table.upsert_writer(target_columns=["k", "a"], lease=lease) as w:
        w.upsert([{"k": 1, "a": 5}])
    unkept_lease(conn, table_name, "gone", ["a"], ttl=0.2)  # it dies: its lock lapses soon
    wait_until_expired(conn, table_name, "gone")
    writer = table.upsert_writer(target_columns=["k", "a"])
    writer.upsert([{"k": 1, "a": 1000}])
    with pytest.raises(UnrecoveredLockError, match="expired lock of owner 'gone'"):
        writer.flush()
    assert main(["locks", table_name, "--url", cluster.url]) == 0
    assert "EXPIRED (unrecovered)" in capsys.readouterr().out
    assert main(["locks", table_name, "--url", cluster.url, "--discard", "gone"]) == 0
    assert "discarded the expired lock of 'gone'" in capsys.readouterr().out
    with table.upsert_writer(target_columns=["k", "a"]) as w:  # the operator kept its write
        w.upsert([{"k": 1, "a": 1}])
    assert rows(table)[1]["a"] == 6

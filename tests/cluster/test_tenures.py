"""Lock tenures on a real cluster: the failure stories of the exactly-once issue, one by one.

Each test tells one story an operator met: another owner's committed data, a lease-less write
into an expired lock, retention while a job is down, a bucket restored from an older copy. The
model-based test (test_owner_model) explores the same rules at random; these pin the stories.
"""

from __future__ import annotations

import pyarrow as pa
import pytest

import recovery
from locks import Lease
from merge_engine import Schema, TableDescriptor
from tally.errors import RecoveryError, UnrecoveredLockError
from tally.wire.channel import FlightChannel
from tests.cluster.test_locks import wait_until_expired


def make_table(conn, name, **props):
    schema = (Schema.builder().column("k", pa.int64()).agg_column("a", pa.int64(), "sum")
              .agg_column("b", pa.int64(), "sum").primary_key("k").build())
    conn.admin.create_table(name, TableDescriptor(schema, bucket_count=2, properties={
        "table.merge-engine": "aggregation", **props}))
    return conn.table(name)


def silent_lease(conn, table, owner, columns, ttl):
    """A lease nobody renews: its owner crashed."""
    return Lease.from_json(conn.coordinator_action("lock_acquire", {
        "table": table, "owner_id": owner, "columns": columns, "ttl": ttl}))


def crash(conn, table, owner, columns=("a",)):
    """The owner dies: its lock (same tenure) is left with a short ttl, and the test waits
    until it has expired. Writes before this used a long ttl, so a busy machine cannot make
    them late."""
    silent_lease(conn, table, owner, list(columns), ttl=0.2)
    wait_until_expired(conn, table, owner)


def add(table, lease, rows, columns=("a",)):
    with table.upsert_writer(target_columns=["k", *columns], lease=lease) as w:
        w.upsert(rows)


def values(table, column="a"):
    return {r["k"]: r[column] for r in table.to_arrow().to_pylist()}


def restart(conn, table_name, owner, columns=("a",)):
    """What a restarted job does: acquire (taking over what is in the way) and recover."""
    lease = recovery.acquire(conn, table_name, owner, list(columns), ttl=30)
    report = recovery.recover(conn, table_name, lease, ["k", *columns], skip_idempotent=False)
    return lease, report


def test_another_owners_committed_data_survives_a_restart(conn, table_name):
    table = make_table(conn, table_name)
    a = conn.locks.acquire(table_name, "A", ["a"], ttl=30)
    add(table, a, [{"k": 1, "a": 1}, {"k": 2, "a": 2}])
    conn.locks.commit(a, 0, conn.admin.list_offsets(table_name))
    conn.locks.release(a)
    b = conn.locks.acquire(table_name, "B", ["a"], ttl=30)  # e.g. a backfill job
    add(table, b, [{"k": 1, "a": 100}, {"k": 3, "a": 100}])
    conn.locks.commit(b, 0, conn.admin.list_offsets(table_name))
    conn.locks.release(b)
    a, report = restart(conn, table_name, "A")  # A runs again: a new tenure
    assert (report.keys_restored + report.keys_deleted) == 0 and f"tenure {a.tenure}" in report.baseline_source
    assert values(table) == {1: 101, 2: 2, 3: 100}
    conn.locks.release(a)


def test_a_takeover_undoes_the_expired_tenure_and_its_owner_replays_once(conn, table_name):
    table = make_table(conn, table_name)
    a = conn.locks.acquire(table_name, "A", ["a"], ttl=30)
    add(table, a, [{"k": 1, "a": 1}])
    conn.locks.commit(a, 0, conn.admin.list_offsets(table_name))
    conn.locks.release(a)
    crashed = silent_lease(conn, table_name, "A", ["a"], ttl=60)
    add(table, crashed, [{"k": 1, "a": 10}])           # epoch 1, half written, then a crash
    crash(conn, table_name, "A")
    b, _ = restart(conn, table_name, "B")              # B takes the column over
    assert values(table) == {1: 1}                     # A's uncommitted half is gone
    add(table, b, [{"k": 1, "a": 100}])
    conn.locks.commit(b, 0, conn.admin.list_offsets(table_name))
    conn.locks.release(b)
    a, report = restart(conn, table_name, "A")         # A restarts: nothing of B's is undone
    assert (report.keys_restored + report.keys_deleted) == 0
    assert conn.locks.last_commit(table_name, "A").epoch == 0
    add(table, a, [{"k": 1, "a": 10}, {"k": 1, "a": 20}])  # epoch 1 replayed whole
    conn.locks.commit(a, 1, conn.admin.list_offsets(table_name))
    assert values(table) == {1: 1 + 100 + 30}
    conn.locks.release(a)


def test_retention_keeps_an_expired_tenure_until_its_hold_ends(cluster, conn, table_name):
    table = make_table(conn, table_name, **{"table.log.retention.offsets": "0",
                                            "table.log.retention.expired-lock-ms": "3600000"})
    crashed = silent_lease(conn, table_name, "job", ["a"], ttl=60)
    add(table, crashed, [{"k": k, "a": 1} for k in range(8)])
    add(table, None, [{"k": k, "b": 5} for k in range(8)], columns=("b",))
    crash(conn, table_name, "job")
    for handle in cluster.tablet_servers:  # a retention pass while the job is down
        FlightChannel(handle.address).action("enforce_retention", {})
    assert all(start == 0 for start, _ in conn.admin.list_log_offsets(table_name).values())
    lease, report = restart(conn, table_name, "job")
    assert (report.keys_restored + report.keys_deleted) == 8
    assert values(table) == {k: None for k in range(8)} and set(values(table, "b").values()) == {5}
    conn.locks.release(lease)


def test_an_expired_tenure_past_its_hold_is_refused_until_discarded(cluster, conn, table_name):
    table = make_table(conn, table_name, **{"table.log.retention.offsets": "0",
                                            "table.log.retention.expired-lock-ms": "1"})
    crashed = silent_lease(conn, table_name, "job", ["a"], ttl=60)
    add(table, crashed, [{"k": 1, "a": 7}])
    crash(conn, table_name, "job")
    for handle in cluster.tablet_servers:
        FlightChannel(handle.address).action("enforce_retention", {})
    before = values(table)
    with pytest.raises(RecoveryError, match="expired-lock-ms.*Nothing was changed"):
        restart(conn, table_name, "job")
    with pytest.raises(RecoveryError, match="expired-lock-ms"):
        restart(conn, table_name, "other")
    with pytest.raises(UnrecoveredLockError):
        add(table, None, [{"k": 1, "a": 1}])
    assert values(table) == before
    assert conn.locks.discard(table_name, "job")
    lease, _ = restart(conn, table_name, "job")       # a new tenure: the write stays
    assert values(table) == {1: 7}
    conn.locks.release(lease)


def test_recover_refuses_a_log_that_ends_before_its_baseline(conn, table_name):
    table = make_table(conn, table_name)
    lease = conn.locks.acquire(table_name, "job", ["a"], ttl=30)
    add(table, lease, [{"k": k, "a": 1} for k in range(4)])
    ahead = {key: end + 5 for key, end in conn.admin.list_offsets(table_name).items()}
    conn.locks.commit(lease, 0, ahead)  # as if the buckets were restored from an older copy
    with pytest.raises(RecoveryError, match="ends at .* before the baseline.*Nothing was changed"):
        recovery.recover(conn, table_name, lease, ["k", "a"], skip_idempotent=False)
    assert values(table) == {k: 1 for k in range(4)}
    conn.locks.release(lease)

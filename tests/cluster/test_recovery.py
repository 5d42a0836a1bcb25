"""Undo recovery on a real cluster: partial and full-row owners, new partitions, crashes
during undo, and the refusals."""

from __future__ import annotations

import os
import random
import subprocess
import sys
import time

import pyarrow as pa
import pytest

from merge_engine import Schema, TableDescriptor
from recovery import recover, undo_remote
from tally.errors import InvalidInputError, RecoveryError

A = ["a_sum", "a_list"]
B = ["b_sum"]


def make_table(conn, name, partitioned, buckets=4):
    builder = (Schema.builder().column("k", pa.int64()).column("p", pa.string())
               .agg_column("a_sum", pa.int64(), "sum").agg_column("a_list", pa.list_(pa.int64()), "array_agg")
               .agg_column("b_sum", pa.int64(), "sum").primary_key("k", "p"))
    if partitioned:
        builder.partition_key("p")
    conn.admin.create_table(name, TableDescriptor(builder.build(), bucket_count=buckets, properties={
        "table.merge-engine": "aggregation", "table.delete.behavior": "allow"}))
    return conn.table(name)


def write(table, lease, columns, rows):
    with table.upsert_writer(target_columns=["k", "p", *columns], lease=lease) as w:
        w.upsert([{"k": k, "p": p, **{c: v for c in columns}} for k, p, v in rows])


def snapshot(table):
    return {(r["k"], r["p"]): r for r in table.to_arrow().to_pylist()}


def rows_for(seed, n, partitions):
    rnd = random.Random(seed)
    return [(rnd.randrange(60), rnd.choice(partitions), rnd.randrange(-5, 50)) for _ in range(n)]


def expected_after_undo(at_baseline, now):
    """A's columns as at the baseline, B's columns as now; rows that exist only for A go."""
    out = {}
    for key in set(at_baseline) | set(now):
        base, cur = at_baseline.get(key), now.get(key)
        row = {"k": key[0], "p": key[1]}
        row.update({c: base[c] if base else None for c in A})
        row["b_sum"] = cur["b_sum"] if cur else None
        if base is None and row["b_sum"] is None:
            continue
        out[key] = row
    return out


@pytest.mark.parametrize("partitioned", [False, True], ids=["plain", "partitioned"])
def test_partial_owner_is_undone_and_the_other_writer_kept(conn, table_name, partitioned):
    parts = ["x", "y"] if partitioned else ["x"]
    table = make_table(conn, table_name, partitioned)
    la = conn.locks.acquire(table_name, "A", A, ttl=30)
    lb = conn.locks.acquire(table_name, "B", B, ttl=30)
    write(table, la, A, rows_for(1, 200, parts))
    write(table, lb, B, rows_for(2, 200, parts))
    assert conn.locks.commit(la, 0, conn.admin.list_offsets(table_name))
    at_baseline = snapshot(table)
    later = parts + (["z-new"] if partitioned else [])  # a partition created after the baseline
    for seed in range(3, 6):
        write(table, la, A, rows_for(seed, 150, later))
        write(table, lb, B, rows_for(seed + 10, 150, later))
    now = snapshot(table)
    report = recover(conn, table_name, la, target_columns=["k", "p", *A])
    assert report.baseline_source == "commit of epoch 0" and report.buckets
    assert snapshot(table) == expected_after_undo(at_baseline, now)
    if partitioned:
        assert any(b.partition == "z-new" and b.baseline == 0 for b in report.buckets)
    again = recover(conn, table_name, la, target_columns=["k", "p", *A])  # idempotent
    assert snapshot(table) == expected_after_undo(at_baseline, now) and again.keys_restored >= 0
    conn.locks.release(la)
    conn.locks.release(lb)


def test_full_row_owner_before_its_first_commit_uses_initial_offsets(conn, table_name):
    table = make_table(conn, table_name, partitioned=True)
    owner = conn.locks.acquire(table_name, "bootstrap", ["k"] + A + B, ttl=30)
    with table.upsert_writer(lease=owner) as w:
        w.upsert([{"k": 1, "p": "x", "a_sum": 1, "a_list": 1, "b_sum": 1}])
    conn.locks.release(owner)  # a second owner starts now: its initial offsets are the baseline
    job = conn.locks.acquire(table_name, "job", A + B, ttl=30)
    at_baseline = snapshot(table)
    with table.upsert_writer(lease=job) as w:
        w.upsert([{"k": k, "p": p, "a_sum": k, "a_list": k, "b_sum": k} for k in range(20) for p in ("x", "w")])
    report = recover(conn, table_name, job)
    assert report.baseline_source.startswith(f"the start of lock tenure {job.tenure}")
    assert snapshot(table) == at_baseline
    conn.locks.release(job)


def test_refusals_change_nothing(conn, table_name):
    table = make_table(conn, table_name, partitioned=False, buckets=1)
    lease = conn.locks.acquire(table_name, "owner", A, ttl=30)
    write(table, lease, A, [(1, "x", 1), (2, "x", 2)])
    end = conn.admin.list_offsets(table_name)[(None, 0)]
    with pytest.raises(RecoveryError, match="changelog ends at"):
        undo_remote(table, 0, end + 5, target_columns=["k", "p", *A], lease=lease)
    with pytest.raises(InvalidInputError, match="column lock's undo still needs"):
        conn.admin.truncate_log(table_name, 0, 1)  # the tenure's undo needs offset 0
    assert conn.admin.list_log_offsets(table_name)[(None, 0)][0] == 0
    assert conn.admin.truncate_log(table_name, 0, 1, force=True) == 1
    before = snapshot(table)
    with pytest.raises(RecoveryError, match="now starts at 1"):
        recover(conn, table_name, lease, target_columns=["k", "p", *A])
    assert snapshot(table) == before
    conn.locks.release(lease)
    conn.admin.drop_table(table_name)
    make_table(conn, table_name, partitioned=False, buckets=1)
    with pytest.raises(RecoveryError, match="dropped and re-created"):
        recover(conn, table_name, lease, target_columns=["k", "p", *A])


def test_idempotent_functions_skip_undo_when_the_writer_never_deletes(conn, table_name):
    schema = (Schema.builder().column("k", pa.int64()).agg_column("hi", pa.int64(), "max")
              .agg_column("seen", pa.bool_(), "bool_or").primary_key("k").build())
    conn.admin.create_table(table_name, TableDescriptor(schema, properties={"table.merge-engine": "aggregation"}))
    lease = conn.locks.acquire(table_name, "maxer", ["hi", "seen"], ttl=30)
    report = recover(conn, table_name, lease, writer_deletes=False)
    assert report.skipped and "idempotent" in report.skipped and not report.buckets
    assert recover(conn, table_name, lease, writer_deletes=True).skipped is None
    conn.locks.release(lease)


def test_kill_9_during_undo_then_recover_again(cluster, conn, table_name):
    table = make_table(conn, table_name, partitioned=True, buckets=4)
    la = conn.locks.acquire(table_name, "crashy", A, ttl=30)
    lb = conn.locks.acquire(table_name, "other", B, ttl=30)
    write(table, la, A, rows_for(100, 300, ["x", "y"]))
    conn.locks.commit(la, 0, conn.admin.list_offsets(table_name))
    at_baseline = snapshot(table)
    for seed in range(101, 104):
        write(table, la, A, rows_for(seed, 2000, ["x", "y", "q"]))
        write(table, lb, B, rows_for(seed + 50, 300, ["x", "q"]))
    now = snapshot(table)
    # The crashed job's lock stays (a release would end its tenure and keep its writes);
    # each restart re-acquires it, continuing the tenure with a new token.
    rnd = random.Random(7)
    env = dict(os.environ)
    command = [sys.executable, "-m", "tests.cluster.recover_process", cluster.url, table_name,
               "crashy", ",".join(A)]
    killed = 0
    for _ in range(10):
        proc = subprocess.Popen(command, stdout=subprocess.PIPE, text=True, env=env)
        assert proc.stdout.readline().strip() == "recovering"
        time.sleep(rnd.uniform(0.0, 0.6))
        if proc.poll() is None:
            proc.kill()
            killed += 1
        proc.wait()
        proc.stdout.close()
    out = subprocess.run(command, capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0 and "done" in out.stdout, out.stderr
    assert snapshot(table) == expected_after_undo(at_baseline, now)
    assert killed >= 5  # most restarts die mid-undo
    conn.locks.release(lb)

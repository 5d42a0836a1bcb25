"""A write whose outcome the writer never learned (refused as not acknowledged, or timed out,
while it stays in the leader's log above the high watermark) is resolved before anything builds
on it: an owner's restart undoes it if it ever commits, so its replay counts once, never twice.

The fault: one follower of the bucket paused (SIGSTOP) while it is still in the in-sync set, so
the high watermark cannot pass the write; the writer gives up on it. The owner then restarts
(a new connection, the same owner id) and recovers while the follower is still paused; the
follower resumes afterwards and the old record commits. Whatever the timing, the key must count
the committed epoch once and the replayed epoch once.
"""

from __future__ import annotations

import os
import signal
import threading

import pyarrow as pa
import pytest

import tally
from recovery import recover
from tally.errors import TallyError
from tally.server import LocalCluster
from tests.cluster.replica_checks import (leader_index, restart_stopped_servers,
                                          wait_fully_in_sync)

OWNER = "ambiguous-owner"


@pytest.fixture(scope="module")
def trio(tmp_path_factory):
    # a long session: the paused follower stays in the in-sync set while the writer gives up
    with LocalCluster(str(tmp_path_factory.mktemp("ambiguous")), tablet_servers=3,
                      replication_factor=3, session_timeout=30.0) as cluster:
        yield cluster


@pytest.fixture
def conn(trio):
    with tally.connect(trio.url, retry_timeout=120) as c:
        yield c
    restart_stopped_servers(trio)


def make_table(conn, name: str) -> None:
    schema = (tally.Schema.builder().column("k", pa.int64())
              .agg_column("total", pa.int64(), tally.AggFunction.SUM)
              .agg_column("n", pa.int64(), tally.AggFunction.COUNT)
              .primary_key("k").build())
    conn.admin.create_table(name, tally.TableDescriptor(
        schema, bucket_count=1, properties={"table.merge-engine": "aggregation"}))


def write(conn, name: str, lease, keys, attempt: int | None = None) -> None:
    with conn.table(name).upsert_writer(lease=lease, attempt=attempt) as w:
        w.upsert(pa.table({"k": pa.array(keys, pa.int64()),
                           "total": pa.array([1] * len(keys), pa.int64()),
                           "n": pa.array([1] * len(keys), pa.int64())}))
        w.flush()


def totals(conn, name: str) -> dict[int, tuple[int, int]]:
    return {r["k"]: (r["total"], r["n"]) for r in conn.table(name).to_arrow().to_pylist()}


def paused_follower(cluster, conn, name: str) -> int:
    """Pause one follower of bucket 0; its LocalCluster index."""
    replicas = wait_fully_in_sync(conn, name, cluster)[(None, 0)]
    follower = next(s for s in replicas["replicas"] if s != replicas["leader"])
    index = leader_index(cluster, follower)
    os.kill(cluster.tablet_servers[index].proc.pid, signal.SIGSTOP)
    return index


def test_a_write_given_up_on_is_undone_before_its_epoch_is_replayed(trio, conn):
    name = "default.ambiguous_epoch"
    make_table(conn, name)
    keys = list(range(20))
    lease = conn.locks.acquire(name, OWNER, ["total", "n"], ttl=60)
    write(conn, name, lease, keys)                       # epoch 0, acknowledged
    assert conn.locks.commit(lease, 0, conn.admin.list_offsets(name))
    index = paused_follower(trio, conn, name)
    try:
        # epoch 1: the writer gives up (its per-attempt deadline and retry budget are short);
        # the leader holds the records above its high watermark
        with tally.connect(trio.url, retry_timeout=2.0, request_timeout=1.5) as impatient:
            with pytest.raises(TallyError):
                write(impatient, name, lease, keys)
        # the owner restarts: same owner id, the tenure goes on under a new token
        with tally.connect(trio.url, retry_timeout=120) as restarted:
            lease2 = restarted.locks.acquire(name, OWNER, ["total", "n"], ttl=60)
            outcome: dict = {}

            def run_recover():
                try:
                    outcome["report"] = recover(restarted, name, lease2,
                                                target_columns=["k", "total", "n"],
                                                skip_idempotent=False)
                except BaseException as e:  # surfaced below
                    outcome["error"] = e

            recovering = threading.Thread(target=run_recover, daemon=True)
            recovering.start()
            # the recover either waits for the paused follower (the tail unresolved) or has
            # finished; either way the follower resumes now and the old records can commit
            recovering.join(timeout=3.0)
            os.kill(trio.tablet_servers[index].proc.pid, signal.SIGCONT)
            recovering.join(timeout=300)
            assert not recovering.is_alive(), "recover never returned"
            if "error" in outcome:
                raise outcome["error"]
            # epoch 1 replayed, as a new task attempt (recover fenced the earlier ones)
            attempt = restarted.locks.register_attempt(lease2, 0)
            write(restarted, name, lease2, keys, attempt)
            assert restarted.locks.commit(lease2, 1, restarted.admin.list_offsets(name))
            wait_fully_in_sync(restarted, name, trio)
            assert totals(restarted, name) == {k: (2, 2) for k in keys}
            restarted.locks.release(lease2)
    finally:
        try:
            os.kill(trio.tablet_servers[index].proc.pid, signal.SIGCONT)
        except ProcessLookupError:
            pass


def test_settled_offsets_cover_every_record_the_leader_holds(trio, conn):
    """A settled end is never below a record the leader held when asked: with a follower
    paused, the plain end stays at the high watermark while the settled one waits for the
    tail, and both agree once the follower is back."""
    name = "default.ambiguous_offsets"
    make_table(conn, name)
    write(conn, name, None, [1, 2, 3])
    before = conn.admin.list_offsets(name)[(None, 0)]
    index = paused_follower(trio, conn, name)
    try:
        with tally.connect(trio.url, retry_timeout=2.0, request_timeout=1.5) as impatient:
            with pytest.raises(TallyError):
                write(impatient, name, None, [1, 2, 3])
        settled: dict = {}
        asking = threading.Thread(
            target=lambda: settled.update(conn.admin.list_offsets(name, settle=True)),
            daemon=True)
        asking.start()
        asking.join(timeout=3.0)
        os.kill(trio.tablet_servers[index].proc.pid, signal.SIGCONT)
        asking.join(timeout=300)
        assert not asking.is_alive(), "settled offsets never returned"
        # the given-up write holds at least one record past the end seen before it
        assert settled[(None, 0)] > before
        assert settled[(None, 0)] <= conn.admin.list_offsets(name)[(None, 0)]
    finally:
        try:
            os.kill(trio.tablet_servers[index].proc.pid, signal.SIGCONT)
        except ProcessLookupError:
            pass

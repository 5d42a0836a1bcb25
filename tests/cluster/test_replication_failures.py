"""Replication under failures, each case on its own: a server gone past `replica_replace_after`
is re-replicated, a wiped server comes back under a new identity and is filled again, a follower
paused past its session leaves the in-sync set while writes go on and rejoins after it resumes,
and a write retried on the new leader after its first leader died is applied once.

Two clusters for the module, both with embedded metadata and a 3 s session: four servers for
the re-replication (a spare to move copies to), three for the rest. `replica_replace_after` is
3 s on both: with three servers and three copies a bucket has no spare server, so nothing moves
except onto a wiped server's new identity. Every test leaves every server running.
"""

from __future__ import annotations

import itertools
import os
import shutil
import signal
import threading

import pyarrow as pa
import pytest

import tally
from tally.errors import TallyError
from tally.server import LocalCluster
from tally.wire.channel import FlightChannel
from tests.cluster.replica_checks import (copies_of, digest, leader_index, replica_rows_equal,
                                          wait_fully_in_sync)
from tests.waiting import wait_until

_names = itertools.count()


def cluster_of(tmp_path_factory, servers: int):
    data_dir = tmp_path_factory.mktemp(f"failures{servers}")
    return LocalCluster(str(data_dir), tablet_servers=servers, replication_factor=3,
                        session_timeout=3.0, replica_replace_after=3.0)


@pytest.fixture(scope="module")
def trio(tmp_path_factory):
    with cluster_of(tmp_path_factory, 3) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def quartet(tmp_path_factory):
    with cluster_of(tmp_path_factory, 4) as cluster:
        yield cluster


def restore(cluster: LocalCluster) -> None:
    for i, handle in enumerate(cluster.tablet_servers):
        if handle.running:
            try:
                os.kill(handle.proc.pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
        else:
            cluster.start_tablet_server(i)


@pytest.fixture
def conn3(trio):
    with tally.connect(trio.url, retry_timeout=180) as c:
        yield c
    restore(trio)


@pytest.fixture
def conn4(quartet):
    with tally.connect(quartet.url, retry_timeout=180) as c:
        yield c
    restore(quartet)


def make_table(conn, buckets: int) -> str:
    name = f"default.f{next(_names)}"
    schema = (tally.Schema.builder().column("k", pa.int64())
              .agg_column("total", pa.int64(), tally.AggFunction.SUM)
              .primary_key("k").build())
    conn.admin.create_table(name, tally.TableDescriptor(
        schema, bucket_count=buckets, properties={"table.merge-engine": "aggregation"}))
    return name


def write(conn, name: str, keys, amount: int) -> None:
    with conn.table(name).upsert_writer() as w:
        w.upsert(pa.table({"k": pa.array(keys, pa.int64()),
                           "total": pa.array([amount] * len(keys), pa.int64())}))


def totals(conn, name: str) -> dict[int, int]:
    return {r["k"]: r["total"] for r in conn.table(name).to_arrow().to_pylist()}


def all_copies_equal(cluster, conn, name: str, buckets: int) -> None:
    table_id = conn.table_meta(name).table_id
    for bucket in range(buckets):
        copies = copies_of(cluster, table_id, 0, bucket, conn=conn, name=name)
        assert len(copies) == 3
        replica_rows_equal(cluster, conn, name, bucket, copies)


def test_a_server_gone_past_replace_after_is_re_replicated(quartet, conn4):
    name = make_table(conn4, buckets=4)
    keys = list(range(40))
    write(conn4, name, keys, 1)
    wait_fully_in_sync(conn4, name)
    victim = 0
    gone = quartet.tablet_servers[victim].info["server_id"]
    assert any(gone in r["replicas"] for r in conn4.admin.bucket_replicas(name).values())
    quartet.kill_tablet_server(victim)
    write(conn4, name, keys, 10)  # written while the copies move

    def moved():
        replicas = wait_fully_in_sync(conn4, name, quartet)
        return replicas if all(gone not in r["replicas"] for r in replicas.values()) else None

    replicas = wait_until(moved, f"every copy on {gone} made again elsewhere")
    for r in replicas.values():
        assert len(set(r["replicas"])) == 3 and sorted(r["isr"]) == sorted(r["replicas"])
    assert totals(conn4, name) == {k: 11 for k in keys}
    all_copies_equal(quartet, conn4, name, 4)


def test_a_wiped_server_returns_under_a_new_identity_and_is_filled(trio, conn3):
    name = make_table(conn3, buckets=3)
    keys = list(range(30))
    write(conn3, name, keys, 1)
    wait_fully_in_sync(conn3, name, trio)
    handle = trio.tablet_servers[1]
    old = handle.info["server_id"]
    trio.kill_tablet_server(1)
    shutil.rmtree(handle.data_dir)
    trio.start_tablet_server(1)
    new = handle.info["server_id"]
    assert new != old
    write(conn3, name, keys, 10)

    def filled():
        replicas = wait_fully_in_sync(conn3, name, trio)
        return replicas if all(new in r["replicas"] for r in replicas.values()) else None

    replicas = wait_until(filled, f"the wiped server's new identity {new} holding every bucket")
    assert all(old not in r["replicas"] for r in replicas.values())
    assert totals(conn3, name) == {k: 11 for k in keys}
    all_copies_equal(trio, conn3, name, 3)


def test_a_follower_paused_past_its_session_leaves_the_in_sync_set_and_rejoins(trio, conn3):
    name = make_table(conn3, buckets=1)
    write(conn3, name, [1, 2, 3], 1)
    r = wait_fully_in_sync(conn3, name, trio)[(None, 0)]
    follower = next(s for s in r["replicas"] if s != r["leader"])
    handle = trio.tablet_servers[leader_index(trio, follower)]
    os.kill(handle.proc.pid, signal.SIGSTOP)
    try:
        wait_until(lambda: follower not in conn3.admin.bucket_replicas(name)[(None, 0)]["isr"],
                   f"the paused follower {follower} leaving the in-sync set")
        for amount in (10, 100):  # two copies in sync: min.insync.replicas 2 is met
            write(conn3, name, [1, 2, 3], amount)
        assert totals(conn3, name) == {1: 111, 2: 111, 3: 111}
        after = conn3.admin.bucket_replicas(name)[(None, 0)]
        assert after["leader"] == r["leader"] and len(after["isr"]) == 2
    finally:
        os.kill(handle.proc.pid, signal.SIGCONT)
    wait_until(lambda: follower in conn3.admin.bucket_replicas(name)[(None, 0)]["isr"],
               f"the resumed follower {follower} rejoining the in-sync set")
    all_copies_equal(trio, conn3, name, 1)
    assert totals(conn3, name) == {1: 111, 2: 111, 3: 111}


def test_a_batch_retried_on_the_new_leader_is_applied_once(trio, conn3):
    name = make_table(conn3, buckets=1)
    write(conn3, name, [7], 1)
    r = wait_fully_in_sync(conn3, name, trio)[(None, 0)]
    table_id = conn3.table_meta(name).table_id
    leader = trio.tablet_servers[leader_index(trio, r["leader"])]
    followers = [trio.tablet_servers[leader_index(trio, s)].address
                 for s in r["replicas"] if s != r["leader"]]
    start = digest(trio, leader.address, table_id, 0, 0)["log_end"]
    route = conn3.table_meta(name).route(None, 0)
    header = {"op": "put", "mode": "AGGREGATE", "writer": ["w-retried", 5], **route.header()}
    rows = pa.table({"k": pa.array([7], pa.int64()), "total": pa.array([1000], pa.int64())})

    def put(address: str, outcome: dict) -> None:
        channel = FlightChannel(address, timeout=60)
        try:
            outcome["ack"] = channel.put(header, rows)
        except TallyError as e:
            outcome["error"] = e
        finally:
            channel.close()

    first: dict = {}
    thread = threading.Thread(target=put, args=(leader.address, first))
    thread.start()
    # the followers hold the batch; the leader dies whether or not its ack left yet
    wait_until(lambda: all(digest(trio, a, table_id, 0, 0)["log_end"] > start
                           for a in followers), "the batch on both followers")
    trio.kill_tablet_server(leader_index(trio, r["leader"]))
    thread.join(timeout=120)
    assert not thread.is_alive()

    def new_leader():
        now = conn3.admin.bucket_replicas(name)[(None, 0)]
        return now if now["leader"] not in (None, r["leader"]) else None

    now = wait_until(new_leader, "a new leader elected")
    address = trio.tablet_servers[leader_index(trio, now["leader"])].address
    retried: dict = {}
    put(address, retried)
    assert "ack" in retried, retried
    assert totals(conn3, name) == {7: 1001}  # applied once, not twice
    header["writer"] = ["w-retried", 6]  # the writer's next batch is applied as usual
    later: dict = {}
    put(address, later)
    assert "ack" in later, later
    assert totals(conn3, name) == {7: 2001}
    restore(trio)
    wait_fully_in_sync(conn3, name, trio)
    all_copies_equal(trio, conn3, name, 1)


def test_offsets_and_changelog_ranges_never_go_back_across_a_failover(trio, conn3):
    """What list_offsets showed stays readable after the leader dies: the new leader starts its
    high watermark where its followers last heard it, and a changelog range up to an offset it
    holds waits for its followers rather than coming back short (what an undo or a tiering
    round reads must be whole)."""
    name = make_table(conn3, 1)
    for i in range(5):
        write(conn3, name, range(20), i + 1)
    shown = conn3.admin.list_offsets(name)[(None, 0)]
    leader = conn3.admin.bucket_replicas(name)[(None, 0)]["leader"]
    trio.kill_tablet_server(leader_index(trio, leader))
    seen = []

    def moved():
        try:
            replicas = conn3.admin.bucket_replicas(name)[(None, 0)]
            seen.append(conn3.admin.list_offsets(name)[(None, 0)])
        except TallyError:
            return None
        return replicas["leader"] not in (None, leader)

    wait_until(moved, "a new leader of bucket 0", deadline=120)
    assert all(offset >= shown for offset in seen), (shown, seen)
    records = conn3.table(name).changelog(0, 0, shown)
    assert records.num_rows == shown
    assert records.column("_offset").to_pylist() == list(range(shown))

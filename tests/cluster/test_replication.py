"""Replication on a real 3-server cluster: placement, acknowledged means replicated, failover
after kill -9, the in-sync minimum, a zombie leader (SIGSTOP past its session), and replicas
that stay equal to their leader.

One cluster for the module (embedded metadata, a short session so failovers take seconds);
every test leaves all three servers running and every bucket fully in sync.
"""

from __future__ import annotations

import itertools
import os
import signal
import threading

import pyarrow as pa
import pytest

import tally
from tally.errors import NotEnoughReplicasError, PartialWriteError, TallyError
from tally.server import LocalCluster
from tests.cluster.replica_checks import (copies_of, leader_index, replica_rows_equal,
                                          restart_stopped_servers, wait_fully_in_sync)
from tests.waiting import wait_until

_names = itertools.count()


@pytest.fixture(scope="module")
def trio(tmp_path_factory):
    data_dir = tmp_path_factory.mktemp("replicated")
    with LocalCluster(str(data_dir), tablet_servers=3, session_timeout=3.0) as cluster:
        yield cluster


@pytest.fixture
def conn(trio):
    with tally.connect(trio.url, retry_timeout=120) as c:
        yield c
    restart_stopped_servers(trio)


def make_table(conn, buckets: int = 3, **options) -> str:
    name = f"default.r{next(_names)}"
    schema = (tally.Schema.builder().column("k", pa.int64())
              .agg_column("total", pa.int64(), tally.AggFunction.SUM)
              .agg_column("last", pa.string(), tally.AggFunction.LAST_VALUE)
              .primary_key("k").build())
    conn.admin.create_table(name, tally.TableDescriptor(schema, bucket_count=buckets,
                                                        properties={"table.merge-engine": "aggregation", **options}))
    return name


def write(conn, name: str, keys, amount: int, tag: str) -> None:
    table = conn.table(name)
    with table.upsert_writer() as w:
        w.upsert(pa.table({"k": pa.array(keys, pa.int64()),
                           "total": pa.array([amount] * len(keys), pa.int64()),
                           "last": pa.array([tag] * len(keys))}))
        w.flush()


def totals(conn, name: str) -> dict[int, int]:
    rows = conn.table(name).to_arrow().to_pylist()
    return {r["k"]: r["total"] for r in rows}


def test_buckets_are_placed_on_three_distinct_servers(trio, conn, capsys):
    name = make_table(conn, buckets=4)
    replicas = conn.admin.bucket_replicas(name)
    assert sorted(replicas) == [(None, b) for b in range(4)]
    leaders = set()
    for r in replicas.values():
        assert len(set(r["replicas"])) == 3
        assert r["leader"] == r["replicas"][0]
        assert sorted(r["isr"]) == sorted(r["replicas"])
        assert r["leader_epoch"] == 0
        leaders.add(r["leader"])
    assert len(leaders) >= 2  # leadership is spread, not piled on one server

    from tally.cli.main import main
    assert main(["buckets", name, "--url", trio.url]) == 0
    out = capsys.readouterr().out
    for r in replicas.values():
        assert r["leader"] in out


def test_a_replication_factor_beyond_the_live_servers_is_refused(trio, conn):
    # Too few live servers is "unavailable" (servers may come back), so a client retries it
    # for its retry timeout: a short one here, since none will come.
    with tally.connect(trio.url, retry_timeout=1) as impatient, \
            pytest.raises(TallyError, match="table.replication.factor"):
        make_table(impatient, **{"table.replication.factor": "4"})
    with pytest.raises(TallyError, match="min.insync.replicas"):
        make_table(conn, **{"min.insync.replicas": "5"})


def test_kill_9_of_a_leader_loses_no_acknowledged_write(trio, conn):
    name = make_table(conn)
    keys = list(range(60))
    expected = {k: 0 for k in keys}
    for i in range(3):
        write(conn, name, keys, 1, f"a{i}")
        for k in keys:
            expected[k] += 1
    before = conn.admin.bucket_replicas(name)[(None, 0)]
    victim = leader_index(trio, before["leader"])
    trio.kill_tablet_server(victim)
    for i in range(3):  # these wait for the election, then land on the new leaders
        write(conn, name, keys, 10, f"b{i}")
        for k in keys:
            expected[k] += 10
    after = conn.admin.bucket_replicas(name)[(None, 0)]
    assert after["leader"] != before["leader"]
    assert after["leader"] in before["isr"]
    assert after["leader_epoch"] > before["leader_epoch"]
    assert totals(conn, name) == expected

    trio.start_tablet_server(victim)
    wait_fully_in_sync(conn, name)
    # the restarted server caught up: now kill the new leader, and nothing is lost either
    trio.kill_tablet_server(leader_index(trio, after["leader"]))
    write(conn, name, keys, 100, "c")
    for k in keys:
        expected[k] += 100
    assert totals(conn, name) == expected


def test_lookups_follow_a_killed_leader_and_answer_acknowledged_rows(trio, conn):
    """Point lookups go to the bucket's leader only: after kill -9 of it, `lookup` and
    `lookup_many` retry until the new leader answers, with every acknowledged write."""
    name = make_table(conn, buckets=2)
    keys = list(range(40))
    write(conn, name, keys, 1, "a")
    write(conn, name, keys, 2, "b")
    table = conn.table(name)
    assert [table.lookup({"k": k}) for k in keys] == \
        [{"k": k, "total": 3, "last": "b"} for k in keys]
    before = conn.admin.bucket_replicas(name)[(None, 0)]
    trio.kill_tablet_server(leader_index(trio, before["leader"]))
    assert [table.lookup({"k": k}) for k in keys] == \
        [{"k": k, "total": 3, "last": "b"} for k in keys]
    assert conn.admin.bucket_replicas(name)[(None, 0)]["leader"] != before["leader"]
    write(conn, name, keys, 10, "c")
    assert table.lookup_many([{"k": k} for k in keys]) == \
        [{"k": k, "total": 13, "last": "c"} for k in keys]
    assert table.lookup({"k": 99}) is None


def test_below_min_insync_a_write_is_refused_and_not_applied(trio, conn):
    name = make_table(conn, buckets=1)
    write(conn, name, [1, 2], 5, "x")
    r = conn.admin.bucket_replicas(name)[(None, 0)]
    followers = [leader_index(trio, s) for s in r["replicas"] if s != r["leader"]]
    for i in followers:
        trio.kill_tablet_server(i)
    wait_until(lambda: conn.admin.bucket_replicas(name)[(None, 0)]["isr"] == [r["leader"]],
               "the in-sync set shrinking to the leader")
    with tally.connect(trio.url, retry_timeout=2) as quick:
        with pytest.raises((NotEnoughReplicasError, PartialWriteError)) as refused:
            write(quick, name, [1, 2], 1000, "lost")
    error = refused.value
    if isinstance(error, PartialWriteError):
        # the leader learnt of the shrink after it took the write into its log: not
        # acknowledged, and the flush says it may yet be applied (never that nothing was)
        assert error.applied == {} and set(error.refused) == {(None, 0)}
        assert isinstance(error.refused[(None, 0)], NotEnoughReplicasError)
        assert "may yet be applied" in str(error) and "Nothing" not in str(error)
    else:
        assert "nothing was applied" in str(error)
    assert "min.insync.replicas" in str(error)
    assert totals(conn, name) == {1: 5, 2: 5}  # reads still work, and nothing was acknowledged


def test_a_zombie_leader_never_acknowledges_after_a_new_leader_exists(trio, conn):
    name = make_table(conn, buckets=1)
    write(conn, name, [7], 1, "before")
    r = conn.admin.bucket_replicas(name)[(None, 0)]
    zombie = trio.tablet_servers[leader_index(trio, r["leader"])]
    meta = conn.table_meta(name)
    route = meta.route(None, 0)
    os.kill(zombie.proc.pid, signal.SIGSTOP)
    wait_until(lambda: conn.admin.bucket_replicas(name)[(None, 0)]["leader"] not in
               (None, r["leader"]), "a new leader elected while the old one is stopped")
    write(conn, name, [7], 10, "new leader")

    outcome = {}

    def write_to_zombie():
        from tally.wire.channel import FlightChannel
        channel = FlightChannel(zombie.address, timeout=120)
        rows = pa.table({"k": pa.array([7], pa.int64()), "total": pa.array([1000], pa.int64()),
                         "last": pa.array(["zombie"])})
        try:
            outcome["ack"] = channel.put({"op": "put", "mode": "AGGREGATE",
                                          **route.header()}, rows)
        except TallyError as e:
            outcome["error"] = e
        finally:
            channel.close()

    thread = threading.Thread(target=write_to_zombie)
    thread.start()
    os.kill(zombie.proc.pid, signal.SIGCONT)
    thread.join(timeout=180)
    assert not thread.is_alive()
    assert "ack" not in outcome, f"the deposed leader acknowledged a write: {outcome}"
    wait_fully_in_sync(conn, name)
    rows = conn.table(name).to_arrow().to_pylist()
    assert rows == [{"k": 7, "total": 11, "last": "new leader"}]


def test_followers_hold_what_their_leader_holds(trio, conn):
    name = make_table(conn, buckets=2, **{"table.kv.buffer-size": "1kb"})
    for i in range(5):
        write(conn, name, list(range(i, 200, 3)), i + 1, f"w{i}")
    wait_fully_in_sync(conn, name)
    info = conn.table_meta(name)
    for bucket in range(2):
        copies = copies_of(trio, info.table_id, 0, bucket, conn=conn, name=name)
        assert len(copies) == 3
        found = replica_rows_equal(trio, conn, name, bucket, copies)
        assert found[0]["row_count"] > 0


def test_a_leader_moves_to_an_in_sync_replica_and_nothing_is_lost(trio, conn):
    name = make_table(conn, buckets=1)
    write(conn, name, [1, 2], 3, "before")
    r = wait_fully_in_sync(conn, name)[(None, 0)]
    target = next(s for s in r["replicas"] if s != r["leader"])
    moved = conn.admin.move_leader(name, 0, to=target)
    assert moved["leader"] == target and moved["leader_epoch"] == r["leader_epoch"] + 1
    write(conn, name, [1, 2], 4, "after")
    assert totals(conn, name) == {1: 7, 2: 7}
    with pytest.raises(TallyError, match="in-sync"):
        conn.admin.move_leader(name, 0, to="ts-nobody")
    back = conn.admin.move_leader(name, 0)  # the preferred leader again
    assert back["leader"] == r["replicas"][0]
    write(conn, name, [1], 1, "back")
    assert totals(conn, name) == {1: 8, 2: 7}

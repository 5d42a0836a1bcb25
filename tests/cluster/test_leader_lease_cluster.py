"""A leader that no longer leads answers nothing from its copy, with real server processes.

Three tablet servers, three copies of a one-bucket table, the default session timeout. The
faults: the bucket's leader paused (SIGSTOP) until another is elected and acknowledges writes,
then resumed with requests queued at it from while it was paused (they are served the moment
it runs again, before it has heard the coordinator); a deliberate move of the leadership; and
the coordinator paused, so no lease is renewed. Every read must equal the acknowledged state
or be refused with NotLeaderError (the client re-routes); no timing is asserted.
"""

from __future__ import annotations

import os
import signal
import threading

import pyarrow as pa
import pytest

import tally
from tally.errors import InvalidInputError, NotLeaderError
from tally.server import LocalCluster
from tally.wire.channel import FlightChannel
from tally.wire.messages import FOUND_COLUMN
from tests.cluster.replica_checks import (leader_index, restart_stopped_servers,
                                          wait_fully_in_sync)
from tests.conftest import zookeeper_chroot
from tests.waiting import wait_until

QUEUED = 8  # requests sent to the paused leader, served when it resumes


@pytest.fixture(scope="module")
def trio(tmp_path_factory):
    data_dir = tmp_path_factory.mktemp("leases")
    with LocalCluster(str(data_dir), tablet_servers=3) as cluster:
        yield cluster


@pytest.fixture
def conn(trio):
    with tally.connect(trio.url, retry_timeout=120) as c:
        yield c
    restart_stopped_servers(trio)
    if trio.coordinator.proc is not None:
        os.kill(trio.coordinator.proc.pid, signal.SIGCONT)


def make_table(conn, name: str) -> None:
    schema = (tally.Schema.builder().column("k", pa.int64())
              .agg_column("total", pa.int64(), tally.AggFunction.SUM)
              .primary_key("k").build())
    conn.admin.create_table(name, tally.TableDescriptor(
        schema, bucket_count=1, properties={"table.merge-engine": "aggregation"}))


def rows(keys, amount: int) -> pa.Table:
    return pa.table({"k": pa.array(keys, pa.int64()),
                     "total": pa.array([amount] * len(keys), pa.int64())})


def write(conn, name: str, keys, amount: int) -> None:
    with conn.table(name).upsert_writer() as w:
        w.upsert(rows(keys, amount))
        w.flush()


def found(answer: pa.Table) -> dict[int, int]:
    """{key: total} of a lookup_many answer's found rows, or of a scan."""
    if FOUND_COLUMN in answer.column_names:
        answer = answer.filter(answer.column(FOUND_COLUMN))
    return {r["k"]: r["total"] for r in answer.select(["k", "total"]).to_pylist()}


class Direct:
    """Requests sent straight to one tablet server for bucket 0, as a client with an old
    routing would send them."""

    def __init__(self, conn, name: str) -> None:
        meta = conn.table_meta(name)
        route = conn.route(name, None, 0, meta.table_id)
        self.address = route.address
        self.header = route.header()
        self.channel = FlightChannel(self.address, timeout=120)

    def lookup(self, keys) -> dict[int, int]:
        return found(self.channel.lookup_many({**self.header, "unwritten": False},
                                              pa.table({"k": pa.array(keys, pa.int64())})))

    def scan(self) -> dict[int, int]:
        return found(self.channel.get({**self.header, "op": "scan"}))

    def put(self, keys, amount: int) -> dict:
        return self.channel.put({**self.header, "op": "put"}, rows(keys, amount))


def either_refused_or(expected: dict, call) -> str:
    """'refused' when `call` raised NotLeaderError, 'answered' when it returned `expected`."""
    try:
        got = call()
    except NotLeaderError:
        return "refused"
    assert got == expected, "a read answered from a copy that is not the acknowledged state"
    return "answered"


def test_a_resumed_deposed_leader_never_answers_from_its_stale_copy(trio, conn):
    paused_and_resumed(trio, conn, "default.lease_paused")


def test_with_zookeeper_a_resumed_deposed_leader_never_answers_from_its_stale_copy(
        tmp_path, zookeeper):
    """With ZooKeeper the paused leader's /live node goes with its session, and the
    coordinator still deposes it only once its lease grant has run out."""
    with LocalCluster(str(tmp_path), tablet_servers=3,
                      zookeeper=zookeeper_chroot(zookeeper)) as cluster, \
            tally.connect(cluster.url, retry_timeout=120) as c:
        try:
            paused_and_resumed(cluster, c, "default.lease_paused_zk")
        finally:
            restart_stopped_servers(cluster)


def paused_and_resumed(trio, conn, name: str) -> None:
    make_table(conn, name)
    old_keys, new_keys = list(range(20)), list(range(20, 40))
    write(conn, name, old_keys, 1)
    before = wait_fully_in_sync(conn, name, trio)[(None, 0)]
    old = Direct(conn, name)
    pid = trio.tablet_servers[leader_index(trio, before["leader"])].proc.pid
    queued: list = []

    def queue(call) -> None:
        def run():
            try:
                queued.append(("ok", call()))
            except Exception as e:  # noqa: BLE001 - judged below
                queued.append(("error", e))
        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        return thread

    os.kill(pid, signal.SIGSTOP)
    try:
        wait_until(lambda: conn.admin.bucket_replicas(name)[(None, 0)]["leader"]
                   not in (None, before["leader"]), "another leader elected")
        write(conn, name, old_keys + new_keys, 10)  # acknowledged by the new leader
        expected = {**{k: 11 for k in old_keys}, **{k: 10 for k in new_keys}}
        threads = [queue(lambda: old.lookup(old_keys + new_keys)) for _ in range(QUEUED // 2)]
        threads += [queue(old.scan) for _ in range(QUEUED // 2)]
        threads.append(queue(lambda: old.put(new_keys, 1000)))
    finally:
        os.kill(pid, signal.SIGCONT)
    for thread in threads:
        thread.join(timeout=120)
    assert len(queued) == len(threads)
    for outcome, value in queued:
        if outcome == "error":
            assert isinstance(value, NotLeaderError), value
        elif isinstance(value, dict) and "end_offset" in value:
            raise AssertionError(f"the deposed leader acknowledged a write: {value}")
        else:
            assert value == expected, "a resumed deposed leader answered from its stale copy"
    for _ in range(10):  # asked again, and through a client whose routing was the old one
        either_refused_or(expected, lambda: old.lookup(old_keys + new_keys))
        either_refused_or(expected, old.scan)
    assert {r["k"]: r["total"] for r in conn.table(name).to_arrow().to_pylist()} == expected
    assert {k: r["total"] for k, r in zip(
        old_keys + new_keys, conn.table(name).lookup_many(
            [{"k": k} for k in old_keys + new_keys]))} == expected


def test_a_moved_leadership_is_refused_by_the_old_leader_before_the_new_one_serves(trio, conn):
    name = "default.lease_moved"
    make_table(conn, name)
    keys = list(range(10))
    write(conn, name, keys, 1)
    before = wait_fully_in_sync(conn, name, trio)[(None, 0)]
    old = Direct(conn, name)
    target = next(s for s in before["replicas"] if s != before["leader"])
    with pytest.raises(InvalidInputError):
        conn.admin.move_leader(name, 0, to="ts-nobody")
    assert old.lookup(keys) == {k: 1 for k in keys}  # a refused move resigns nothing
    conn.admin.move_leader(name, 0, to=target)
    # the old leader resigned before the move was made: refused at once, whatever it heard
    with pytest.raises(NotLeaderError):
        old.lookup(keys)
    with pytest.raises(NotLeaderError):
        old.put(keys, 1000)
    write(conn, name, keys, 10)
    after = conn.admin.bucket_replicas(name)[(None, 0)]
    assert after["leader"] == target and after["leader_epoch"] > before["leader_epoch"]
    for _ in range(5):
        either_refused_or({k: 11 for k in keys}, lambda: old.lookup(keys))
    assert {r["k"]: r["total"] for r in conn.table(name).to_arrow().to_pylist()} == \
        {k: 11 for k in keys}


def test_a_leader_that_cannot_renew_its_lease_refuses_and_serves_again_after(trio, conn):
    name = "default.lease_unrenewed"
    make_table(conn, name)
    keys = list(range(10))
    write(conn, name, keys, 1)
    wait_fully_in_sync(conn, name, trio)
    leader = Direct(conn, name)
    coordinator = trio.coordinator.proc.pid
    os.kill(coordinator, signal.SIGSTOP)  # no heartbeat is answered: no lease renewed
    try:
        def refused():
            try:
                leader.lookup(keys)
            except NotLeaderError as e:
                return str(e)
            return None

        why = wait_until(refused, "the leader refusing reads once its lease ran out")
        assert "lease" in why
        with pytest.raises(NotLeaderError, match="lease"):
            leader.put(keys, 1000)
    finally:
        os.kill(coordinator, signal.SIGCONT)

    def serves():
        try:
            return leader.lookup(keys) == {k: 1 for k in keys}
        except NotLeaderError:
            return False

    wait_until(serves, "the leader serving again once the coordinator answers")
    write(conn, name, keys, 10)
    assert leader.lookup(keys) == {k: 11 for k in keys}

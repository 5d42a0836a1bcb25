"""Lock views reach tablet servers in the background and in any order, and fencing holds.

Real processes: a coordinator and three tablet servers with credentials, one copy per bucket,
so a one-bucket table has one leader and two servers that hold nothing of it. A paused server
(SIGSTOP) that holds no copy of a table delays none of its lock calls, and gets the newest view
once it runs again; a paused leader fails only the calls that fence its buckets, naming it; an
older view installed over a newer one (with the cluster credential, as the coordinator would)
changes nothing, so a superseded lease stays refused whatever order views arrive in.
"""

from __future__ import annotations

import contextlib
import os
import signal

import pyarrow as pa
import pytest

from locks import Lease
from merge_engine import Schema, TableDescriptor
from tally import client
from tally.errors import LeaseLostError, UnavailableError
from tally.server import LocalCluster
from tally.wire.channel import FlightChannel
from tests.waiting import wait_until


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with LocalCluster(str(tmp_path_factory.mktemp("lock-views")), tablet_servers=3,
                      replication_factor=1, authenticate=True) as c:
        yield c


@pytest.fixture
def conn(cluster):
    with client.connect(cluster.url, token=cluster.tokens["admin"], retry_timeout=60) as c:
        yield c


_names = iter(range(1000))


def make_table(conn, buckets=1, copies=1):
    name = f"default.views{next(_names)}"
    schema = (Schema.builder().column("k", pa.int64()).agg_column("a", pa.int64(), "sum")
              .agg_column("b", pa.int64(), "sum").primary_key("k").build())
    conn.admin.create_table(name, TableDescriptor(schema, bucket_count=buckets, properties={
        "table.merge-engine": "aggregation", "table.replication.factor": str(copies)}))
    return name


def leaders(conn, name) -> set[str]:
    info = conn.coordinator_action("table_info", {"name": name})
    return {b["leader"] for p in info["partitions"] for b in p["buckets"]}


def handle_of(cluster, server_id):
    return next(h for h in cluster.tablet_servers if h.info["server_id"] == server_id)


def internal(cluster, address) -> FlightChannel:
    """A channel with the cluster credential: what servers use among themselves."""
    return FlightChannel(address, cluster.cluster_token, timeout=30)


def coordinator_view(cluster, table_id) -> dict:
    with contextlib.closing(internal(cluster, cluster.url)) as channel:
        return channel.action("lock_view", {"table_id": table_id})


def held_version(cluster, handle, table_id) -> int:
    """The version of the table's view a server holds: offering it an empty view of version
    -1 changes nothing (an older view is ignored) and answers what it keeps."""
    with contextlib.closing(internal(cluster, handle.address)) as channel:
        return channel.action("install_lock_view", {"view": {
            "table_id": table_id, "version": -1, "locks": [], "column_tokens": {}}})


def live(conn, handle) -> bool:
    return any(s["server_id"] == handle.info["server_id"] and s["live"]
               for s in conn.coordinator_action("list_servers"))


def unkept(conn, name, owner, columns, ttl=120) -> Lease:
    """A lease nobody renews (a paused job, or the earlier incarnation of a restarted one)."""
    return Lease.from_json(conn.coordinator_action("lock_acquire", {
        "table": name, "owner_id": owner, "columns": columns, "ttl": ttl}))


def write(conn, name, lease, value=1, attempt=None):
    kwargs = {} if attempt is None else {"attempt": attempt}
    with conn.table(name).upsert_writer(target_columns=["k", "a"], lease=lease,
                                        **kwargs) as writer:
        writer.upsert([{"k": 1, "a": value}])


@contextlib.contextmanager
def paused(handle):
    os.kill(handle.proc.pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(handle.proc.pid, signal.SIGCONT)


def test_a_paused_server_without_a_copy_delays_no_lock_call(cluster, conn):
    name = make_table(conn)
    table_id = conn.table_meta(name).table_id
    [leader] = leaders(conn, name)
    bystander = next(h for h in cluster.tablet_servers if h.info["server_id"] != leader)
    lease = conn.locks.acquire(name, "job", ["a"], ttl=60)  # kept: renewed in the background
    write(conn, name, lease)
    with paused(bystander):
        # paused past its session: the coordinator no longer counts it live, and still
        # keeps what it missed for it
        wait_until(lambda: not live(conn, bystander), "the paused server counted gone")
        # a renewal waits for nobody, a fencing change only for the table's leader
        for _ in range(3):
            lease = conn.locks.renew(lease)
        [attempt] = conn.locks.register_attempts(lease, [0]).values()
        other = conn.locks.acquire(name, "other-job", ["b"], ttl=60)
        write(conn, name, lease, attempt=attempt)
        conn.locks.check(lease)  # the keeper never lost it
        wanted = coordinator_view(cluster, table_id)["version"]
    # back: the views it missed while paused reach it
    wait_until(lambda: held_version(cluster, bystander, table_id) >= wanted,
               "the paused server getting the newest lock view after SIGCONT")
    conn.locks.release(other)
    conn.locks.release(lease)


def test_an_older_view_delivered_late_keeps_the_superseded_lease_refused(cluster, conn):
    name = make_table(conn)
    table_id = conn.table_meta(name).table_id
    zombie = unkept(conn, name, "job", ["a"])
    write(conn, name, zombie)
    old_view = coordinator_view(cluster, table_id)
    current = unkept(conn, name, "job", ["a"])  # the job restarted: same tenure, new token
    assert current.token > zombie.token and current.tenure == zombie.tenure
    new_view = coordinator_view(cluster, table_id)
    assert new_view["version"] > old_view["version"]
    for handle in cluster.tablet_servers:  # the old view arrives last, everywhere
        with contextlib.closing(internal(cluster, handle.address)) as channel:
            assert channel.action("install_lock_view", {"view": new_view}) >= new_view["version"]
            assert channel.action("install_lock_view", {"view": old_view}) >= new_view["version"]
    with pytest.raises(LeaseLostError, match=f"token {current.token}|superseded|no longer held"):
        write(conn, name, zombie, value=100)
    write(conn, name, current, value=10)
    assert conn.table(name).to_arrow().to_pylist() == [{"k": 1, "a": 11, "b": None}]


def test_a_paused_leader_fails_only_the_calls_that_fence_its_buckets(cluster, conn):
    name = make_table(conn, buckets=2)
    table_id = conn.table_meta(name).table_id
    [partition] = conn.coordinator_action("table_info", {"name": name})["partitions"]
    first, second = (b["leader"] for b in partition["buckets"])
    assert first != second  # one copy per bucket, placed round robin
    handle = handle_of(cluster, second)
    lease = unkept(conn, name, "job", ["a"])
    write(conn, name, lease)
    with client.connect(cluster.url, token=cluster.tokens["admin"], retry_timeout=0.01) as once:
        with paused(handle):
            lease = once.locks.renew(lease)  # an expiry moved later: waits for nobody
            once.locks.register_attempt(lease, 0)  # bucket 0's leader runs: answered
            with pytest.raises(UnavailableError, match=f"tablet server {second} \\(leader of "
                                                       r"bucket\(s\) 1,.*not confirmed"):
                once.locks.register_attempt(lease, 1)  # stored, but not yet fencing there
    stored = coordinator_view(cluster, table_id)
    wait_until(lambda: held_version(cluster, handle, table_id) >= stored["version"],
               "the resumed leader getting the attempt's lock view")
    attempts = conn.locks.register_attempts(lease, [0, 1])  # now it answers
    with pytest.raises(LeaseLostError, match="attempt"):
        write(conn, name, lease, value=100, attempt=min(attempts.values()) - 1)
    write(conn, name, lease, value=10, attempt=max(attempts.values()))
    assert conn.table(name).to_arrow().to_pylist() == [{"k": 1, "a": 11, "b": None}]
    conn.locks.release(lease)


def test_versions_keep_growing_across_a_coordinator_restart(cluster, conn):
    name = make_table(conn)
    table_id = conn.table_meta(name).table_id
    zombie = unkept(conn, name, "job", ["a"])
    write(conn, name, zombie)
    before = coordinator_view(cluster, table_id)
    cluster.restart_coordinator(kill=True)  # its queues are gone; the versions are stored
    current = unkept(conn, name, "job", ["a"])
    after = coordinator_view(cluster, table_id)
    assert after["version"] > before["version"]
    for handle in cluster.tablet_servers:  # the first coordinator's last view, arriving late
        with contextlib.closing(internal(cluster, handle.address)) as channel:
            channel.action("install_lock_view", {"view": before})
    with pytest.raises(LeaseLostError):
        write(conn, name, zombie, value=100)
    write(conn, name, current, value=10)
    assert conn.table(name).to_arrow().to_pylist() == [{"k": 1, "a": 11, "b": None}]


def test_a_fencing_call_goes_on_on_the_new_leader_of_a_paused_leaders_bucket(cluster, conn):
    name = make_table(conn, copies=3)
    [leader] = leaders(conn, name)
    zombie = unkept(conn, name, "job", ["a"])
    write(conn, name, zombie)
    with paused(handle_of(cluster, leader)):
        # answered once the bucket has another leader (retried until then), which fetches
        # the view before its first write
        current = unkept(conn, name, "job", ["a"])
        [elected] = leaders(conn, name)
        assert elected != leader
        with pytest.raises(LeaseLostError):
            write(conn, name, zombie, value=100)
        write(conn, name, current, value=10)
    assert conn.table(name).to_arrow().to_pylist() == [{"k": 1, "a": 11, "b": None}]

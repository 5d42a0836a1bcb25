"""A tablet server back under a new process leaves the in-sync sets before it gets any role.

A real coordinator (in this process, on a real embedded metadata store) hears heartbeats from
three tablet servers, as their processes would send them: each names the server and its
incarnation. The servers' address is a real listening socket, so the coordinator's departure
probe finds them there. What a new incarnation must do: every bucket in which another in-sync
replica is live drops the server from its in-sync set, a bucket it led gets the next in-sync
replica as leader under the next epoch, a bucket where it is the last in-sync replica keeps it,
and all of it survives a coordinator restart. The pure rule is checked on its own too.
"""

from __future__ import annotations

import contextlib
import socket

import pyarrow as pa
import pytest

from merge_engine import Schema, TableDescriptor
from tally.errors import InvalidOptionError
from tally.meta import open_store
from tally.server.coordinator.catalog import BucketReplicas
from tally.server.coordinator.coordinator import Coordinator
from tally.server.coordinator.replica_placement import last_standing, without_restarted

SERVERS = ("ts-a", "ts-b", "ts-c")
SCHEMA = Schema.builder().column("k", pa.int64()).column("v", pa.int64()).primary_key("k").build()


@pytest.fixture
def listener():
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    yield f"grpc://127.0.0.1:{sock.getsockname()[1]}"
    sock.close()


@contextlib.contextmanager
def coordinator_on(path):
    store = open_store(data_dir=str(path))
    coordinator = Coordinator(store, "grpc://127.0.0.1:1", session_timeout=60)
    try:
        yield coordinator
    finally:
        coordinator.close()
        store.close()


def heartbeat(coordinator, server, address, incarnation):
    coordinator.heartbeat({"server_id": server, "address": address, "table_ids": [],
                           "problems": [], "incarnation": incarnation})


def replicas(coordinator, name="default.t") -> list[BucketReplicas]:
    return [BucketReplicas(leader, tuple(r), tuple(isr), epoch) for _p, _b, leader, r, isr, epoch
            in coordinator.replicas.bucket_replicas({"name": name})]


def create(coordinator, name="default.t", **properties):
    descriptor = TableDescriptor(SCHEMA, bucket_count=3,
                                 properties={"table.replication.factor": "3", **properties})
    coordinator.create_table({"name": name, "descriptor": descriptor.to_json()})


def test_a_new_incarnation_leaves_the_in_sync_sets_and_its_leadership(tmp_path, listener):
    with coordinator_on(tmp_path) as coordinator:
        for server in SERVERS:
            heartbeat(coordinator, server, listener, "first")
        create(coordinator, **{"table.replication.lag-time-ms": "2500"})
        before = replicas(coordinator)
        led = {r.leader: b for b, r in enumerate(before)}
        assert set(led) == set(SERVERS)

        heartbeat(coordinator, "ts-c", listener, "first")  # the same process: nothing changes
        assert replicas(coordinator) == before

        roles = coordinator.replicas.server_buckets({"server_id": "ts-c",
                                                     "incarnation": "second"})
        after = replicas(coordinator)
        for b, (old, new) in enumerate(zip(before, after)):
            assert "ts-c" not in new.isr and new.replicas == old.replicas
            if old.leader == "ts-c":  # led elsewhere, under the next epoch
                assert new.leader in old.isr and new.leader != "ts-c"
                assert new.leader_epoch == old.leader_epoch + 1
            else:
                assert (new.leader, new.leader_epoch) == (old.leader, old.leader_epoch)
        # the roles it is given already say so
        assert all(role["leader"] != "ts-c" and "ts-c" not in role["isr"]
                   for role in roles["buckets"])
        assert {role["lag_time_ms"] for role in roles["buckets"]} == {2500}
        # its heartbeat under the same new incarnation is no second restart
        heartbeat(coordinator, "ts-c", listener, "second")
        assert replicas(coordinator) == after
        lagging = {s["server_id"]: s["out_of_sync"] for s in coordinator.list_servers({})}
        assert len(lagging["ts-c"]) == 3 and lagging["ts-a"] == []

    # a coordinator that restarted still knows which process it heard last
    with coordinator_on(tmp_path) as coordinator:
        for server in ("ts-a", "ts-b"):
            heartbeat(coordinator, server, listener, "first")
        heartbeat(coordinator, "ts-c", listener, "second")
        assert replicas(coordinator) == after
        heartbeat(coordinator, "ts-a", listener, "third")
        assert all("ts-a" not in r.isr for r in replicas(coordinator))


def test_the_last_in_sync_replica_standing_stays_in_sync(tmp_path, listener):
    with coordinator_on(tmp_path) as coordinator:
        for server in SERVERS:
            heartbeat(coordinator, server, listener, "first")
        create(coordinator)
        b, r = next((b, r) for b, r in enumerate(replicas(coordinator)) if r.leader == "ts-a")
        # its leader took its followers out (they lagged): it alone holds every write
        coordinator.replicas.alter_isr({"table_id": 1, "partition_id": 0, "bucket": b,
                                        "leader": "ts-a", "leader_epoch": r.leader_epoch,
                                        "isr": ["ts-a"], "current_isr": list(r.isr)})
        heartbeat(coordinator, "ts-a", listener, "second")
        kept = replicas(coordinator)[b]
        assert (kept.leader, kept.isr, kept.leader_epoch) == ("ts-a", ("ts-a",), r.leader_epoch)


def test_an_in_sync_change_proposed_from_a_stale_set_changes_nothing(tmp_path, listener):
    with coordinator_on(tmp_path) as coordinator:
        for server in SERVERS:
            heartbeat(coordinator, server, listener, "first")
        create(coordinator)
        b, r = next((b, r) for b, r in enumerate(replicas(coordinator)) if r.leader == "ts-a")
        heartbeat(coordinator, "ts-b", listener, "second")  # ts-b taken out meanwhile
        current = replicas(coordinator)[b]
        assert "ts-b" not in current.isr
        # the leader, not yet told, proposes from the set it knew: ts-b must not come back
        answer = coordinator.replicas.alter_isr({
            "table_id": 1, "partition_id": 0, "bucket": b, "leader": "ts-a",
            "leader_epoch": r.leader_epoch, "isr": ["ts-a", "ts-b"],
            "current_isr": list(r.isr)})
        assert answer["isr"] == list(current.isr) and replicas(coordinator)[b] == current


@pytest.mark.parametrize("value", ["0", "-5", "ten", "1.5", "86400001"])
def test_a_bad_lag_time_is_refused_at_create_naming_the_option(tmp_path, listener, value):
    with coordinator_on(tmp_path) as coordinator:
        heartbeat(coordinator, "ts-a", listener, "first")
        for partitioned in (False, True):
            schema = SCHEMA if not partitioned else \
                Schema.builder().column("k", pa.int64()).column("p", pa.string()) \
                .primary_key("k", "p").partition_key("p").build()
            descriptor = TableDescriptor(schema, bucket_count=1, properties={
                "table.replication.lag-time-ms": value})
            with pytest.raises(InvalidOptionError, match="table.replication.lag-time-ms"):
                coordinator.create_table({"name": f"default.bad{int(partitioned)}",
                                          "descriptor": descriptor.to_json()})


def test_the_restart_rule_on_its_own():
    r = BucketReplicas("a", ("a", "b", "c"), ("a", "b", "c"), 4)
    live = {"a", "b", "c"}
    assert without_restarted(r, "b", live - {"b"}) == BucketReplicas("a", r.replicas, ("a", "c"), 4)
    assert without_restarted(r, "a", live - {"a"}) == BucketReplicas("b", r.replicas, ("b", "c"), 5)
    # the other in-sync copies are down: it is the last one standing and stays
    alone = BucketReplicas("a", r.replicas, ("a", "b"), 4)
    assert without_restarted(alone, "a", {"c"}) == alone and last_standing(alone, "a", {"c"})
    # out of sync already, or a single copy: nothing to do
    assert without_restarted(alone, "c", {"a", "b"}) == alone
    single = BucketReplicas.single("a")
    assert without_restarted(single, "a", set()) == single and not last_standing(single, "a", set())

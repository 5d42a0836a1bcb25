"""Crashes and restarts: restart coordinators and whole clusters, servers leaving and joining.

kill -9 of a tablet server during writes lives in tests/reliability/test_kill9.py (30 trials per
metadata store at random points, with the writer surviving or dying too).
"""

from __future__ import annotations

import time

import pyarrow as pa

from tally import client
from tally.server import LocalCluster
from tests.cluster import reference_workload


def test_coordinator_restart_keeps_tables_partitions_and_assignments(cluster, conn,
                                                                       table_name):
    conn.admin.create_table(table_name, reference_workload.descriptor(buckets=4))
    data = reference_workload.batches(seed=3, count=2, rows=200)
    writer = conn.table(table_name).upsert_writer()
    writer.upsert(data[0])
    writer.flush()
    before = conn.coordinator_action("table_info", {"name": table_name})
    cluster.restart_coordinator(kill=True)
    after = conn.coordinator_action("table_info", {"name": table_name})
    for field in ("table_id", "descriptor", "partitions", "created_at"):
        assert after[field] == before[field], field
    assert sorted(conn.admin.list_partitions(table_name)) == reference_workload.REGIONS
    # The same writer keeps going across the restart (new partitions still get created).
    writer.upsert(data[1])
    apac = pa.table({"k": [1], "region": ["apac"], "total": [5], "peak": [None],
                     "hits": [None], "label": [None]}, schema=data[0].schema)
    writer.upsert(apac)
    writer.flush()
    expected = reference_workload.fold(data + [apac])
    assert reference_workload.as_state(conn.table(table_name).to_arrow()) == expected


def test_cluster_restart_on_the_same_data_dir(tmp_path, request):
    """Stop a whole cluster and start it again on its data dir: same server identities, same
    tables and data, new ports (run on both metadata stores)."""
    for kind in ("embedded", "zookeeper"):
        zk = None
        if kind == "zookeeper":
            from tests.conftest import zookeeper_chroot

            zk = zookeeper_chroot(request.getfixturevalue("zookeeper"))
        data_dir = str(tmp_path / kind)
        data = reference_workload.batches(seed=5, count=1, rows=500)
        with LocalCluster(data_dir, tablet_servers=2, zookeeper=zk) as first:
            ids = sorted(h.info["server_id"] for h in first.tablet_servers)
            ports = sorted(h.port for h in first.tablet_servers)
            with client.connect(first.url) as conn:
                conn.admin.create_table("default.kept", reference_workload.descriptor(buckets=4))
                w = conn.table("default.kept").upsert_writer()
                w.upsert(data[0])
                offsets = w.flush()
        with LocalCluster(data_dir) as second:  # tablet count and ZooKeeper come from the dir
            assert sorted(h.info["server_id"] for h in second.tablet_servers) == ids
            assert sorted(h.port for h in second.tablet_servers) != ports
            with client.connect(second.url) as conn:
                table = conn.table("default.kept")
                got = reference_workload.as_state(table.to_arrow())
                assert got == reference_workload.fold(data)
                ends = conn.admin.list_offsets("default.kept")
                assert all(ends[key] == end for key, end in offsets.items())


def test_coordinator_notices_tablet_servers_leaving_and_joining(cluster, conn):
    """Killed: gone once its session times out (ZooKeeper ephemeral node or missed
    heartbeats); restarted: live again at its new address."""
    server_id = cluster.tablet_servers[1].info["server_id"]

    def live() -> dict:
        return {s["server_id"]: s["address"] for s in conn.admin.list_servers() if s["live"]}

    assert server_id in live()
    cluster.kill_tablet_server(1)
    deadline = time.monotonic() + 20
    while server_id in live():
        assert time.monotonic() < deadline, "the coordinator never noticed the dead server"
        time.sleep(0.2)
    cluster.start_tablet_server(1)
    assert live()[server_id] == cluster.tablet_servers[1].address

"""A follower whose disk is full leaves the in-sync set; writes go on with 2 of 3 copies.

Three real tablet servers, each keeping its tablets on a small tmpfs of its own
(tests/small_disk.py). One follower's tmpfs is filled: it keeps fetching from the offset it
could not write past, so it stops catching up, and after the table's replica lag time its
leader takes it out of the in-sync set. Every write meanwhile is acknowledged (min in-sync
replicas is 2), the bucket shows the follower out of sync (`tally buckets`, `tally servers`,
`tally describe`, the leader's metrics), and once the disk has room again the follower
catches up and rejoins, holding the same rows as the others. With both followers paused, a
waiting write is refused rather than acknowledged on the leader's copy alone.
"""

from __future__ import annotations

import json
import os
import signal
import urllib.request

import pyarrow as pa
import pytest
from prometheus_client.parser import text_string_to_metric_families

from merge_engine import Schema, TableDescriptor
from tally import client
from tally.cli.main import main as tally_main
from tally.errors import NotEnoughReplicasError
from tally.server import LocalCluster
from tests.cluster.replica_checks import leader_index, replica_rows_equal, wait_fully_in_sync
from tests.small_disk import fill, small_filesystem
from tests.waiting import wait_until

SIZE = 48 << 20
LEFT = 1 << 20
TABLE = "default.lagging"
SCHEMA = Schema.builder().column("k", pa.int64()).column("v", pa.string()).primary_key("k").build()
ROWS = 200
LAG_MS = 2000


@pytest.fixture(scope="module")
def disks_cluster(tmp_path_factory):
    data_dir = tmp_path_factory.mktemp("isr-shrink")
    with small_filesystem(str(data_dir / "tablet-0" / "tablets"), SIZE) as d0, \
            small_filesystem(str(data_dir / "tablet-1" / "tablets"), SIZE) as d1, \
            small_filesystem(str(data_dir / "tablet-2" / "tablets"), SIZE) as d2, \
            LocalCluster(str(data_dir), tablet_servers=3, session_timeout=3.0,
                         metrics=True) as cluster:
        yield cluster, (d0, d1, d2)


def rows(first: int) -> pa.Table:
    keys = list(range(first, first + ROWS))
    return pa.table({"k": pa.array(keys, pa.int64()),
                     "v": [os.urandom(500).hex() for _ in keys]})


def metric(url: str, name: str, table: str) -> float:
    with urllib.request.urlopen(url, timeout=30) as answer:
        text = answer.read().decode()
    return sum(s.value for family in text_string_to_metric_families(text)
               for s in family.samples if s.name == name and s.labels.get("table") == table)


def test_a_follower_that_cannot_write_leaves_the_in_sync_set_and_rejoins(disks_cluster,
                                                                         capsys):
    cluster, disks = disks_cluster
    conn = client.connect(cluster.url, retry_timeout=120)
    conn.admin.create_table(TABLE, TableDescriptor(SCHEMA, bucket_count=1, properties={
        "table.replication.lag-time-ms": str(LAG_MS)}))
    replicas = wait_fully_in_sync(conn, TABLE, cluster)[(None, 0)]
    leader = leader_index(cluster, replicas["leader"])
    sick_id = next(s for s in replicas["replicas"] if s != replicas["leader"])
    sick = leader_index(cluster, sick_id)
    writer = conn.table(TABLE).bucket_writer(0)
    acknowledged: dict[int, str] = {}
    next_key = 0

    def write() -> None:  # raises unless acknowledged
        nonlocal next_key
        batch = rows(next_key)
        next_key += ROWS
        writer.put(batch)
        acknowledged.update(zip(batch.column("k").to_pylist(), batch.column("v").to_pylist()))

    write()
    filler = fill(disks[sick], LEFT)
    try:
        # every write is acknowledged, the first ones once the follower has been dropped
        def dropped():
            write()
            r = conn.admin.bucket_replicas(TABLE)[(None, 0)]
            return sick_id not in r["isr"] and r
        after = wait_until(dropped, f"follower {sick_id} leaving the in-sync set",
                           every=0.2)
        assert after["leader"] == replicas["leader"] and len(after["isr"]) == 2
        for _ in range(5):  # and go on being acknowledged by 2 of 3 copies
            write()

        assert tally_main(["buckets", TABLE, "--url", cluster.url]) == 0
        assert "UNDER-REPLICATED" in capsys.readouterr().out
        assert tally_main(["servers", "--url", cluster.url, "--format", "json"]) == 0
        servers = {s["server"]: s for s in map(json.loads, capsys.readouterr().out.splitlines())}
        assert servers[sick_id]["out_of_sync"] == f"bucket 0 of {TABLE}", servers
        assert servers[replicas["leader"]]["out_of_sync"] == ""
        assert tally_main(["describe", TABLE, "--url", cluster.url]) == 0
        assert f"out of sync {sick_id}" in capsys.readouterr().out
        url = cluster.tablet_servers[leader].metrics
        assert metric(url, "tally_under_replicated_buckets", TABLE) == 1
        assert metric(url, "tally_isr_shrinks_total", TABLE) >= 1
    finally:
        os.remove(filler)

    # room again: the follower reopens its bucket, catches up and rejoins
    wait_fully_in_sync(conn, TABLE, cluster)
    assert metric(cluster.tablet_servers[leader].metrics, "tally_isr_expands_total", TABLE) >= 1
    write()
    stored = conn.table(TABLE).to_arrow()
    assert dict(zip(stored.column("k").to_pylist(), stored.column("v").to_pylist())) == \
        acknowledged
    addresses = [cluster.tablet_servers[leader_index(cluster, s)].address
                 for s in replicas["replicas"]]
    replica_rows_equal(cluster, conn, TABLE, 0, addresses)
    conn.close()


def test_a_write_is_not_acknowledged_on_the_leader_alone(disks_cluster):
    """Both followers stop fetching (paused): the in-sync set shrinks to the leader, and the
    write that waited must fail, not be acknowledged on the one copy (min in-sync replicas 2).
    Once they resume, they catch up and writes are acknowledged again."""
    cluster, _ = disks_cluster
    name = "default.alone"
    conn = client.connect(cluster.url, retry_timeout=120)
    conn.admin.create_table(name, TableDescriptor(SCHEMA, bucket_count=1, properties={
        "table.replication.lag-time-ms": str(LAG_MS)}))
    replicas = wait_fully_in_sync(conn, name, cluster)[(None, 0)]
    followers = [cluster.tablet_servers[leader_index(cluster, s)].proc.pid
                 for s in replicas["replicas"] if s != replicas["leader"]]
    conn.table(name).bucket_writer(0).put(rows(0))
    impatient = client.connect(cluster.url, retry_timeout=15)
    for pid in followers:
        os.kill(pid, signal.SIGSTOP)
    try:
        with pytest.raises(NotEnoughReplicasError):
            impatient.table(name).bucket_writer(0).put(rows(ROWS))
        assert conn.admin.bucket_replicas(name)[(None, 0)]["isr"] == [replicas["leader"]]
    finally:
        for pid in followers:
            os.kill(pid, signal.SIGCONT)
        impatient.close()
    wait_fully_in_sync(conn, name, cluster)
    conn.table(name).bucket_writer(0).put(rows(2 * ROWS))
    stored = set(conn.table(name).to_arrow().column("k").to_pylist())
    assert set(range(ROWS)) | set(range(2 * ROWS, 3 * ROWS)) <= stored
    conn.close()

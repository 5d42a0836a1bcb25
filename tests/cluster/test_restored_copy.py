"""A follower whose data directory is replaced by an older copy of itself loses nothing.

Three real tablet servers, one bucket at replication factor 3. A follower's data directory is
copied while it is stopped (a backup); more writes are acknowledged on every copy; the
follower is killed, the old copy put back and the follower started again. Its copy now lacks
writes it had confirmed. It must not count as in sync, nor be elected, until it has caught up:
the moment the coordinator lists it in sync again the leader is killed, and the new leader
(the restored follower comes first in the election order) must hold every acknowledged write.
The oracle: the sum per key equals the number of acknowledged writes that touched it, after
the election and after everything is back.
"""

from __future__ import annotations

import os
import shutil

import pyarrow as pa
import pytest

from merge_engine import Schema, TableDescriptor
from tally import client
from tally.server import LocalCluster
from tests.cluster.replica_checks import leader_index, wait_fully_in_sync
from tests.waiting import wait_until

TABLE = "default.restored"
KEYS = 1000
SCHEMA = (Schema.builder().column("k", pa.int64())
          .agg_column("n", pa.int64(), "sum").column("pad", pa.string())
          .primary_key("k").build())


@pytest.fixture(scope="module")
def trio(tmp_path_factory):
    with LocalCluster(str(tmp_path_factory.mktemp("restored")), tablet_servers=3,
                      session_timeout=3.0) as cluster:
        yield cluster


def increments() -> pa.Table:
    """+1 for every key, with 1 KB of incompressible text each (so a copy that is behind has
    megabytes to fetch and apply)."""
    return pa.table({"k": pa.array(range(KEYS), pa.int64()), "n": pa.array([1] * KEYS, pa.int64()),
                     "pad": [os.urandom(512).hex() for _ in range(KEYS)]})


def sums(conn) -> dict[int, int]:
    stored = conn.table(TABLE).to_arrow()
    return dict(zip(stored.column("k").to_pylist(), stored.column("n").to_pylist()))


def test_a_copy_restored_from_an_older_backup_is_not_elected_while_behind(trio, tmp_path):
    cluster = trio
    conn = client.connect(cluster.url, retry_timeout=120)
    conn.admin.create_table(TABLE, TableDescriptor(SCHEMA, bucket_count=1, properties={
        "table.merge-engine": "aggregation"}))
    replicas = wait_fully_in_sync(conn, TABLE, cluster)[(None, 0)]
    # the follower the election tries first once the leader is gone
    restored_id = next(s for s in replicas["isr"] if s != replicas["leader"])
    restored = leader_index(cluster, restored_id)
    writer = conn.table(TABLE).bucket_writer(0)
    acknowledged = 0

    def write(times: int) -> None:
        nonlocal acknowledged
        for _ in range(times):
            writer.put(increments())  # raises unless acknowledged
            acknowledged += 1

    write(2)
    wait_fully_in_sync(conn, TABLE, cluster)
    cluster.stop_tablet_server(restored)
    backup = str(tmp_path / "backup")
    shutil.copytree(cluster.tablet_servers[restored].data_dir, backup)
    cluster.start_tablet_server(restored)
    wait_fully_in_sync(conn, TABLE, cluster)

    write(10)  # on every copy, the restored one's included
    wait_fully_in_sync(conn, TABLE, cluster)
    cluster.kill_tablet_server(restored)
    data_dir = cluster.tablet_servers[restored].data_dir
    shutil.rmtree(data_dir)
    shutil.copytree(backup, data_dir)
    cluster.start_tablet_server(restored)

    # the moment it counts as in sync again, its leader goes
    wait_until(lambda: restored_id in conn.admin.bucket_replicas(TABLE)[(None, 0)]["isr"],
               f"the restored copy on {replicas['leader']}'s bucket catching up", every=0.01)
    old_leader = leader_index(cluster, replicas["leader"])
    cluster.kill_tablet_server(old_leader)
    after = wait_until(lambda: (r := conn.admin.bucket_replicas(TABLE)[(None, 0)])["leader"]
                       not in (None, replicas["leader"]) and r, "a new leader")
    assert after["leader_epoch"] > replicas["leader_epoch"]
    assert sums(conn) == {k: acknowledged for k in range(KEYS)}  # nothing acknowledged lost

    cluster.start_tablet_server(old_leader)
    wait_fully_in_sync(conn, TABLE, cluster)
    write(1)
    assert sums(conn) == {k: acknowledged for k in range(KEYS)}
    conn.close()

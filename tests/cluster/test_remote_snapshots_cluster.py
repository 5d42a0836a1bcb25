"""Remote snapshots on a real 3-server cluster: leaders upload and register snapshots and
segments; a follower whose disk is wiped (kill -9, data directory deleted) is rebuilt from the
newest snapshot when the leader's log no longer starts at 0; a bucket whose three copies are
all wiped is restored with the lost offsets stated exactly; a deposed leader can neither
register nor outrank the current leader's snapshots.
"""

from __future__ import annotations

import os
import shutil

import pytest

import tally
from tally.errors import FencedLeaderEpochError
from tally.server import LocalCluster
from tally.server.remote.snapshots import BucketPath, RemoteSnapshots
from tally.wire.channel import FlightChannel
from tests.cluster.replica_checks import (copies_of, digest, leader_index, replica_rows_equal,
                                          restart_stopped_servers, wait_fully_in_sync)
from tests.cluster.test_replication import make_table, totals, write
from tests.waiting import wait_until


@pytest.fixture(scope="module")
def remote_dir(tmp_path_factory):
    return str(tmp_path_factory.mktemp("remote"))


@pytest.fixture(scope="module")
def trio(tmp_path_factory, remote_dir):
    data_dir = tmp_path_factory.mktemp("snapshotting")
    with LocalCluster(str(data_dir), tablet_servers=3, session_timeout=3.0,
                      replica_replace_after=3.0, remote_dir=remote_dir,
                      snapshot_interval=1.0, segment_interval=0.5) as cluster:
        yield cluster


@pytest.fixture
def conn(trio):
    with tally.connect(trio.url, retry_timeout=120) as c:
        yield c
    restart_stopped_servers(trio)


def registered(conn, name: str, bucket: int = 0) -> dict:
    return conn.admin.bucket_snapshots(name)[(None, bucket)]


def leader_of(conn, name: str, bucket: int = 0) -> dict:
    return wait_until(lambda: (r := conn.admin.bucket_replicas(name)[(None, bucket)])
                      ["leader"] and r, f"a leader of bucket {bucket} of {name}")


def leader_log_end(cluster, conn, name: str) -> int:
    r = leader_of(conn, name)
    address = cluster.tablet_servers[leader_index(cluster, r["leader"])].address
    return digest(cluster, address, conn.table_meta(name).table_id, 0, 0)["log_end"]


def test_leaders_upload_and_register_snapshots_and_segments(trio, conn, remote_dir):
    name = make_table(conn, buckets=2)
    for i in range(3):
        write(conn, name, list(range(50)), 1, f"w{i}")
    table_id = conn.table_meta(name).table_id
    for bucket in range(2):
        def caught_up(bucket=bucket):
            record = registered(conn, name, bucket)
            end = record.get("high_watermark")
            return end and record.get("snapshot_offset") == end and \
                record.get("segment_end") == end and record
        record = wait_until(caught_up, f"bucket {bucket}'s snapshot and log registered")
        stored = RemoteSnapshots(remote_dir).latest(BucketPath(table_id, 0, bucket))
        assert stored is not None
        assert (stored.snapshot_id, stored.offset) == (record["snapshot_id"],
                                                       record["snapshot_offset"])
        assert stored.leader_epoch == record["leader_epoch"] == \
            conn.admin.bucket_replicas(name)[(None, bucket)]["leader_epoch"]


def test_a_wiped_follower_is_rebuilt_from_the_newest_snapshot(trio, conn):
    name = make_table(conn, buckets=1, **{"table.kv.buffer-size": "1kb"})
    for i in range(4):
        write(conn, name, list(range(i, 300, 2)), i + 1, f"w{i}")
    end = leader_log_end(trio, conn, name)
    wait_until(lambda: registered(conn, name).get("snapshot_offset") == end,
               "a snapshot at the log end registered")
    # the log alone can no longer rebuild a copy: it starts at the snapshot's offset
    assert conn.admin.truncate_log(name, 0, end, force=True) == end
    before = leader_of(conn, name)
    victim = next(s for s in before["replicas"] if s != before["leader"])
    index = leader_index(trio, victim)
    trio.kill_tablet_server(index)
    shutil.rmtree(trio.tablet_servers[index].data_dir)
    trio.start_tablet_server(index)  # a new identity: its server.json is gone
    newcomer = trio.tablet_servers[index].info["server_id"]
    assert newcomer != victim
    wait_until(lambda: newcomer in conn.admin.bucket_replicas(name)[(None, 0)]["replicas"],
               "the coordinator re-creating the wiped copy on the new server")
    write(conn, name, list(range(300)), 100, "after")
    wait_fully_in_sync(conn, name)
    # an admin truncation cuts the leader's log only: the other follower's log starts at 0;
    # the rebuilt one's at 0 too when it took the snapshot made before the truncation, or at
    # a later snapshot's offset when the uploader made one since; rows are equal either way
    table_id = conn.table_meta(name).table_id
    copies = copies_of(trio, table_id, 0, 0, conn=conn, name=name)
    leader = trio.tablet_servers[leader_index(trio, before["leader"])].address
    found = replica_rows_equal(trio, conn, name, 0, [a for a in copies if a != leader])
    assert trio.tablet_servers[index].address in copies
    assert found[0]["row_count"] == 300
    assert digest(trio, leader, table_id, 0, 0)["rows"] == found[0]["rows"]
    with open(os.path.join(trio.tablet_servers[index].data_dir, "server.log")) as f:
        assert "rebuilt from remote snapshot" in f.read()


def test_a_deposed_leader_can_neither_register_nor_outrank_the_new_leader(trio, conn,
                                                                           remote_dir):
    name = make_table(conn, buckets=1)
    write(conn, name, [1, 2, 3], 1, "first")
    old = leader_of(conn, name)
    trio.kill_tablet_server(leader_index(trio, old["leader"]))
    new = wait_until(lambda: (r := conn.admin.bucket_replicas(name)[(None, 0)])["leader"]
                     not in (None, old["leader"]) and r, "a new leader elected")
    write(conn, name, [1, 2, 3], 10, "second")
    end = leader_log_end(trio, conn, name)
    record = wait_until(lambda: (r := registered(conn, name)).get("snapshot_offset") == end
                        and r, "the new leader's snapshot registered")
    assert record["leader_epoch"] == new["leader_epoch"] > old["leader_epoch"]

    table_id = conn.table_meta(name).table_id
    channel = FlightChannel(trio.url, trio.cluster_token, timeout=30, tls=trio.tls)
    try:
        with pytest.raises(FencedLeaderEpochError, match="nothing was registered"):
            channel.action("snapshot_register", {
                "table_id": table_id, "partition_id": 0, "bucket": 0, "leader": old["leader"],
                "leader_epoch": old["leader_epoch"], "high_watermark": end + 1000,
                "segment_end": end + 1000, "snapshot": {"snapshot_id": 1, "offset": end + 1000}})
    finally:
        channel.close()
    # the new leader's own uploads and reports may move it on meanwhile; nothing of the
    # deposed leader's registration may show
    after = registered(conn, name)
    assert after["leader_epoch"] == record["leader_epoch"]
    assert after["snapshot_offset"] == end and after.get("segment_end", 0) <= end
    assert after.get("high_watermark", 0) <= end

    # what the deposed leader's late upload would do: a snapshot under its old epoch
    remote = RemoteSnapshots(remote_dir)
    bucket = BucketPath(table_id, 0, 0)
    current = remote.latest(bucket)
    stale = remote.snapshots(bucket)[0]
    work = os.path.join(trio.data_dir, "zombie-checkpoint")
    remote.download(stale, work)
    zombie = remote.upload(bucket, work, stale.offset, leader_epoch=old["leader_epoch"])
    assert zombie.snapshot_id < current.snapshot_id
    assert remote.latest(bucket) == current


def test_a_bucket_whose_every_copy_is_wiped_is_restored_stating_what_was_lost(tmp_path,
                                                                            capsys):
    from tally.cli.main import main

    remote = str(tmp_path / "remote")
    with LocalCluster(str(tmp_path / "cluster"), tablet_servers=3, session_timeout=3.0,
                      remote_dir=remote, snapshot_interval=3600,
                      segment_interval=3600) as cluster, \
            tally.connect(cluster.url, retry_timeout=120) as conn:
        def upload(segments_only: bool) -> None:
            r = leader_of(conn, name)
            address = cluster.tablet_servers[leader_index(cluster, r["leader"])].address
            channel = FlightChannel(address, cluster.cluster_token, timeout=120)
            try:
                channel.action("upload_snapshots", {"segments_only": segments_only})
            finally:
                channel.close()

        name = make_table(conn, buckets=1)
        write(conn, name, list(range(20)), 1, "a")
        upload(segments_only=False)                # a snapshot at the end of a
        snapshot_offset = leader_log_end(cluster, conn, name)
        write(conn, name, list(range(10)), 10, "b")
        upload(segments_only=True)                 # b only in a remote segment
        uploaded_end = leader_log_end(cluster, conn, name)
        kept = totals(conn, name)
        write(conn, name, list(range(5)), 100, "c")  # acknowledged, never uploaded
        acknowledged = leader_log_end(cluster, conn, name)
        record = wait_until(lambda: (r := registered(conn, name)).get("high_watermark")
                            == acknowledged and r, "the leader reporting its high watermark")
        assert (record["snapshot_offset"], record["segment_end"]) == (snapshot_offset,
                                                                      uploaded_end)

        old = leader_of(conn, name)
        for i, handle in enumerate(cluster.tablet_servers):
            cluster.kill_tablet_server(i)
            shutil.rmtree(handle.data_dir)
        for i in range(3):
            cluster.start_tablet_server(i, wait=False)
        cluster.wait_for_tablet_servers()
        wait_until(lambda: conn.admin.bucket_replicas(name)[(None, 0)]["leader"] is None,
                   "the bucket offline: no copy of it is live")

        assert main(["restore", name, "--bucket", "0", "--url", cluster.url]) == 0
        message = capsys.readouterr().out
        assert f"LOST offsets [{uploaded_end}, {acknowledged})" in message, message
        assert f"snapshot {record['snapshot_id']} (offset {snapshot_offset})" in message
        with open(os.path.join(cluster.coordinator.data_dir, "server.log")) as f:
            assert f"LOST offsets [{uploaded_end}, {acknowledged})" in f.read()

        after = leader_of(conn, name)
        assert after["leader_epoch"] > old["leader_epoch"]
        assert not set(after["replicas"]) & set(old["replicas"])
        assert totals(conn, name) == kept
        assert leader_log_end(cluster, conn, name) == uploaded_end
        wait_fully_in_sync(conn, name)
        copies = copies_of(cluster, conn.table_meta(name).table_id, 0, 0, conn=conn, name=name)
        replica_rows_equal(cluster, conn, name, 0, copies)
        # the restored bucket takes writes again, and a second restore is refused
        write(conn, name, [0], 1000, "d")
        assert totals(conn, name)[0] == kept[0] + 1000
        assert main(["restore", name, "--bucket", "0", "--url", cluster.url]) != 0
        assert "its copies are not lost" in capsys.readouterr().err

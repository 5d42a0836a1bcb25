"""A tablet server whose disk fills up: typed errors, an unhealthy server, writes that resume.

The tablet server's tablets live on a small tmpfs (tests/small_disk.py) with a filler file on
it. Writes fill the rest; the refused one must be a DiskFullError naming the bucket and no
path, the server must say it is unhealthy (list_servers, `tally servers`) while staying live,
and once the filler is deleted it must reopen its buckets by itself (same process, no restart)
and take writes again, with exactly the acknowledged writes in the table.
"""

from __future__ import annotations

import os
import re

import pyarrow as pa
import pytest

from merge_engine import Schema, TableDescriptor
from tally import client
from tally.cli.main import main as tally_main
from tally.errors import DiskFullError
from tally.server import LocalCluster
from tally.wire.bucket_hash import bucket_ids
from tests import waiting
from tests.small_disk import fill, small_filesystem

SIZE = 48 << 20
LEFT_FOR_WRITES = 12 << 20  # the filler is larger: deleting it leaves room for every reopen
BUCKETS = 2
ROWS_PER_WRITE = 200
TABLE = "default.filled"
SCHEMA = Schema.builder().column("k", pa.int64()).column("v", pa.string()).primary_key("k").build()
DEADLINE = 60.0


@pytest.fixture
def full_disk_cluster(tmp_path, metadata_store):
    """A cluster whose one tablet server keeps its tablets on a small tmpfs (the rest of its
    data dir, its log included, stays on the ordinary disk); (cluster, the tmpfs directory)."""
    data_dir = tmp_path / "cluster"
    with small_filesystem(str(data_dir / "tablet-0" / "tablets"), SIZE) as tablets:
        with LocalCluster(str(data_dir), tablet_servers=1, zookeeper=metadata_store) as cluster:
            yield cluster, tablets


def rows_of_bucket(bucket: int, first_key: int) -> pa.Table:
    """About ROWS_PER_WRITE new keys of `bucket` from `first_key` on, with 1 KB of random
    text each (so nothing compresses the disk's filling away)."""
    keys = pa.array(range(first_key, first_key + 2 * ROWS_PER_WRITE), pa.int64())
    keys = keys.filter(pa.array(bucket_ids(pa.table({"k": keys}), ["k"], BUCKETS) == bucket))
    return pa.table({"k": keys, "v": [os.urandom(500).hex() for _ in range(len(keys))]})


def wait_until(condition, what: str):
    return waiting.wait_until(condition, what, deadline=DEADLINE, every=0.2)


def server_state(conn) -> dict:
    [server] = conn.admin.list_servers()
    return server


def test_a_full_disk_is_reported_and_writes_resume_when_space_returns(full_disk_cluster,
                                                                       capsys):
    cluster, tablets = full_disk_cluster
    pid = cluster.tablet_servers[0].proc.pid
    conn = client.connect(cluster.url, retry_timeout=DEADLINE)
    conn.admin.create_table(TABLE, TableDescriptor(SCHEMA, bucket_count=BUCKETS))
    table = conn.table(TABLE)
    writers = [table.bucket_writer(b) for b in range(BUCKETS)]
    filler = fill(tablets, LEFT_FOR_WRITES)

    acknowledged: dict[int, str] = {}
    refusals: dict[int, DiskFullError] = {}
    next_key = 0
    for _ in range(10_000):  # until every bucket has been refused a write
        if len(refusals) == BUCKETS:
            break
        for bucket, writer in enumerate(writers):
            rows = rows_of_bucket(bucket, next_key)
            next_key += 2 * ROWS_PER_WRITE
            try:
                writer.put(rows)
            except DiskFullError as e:
                refusals[bucket] = e
                continue
            acknowledged.update(zip(rows.column("k").to_pylist(),
                                    rows.column("v").to_pylist()))
    assert len(refusals) == BUCKETS, "the disk never filled"
    assert acknowledged
    for bucket, error in refusals.items():
        assert re.fullmatch(rf"bucket {bucket} of {TABLE}: no space left on device.*",
                            str(error)), error
        assert "/" not in str(error)

    # Unhealthy, but live: every failed bucket is named, and reads still work.
    unhealthy = wait_until(
        lambda: (s := server_state(conn))["live"] and not s["healthy"]
        and len(s["problems"]) == BUCKETS and s, "the server reporting itself unhealthy")
    assert all("no space left on device" in p and "/" not in p for p in unhealthy["problems"])
    assert tally_main(["servers", "--url", cluster.url]) == 0
    printed = capsys.readouterr().out
    assert "UNHEALTHY" in printed and f"bucket 0 of {TABLE}: no space left on device" in printed
    some_key = next(iter(acknowledged))
    assert table.lookup({"k": some_key}) == {"k": some_key, "v": acknowledged[some_key]}
    with pytest.raises(DiskFullError):
        writers[0].put(rows_of_bucket(0, next_key))
    next_key += 2 * ROWS_PER_WRITE

    os.remove(filler)
    wait_until(lambda: server_state(conn)["healthy"], "the server reopening its buckets")
    assert cluster.tablet_servers[0].proc.pid == pid and cluster.tablet_servers[0].running
    for bucket, writer in enumerate(writers):  # the same writers: nothing to redo on the client
        rows = rows_of_bucket(bucket, next_key)
        next_key += 2 * ROWS_PER_WRITE
        writer.put(rows)
        acknowledged.update(zip(rows.column("k").to_pylist(), rows.column("v").to_pylist()))

    stored = table.to_arrow()
    assert dict(zip(stored.column("k").to_pylist(), stored.column("v").to_pylist())) \
        == acknowledged
    assert tally_main(["servers", "--url", cluster.url]) == 0
    assert "UNHEALTHY" not in capsys.readouterr().out
    conn.close()

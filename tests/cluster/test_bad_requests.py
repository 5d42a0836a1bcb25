"""Bad input over the wire: a typed error naming the problem, nothing applied, still serving.

Client-side checks catch most mistakes before sending; these tests also go around the client
(raw Flight requests) to prove the servers refuse the same things on their own.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from tally import client
from tally.errors import (AuthenticationError, InvalidInputError, NotFoundError,
                          OffsetOutOfRangeError, SchemaError, StaleMetadataError)
from tally.server import LocalCluster
from tally.wire.bucket_hash import bucket_ids
from tally.wire.channel import FlightChannel
from tests.cluster import reference_workload


@pytest.fixture
def table(conn, table_name):
    conn.admin.create_table(table_name, reference_workload.descriptor(buckets=4))
    t = conn.table(table_name)
    w = t.upsert_writer()
    w.upsert(reference_workload.batches(seed=1, count=1, rows=100)[0])
    w.flush()
    return t


def raw_put(conn, table, rows: pa.Table, bucket: int, partition="eu", **header):
    """A write straight to the tablet server of (partition, bucket), skipping the client."""
    route = conn.table_meta(table.name).route(partition, bucket)
    channel = FlightChannel(route.address)
    try:
        return channel.put({"op": "put", **route.header(), **header}, rows)
    finally:
        channel.close()


def rows_for_bucket(table, bucket: int, n: int = 3, **overrides) -> pa.Table:
    """Rows of partition 'eu' whose keys do hash to `bucket`."""
    candidates = pa.table({"k": pa.array(range(1000), pa.int64()), "region": ["eu"] * 1000})
    ks = np.flatnonzero(bucket_ids(candidates, ["k"], 4) == bucket)[:n].tolist()
    data = {"k": ks, "region": ["eu"] * n, "total": [1] * n, "peak": [1.0] * n,
            "hits": [1] * n, "label": ["x"] * n}
    data.update(overrides)
    return pa.table(data)


def assert_unchanged_and_serving(conn, table, before):
    assert table.to_arrow().equals(before)
    w = table.upsert_writer()
    w.upsert([{"k": 999_999, "region": "eu", "total": 1}])
    w.flush()
    assert table.lookup({"k": 999_999, "region": "eu"})["total"] == 1
    w.delete([{"k": 999_999, "region": "eu"}])  # ignored by aggregation tables: still there
    w.flush()


def test_wrong_schema(conn, table):
    before = table.to_arrow()
    with pytest.raises(InvalidInputError, match="Unknown column 'nope'"):
        table.upsert_writer().upsert([{"k": 1, "region": "eu", "nope": 3}])
    with pytest.raises(InvalidInputError, match="total"):
        table.upsert_writer().upsert([{"k": 1, "region": "eu", "total": "many"}])
    bad = rows_for_bucket(table, 0, total=["a", "b", "c"])
    with pytest.raises(InvalidInputError):
        raw_put(conn, table, bad, bucket=0)
    unknown = rows_for_bucket(table, 0).append_column("nope", pa.array([1, 2, 3]))
    with pytest.raises(InvalidInputError, match="nope"):
        raw_put(conn, table, unknown, bucket=0)
    assert_unchanged_and_serving(conn, table, before)


def test_unknown_table(conn, table):
    before = table.to_arrow()
    with pytest.raises(NotFoundError, match="default.missing"):
        conn.table("default.missing")
    with pytest.raises(NotFoundError, match="database 'nodb' does not exist"):
        conn.admin.create_table("nodb.t", reference_workload.descriptor())
    with pytest.raises(InvalidInputError, match="<database>.<table>"):
        conn.table("no_dot")
    route = conn.table_meta(table.name).route("eu", 0)
    channel = FlightChannel(route.address)
    with pytest.raises(StaleMetadataError, match="table id 987654"):
        channel.put({"op": "put", "table_id": 987654, "partition_id": route.partition_id,
                     "bucket": 0}, rows_for_bucket(table, 0))
    channel.close()
    assert_unchanged_and_serving(conn, table, before)


def test_null_key(conn, table):
    before = table.to_arrow()
    with pytest.raises(InvalidInputError, match="'k' is null"):
        table.upsert_writer().upsert([{"k": None, "region": "eu", "total": 1}])
    with pytest.raises(InvalidInputError, match="null"):
        table.lookup({"k": None, "region": "eu"})
    bad = rows_for_bucket(table, 1, k=pa.array([None, None, None], pa.int64()))
    with pytest.raises(InvalidInputError, match="null"):
        raw_put(conn, table, bad, bucket=1)
    assert_unchanged_and_serving(conn, table, before)


def test_wrong_bucket_and_wrong_partition(conn, table):
    before = table.to_arrow()
    rows = rows_for_bucket(table, 2)
    with pytest.raises(InvalidInputError, match="belongs to bucket 2"):
        raw_put(conn, table, rows, bucket=3)
    us_rows = rows.set_column(1, "region", pa.array(["us"] * 3))
    with pytest.raises(InvalidInputError, match="partition 'us'"):
        raw_put(conn, table, us_rows, bucket=2)
    # A bucket sent to a server that does not host it.
    meta = conn.table_meta(table.name)
    here, there = meta.route("eu", 0), meta.route("eu", 1)
    assert here.address != there.address
    channel = FlightChannel(there.address)
    with pytest.raises(StaleMetadataError, match="is held by"):
        channel.put({"op": "put", **here.header()}, rows_for_bucket(table, 0))
    channel.close()
    assert_unchanged_and_serving(conn, table, before)


def test_a_changelog_end_past_the_log_is_refused_not_cut_short(conn, table):
    offsets = conn.admin.list_log_offsets(table.name, settle=True)
    (partition, bucket), (_, end) = max(offsets.items(), key=lambda item: item[1][1])
    assert end > 0 and table.changelog(bucket, 0, end, partition=partition).num_rows == end
    with pytest.raises(OffsetOutOfRangeError, match="past the log end offset"):
        table.changelog(bucket, 0, end + 1_000_000_000, partition=partition)


def test_garbage_descriptors(conn, table_name):
    for garbage in ["{not json", "[]", '{"schema": 3}', '{"schema": {"columns": []}}']:
        with pytest.raises(SchemaError):
            conn.admin.create_table(table_name, garbage)
    with pytest.raises(InvalidInputError, match="TableDescriptor"):
        conn.admin.create_table(table_name, {"columns": []})
    from merge_engine import Schema, TableDescriptor

    no_key = TableDescriptor(Schema.builder().column("a", pa.int64()).build())
    with pytest.raises(SchemaError, match="primary key"):
        conn.admin.create_table(table_name, no_key)
    with pytest.raises(NotFoundError):
        conn.admin.describe_table(table_name)
    with pytest.raises(InvalidInputError, match="unknown action"):
        conn.coordinator_action("no_such_action")


def test_oversized_and_malformed_requests(conn, table):
    before = table.to_arrow()
    n = 200_000  # ~7 MB of rows, above the cluster's 6 MiB limit
    big = rows_for_bucket(table, 0, n=1)
    big = pa.table({c: pa.array(big.column(c).to_pylist() * n, big.schema.field(c).type)
                    for c in big.column_names})
    with pytest.raises(InvalidInputError, match="exceeds the server's limit"):
        raw_put(conn, table, big, bucket=0)
    with pytest.raises(InvalidInputError, match="unknown write operation"):
        raw_put(conn, table, rows_for_bucket(table, 0), bucket=0, op="merge")
    route = conn.table_meta(table.name).route("eu", 0)
    channel = FlightChannel(route.address)
    with pytest.raises(InvalidInputError, match="malformed"):
        channel.put({"op": "put"}, rows_for_bucket(table, 0))
    channel.close()
    assert_unchanged_and_serving(conn, table, before)
    # Through the client the same rows are split into requests under the limit and land.
    w = table.upsert_writer()
    w.upsert(big)
    w.flush()
    assert table.lookup({"k": big.column("k")[0].as_py(), "region": "eu"})["hits"] >= n


def test_credentials_are_enforced(tmp_path):
    with LocalCluster(str(tmp_path), tablet_servers=1, authenticate=True) as cluster:
        with pytest.raises(AuthenticationError):
            client.connect(cluster.url)
        with pytest.raises(AuthenticationError):
            client.connect(cluster.url, token="wrong")
        with client.connect(cluster.url, token=cluster.tokens["admin"]) as conn:
            conn.admin.create_table("default.a", reference_workload.descriptor(buckets=2))
            w = conn.table("default.a").upsert_writer()
            w.upsert([{"k": 1, "region": "eu", "total": 2}])
            w.flush()
            route = conn.table_meta("default.a").route("eu", 0)
            assert conn.table("default.a").lookup({"k": 1, "region": "eu"})["total"] == 2
        tablet = FlightChannel(route.address)  # tablet servers check the credential too
        with pytest.raises(AuthenticationError):
            tablet.action("offsets", {"table_id": 1, "buckets": []})
        tablet.close()

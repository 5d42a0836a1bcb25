"""Row TTL through Spark: rows a Spark job wrote expire by the servers' clock (moved here, no
sleeping); `spark.read` stops returning them at once, and after the sweep a changelog read
delivers their -D records marked `_expired`, apart from the deletes a job wrote."""

from __future__ import annotations

import pyarrow as pa
import pytest

import sink
import tally
from tally.server import LocalCluster
from tally.server.clock import SkewedClock
from tally.wire.channel import FlightChannel

SCHEMA = (tally.Schema.builder().column("k", pa.int64())
          .agg_column("n", pa.int64(), tally.AggFunction.SUM).primary_key("k").build())


@pytest.fixture(scope="module")
def timed_cluster(tmp_path_factory):
    data_dir = tmp_path_factory.mktemp("ttl-cluster")
    clock_file = str(data_dir / "clock")
    with LocalCluster(str(data_dir / "cluster"), lock_clock_file=clock_file) as cluster:
        cluster.clock = SkewedClock(clock_file)
        yield cluster


def test_rows_expire_for_spark_reads_and_their_expiry_is_in_the_changelog(spark, timed_cluster):
    sink.register(spark)
    url, name = timed_cluster.url, "default.visits"
    with tally.connect(url) as conn:
        conn.admin.create_table(name, tally.TableDescriptor(SCHEMA, bucket_count=2, properties={
            "table.merge-engine": "aggregation", "table.kv.row-ttl": "1h"}))
    writer = tally.TallySink(url, name)
    writer.write(spark.createDataFrame([(k, 1) for k in range(6)], "k long, n long"))

    def read():
        rows = spark.read.format("tally").option("url", url).option("table", name).load()
        return {r["k"]: r["n"] for r in rows.collect()}

    assert read() == {k: 1 for k in range(6)}
    timed_cluster.clock.advance(3600 - 60)
    try:
        writer.write(spark.createDataFrame([(0, 1)], "k long, n long"))  # key 0 lives on
        timed_cluster.clock.advance(120)                                  # keys 1..5 expire
        assert read() == {0: 2}
        for server in timed_cluster.tablet_servers:
            FlightChannel(server.address).action("expire_rows", {})
        changes = (spark.read.format("tally").option("url", url).option("table", name)
                   .option("changelog", "true").load())
        removed = {r["k"]: r["_expired"] for r in changes.collect() if r["_change_type"] == "-D"}
        assert removed == {k: True for k in range(1, 6)}
        # Written again, an expired key starts over (its old sum does not come back).
        writer.write(spark.createDataFrame([(3, 5)], "k long, n long"))
        assert read() == {0: 2, 3: 5}
    finally:
        timed_cluster.clock.advance(-(3600 + 60))

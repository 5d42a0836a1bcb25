"""format("tally"): batch and streaming writes through the registered Python data source."""

from __future__ import annotations

import pytest

import sink
from tests.spark import sink_data


@pytest.fixture(scope="module")
def registered(spark):
    return sink.register(spark)


def test_batch_write_and_rerun_with_epoch(spark, registered, cluster, conn, table_name):
    sink_data.create_table(conn, table_name)
    rows = sink_data.make_rows(120, 15, seed=9)
    df = spark.createDataFrame(rows, sink_data.SCHEMA_DDL)
    writer = (df.write.format("tally").option("url", cluster.url).option("table", table_name)
              .option("client.column-lock.owner-id", "ds-batch").option("epoch", "0"))
    writer.mode("append").save()
    assert sink_data.table_state(conn, table_name) == sink_data.expected(rows)
    writer.mode("append").save()  # the same epoch again: skipped
    assert sink_data.table_state(conn, table_name) == sink_data.expected(rows)
    assert conn.locks.describe(table_name) == []
    with pytest.raises(Exception, match="only appends"):
        writer.mode("overwrite").save()


def test_streaming_write(spark, registered, cluster, conn, table_name, tmp_path):
    sink_data.create_table(conn, table_name)
    files = sink_data.write_source_files(str(tmp_path / "src"), 3, 30, 8, seed=4)
    query = (spark.readStream.schema(sink_data.SCHEMA_DDL).option("maxFilesPerTrigger", 1)
             .json(str(tmp_path / "src")).writeStream.format("tally")
             .option("url", cluster.url).option("table", table_name)
             .option("checkpointLocation", str(tmp_path / "ckpt"))
             .trigger(availableNow=True).start())
    query.awaitTermination()
    assert query.exception() is None
    rows = [r for f in files for r in f]
    assert sink_data.table_state(conn, table_name) == sink_data.expected(rows)
    owners = [lock["owner_id"] for lock in conn.locks.describe(table_name)]
    assert owners == [f"spark-query:{query.id}/{table_name}/v,c,s,a,l"]

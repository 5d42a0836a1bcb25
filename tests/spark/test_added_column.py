"""A column added to a live table, through Spark: a job written before the addition goes on
writing its columns (the new one stays null, and unwritten, for its rows), a job that selects
the new column writes it, and `spark.read` shows it, for rows written before it existed too."""

from __future__ import annotations

import uuid

import pyarrow as pa
import pytest

import sink
import tally

SCHEMA = (tally.Schema.builder().column("k", pa.int64())
          .agg_column("clicks", pa.int64(), tally.AggFunction.SUM).primary_key("k").build())


@pytest.fixture(scope="module")
def registered(spark):
    return sink.register(spark)


def test_spark_writers_and_readers_across_an_added_column(spark, registered, cluster, conn):
    name = f"default.added_{uuid.uuid4().hex[:10]}"
    conn.admin.create_table(name, tally.TableDescriptor(
        SCHEMA, bucket_count=2, properties={"table.merge-engine": "aggregation"}))
    writer = tally.TallySink(cluster.url, name)
    writer.write(spark.createDataFrame([(k, 1) for k in range(4)], "k long, clicks long"))

    conn.admin.add_column(name, "spend", pa.float64(), agg="sum")
    # The old job's DataFrame has no `spend`: its rows add clicks and leave spend as it is.
    writer.write(spark.createDataFrame([(0, 1), (5, 1)], "k long, clicks long"))
    # A job that knows the new column writes it.
    (spark.createDataFrame([(0, 2, 1.5), (1, 0, 2.0)], "k long, clicks long, spend double")
     .write.format("tally").option("url", cluster.url).option("table", name)
     .mode("append").save())

    read = (spark.read.format("tally").option("url", cluster.url).option("table", name)
            .option("unwritten", "true").load())
    assert dict(read.dtypes)["spend"] == "double"
    rows = {r["k"]: (r["clicks"], r["spend"], sorted(r["_unwritten"])) for r in read.collect()}
    assert rows == {0: (4, 1.5, []), 1: (1, 2.0, []), 2: (1, None, ["spend"]),
                    3: (1, None, ["spend"]), 5: (1, None, ["spend"])}

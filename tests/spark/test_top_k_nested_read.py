"""A Spark read of top_k and nested_update columns: a top_k column is its image bytes, or its
top k items when asked for estimates; a nested_update column is an array of structs."""

from __future__ import annotations

import pyarrow as pa
import pytest

import sink
import tally
from aggfuncs import top_k_items
from tests.spark.sink_data import filled_table

LINE = pa.struct([("sku", pa.string()), ("qty", pa.int64())])
SCHEMA = (tally.Schema.builder().column("k", pa.int64())
          .agg_column("top", pa.binary(), tally.AggFunction.TOP_K, k=2)
          .agg_column("lines", pa.list_(LINE), tally.AggFunction.NESTED_UPDATE, nested_key="sku")
          .primary_key("k").build())


@pytest.fixture(scope="module")
def registered(spark):
    return sink.register(spark)


def test_top_k_reads_as_bytes_or_top_items_and_nested_update_as_structs(spark, registered,
                                                                         cluster, conn):
    table = filled_table(conn, "topread", SCHEMA, 2, [])
    writer = table.upsert_writer()
    writer.upsert([{"k": 1, "top": item, "lines": [{"sku": item, "qty": 1}]}
                   for item in ["a", "b", "a", "c", "a", "b"]])
    writer.flush()
    writer.close()

    def read(**options):
        r = spark.read.format("tally").option("url", cluster.url).option("table", table.name)
        for key, value in options.items():
            r = r.option(key, value)
        return r.load()

    (as_bytes,) = read().collect()
    assert bytes(as_bytes.top) == table.lookup({"k": 1})["top"]
    assert [(line.sku, line.qty) for line in as_bytes.lines] == [("a", 1), ("b", 1), ("c", 1)]
    estimates = read(**{"sketch-estimates": "true"})
    assert dict(estimates.dtypes)["top"] == \
        "array<struct<item:string,estimate:bigint,lower_bound:bigint,upper_bound:bigint>>"
    (row,) = estimates.collect()
    assert [entry.asDict() for entry in row.top] == top_k_items(as_bytes.top, 2) == [
        {"item": "a", "estimate": 3, "lower_bound": 3, "upper_bound": 3},
        {"item": "b", "estimate": 2, "lower_bound": 2, "upper_bound": 2}]

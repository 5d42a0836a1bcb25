"""spark.read.format("tally") with a `filter` that fixes the key's leading columns reads their
key ranges by prefix lookups: the same rows as Spark's own filter over a full read, read by
the prefix requests the plan shows (its parts), one Spark partition per bucket asked. A filter
on other columns stays a scan.
"""

from __future__ import annotations

import json

import pyarrow as pa
import pytest

import sink
import tally
from sink.batch_reader import ReadPlan, TallyBatchReader, plan_schema
from tally.client.prefix_lookups import PrefixRequest
from tally.client.table_scan import ScanPart
from tests.spark.sink_data import filled_table

DAYS = ["d1", "d2", "d3"]
BUCKETS = 3
# the bucket key is (user, item): a prefix of `user` alone names no bucket
SCHEMA = (tally.Schema.builder().column("user", pa.int64()).column("day", pa.string())
          .column("item", pa.int32())
          .agg_column("n", pa.int64(), tally.AggFunction.SUM)
          .agg_column("s", pa.string(), tally.AggFunction.LAST_VALUE)
          .primary_key("user", "day", "item").partition_key("day").build())


@pytest.fixture(scope="module")
def table(spark, cluster):
    sink.register(spark)
    with tally.connect(cluster.url) as conn:
        rows = [{"user": u, "day": d, "item": i, "n": u * 10 + i, "s": "xy"[i % 2]}
                for u in range(10) for d in DAYS for i in range(4)]
        yield filled_table(conn, "prefixread", SCHEMA, BUCKETS, rows)


def options(cluster, table, where: dict | None) -> dict:
    found = {"url": cluster.url, "table": table.name}
    if where is not None:
        found["filter"] = json.dumps(where)
    return found


def load(spark, cluster, table, where: dict | None = None):
    read = spark.read.format("tally")
    for key, value in options(cluster, table, where).items():
        read = read.option(key, value)
    return read.load()


def planned_parts(cluster, table, where: dict) -> list:
    plan = ReadPlan.of(options(cluster, table, where))
    return TallyBatchReader(plan, plan_schema(plan)).parts


def rows_of(df) -> list[tuple]:
    return sorted(tuple(r) for r in df.collect())


@pytest.mark.parametrize("where, spark_filter, parts_asked", [
    ({"user": 7}, "user = 7", {(d, b) for d in DAYS for b in range(BUCKETS)}),
    ({"user": [3, 7], "day": "d2"}, "user IN (3, 7) AND day = 'd2'",
     {("d2", b) for b in range(BUCKETS)}),
    ({"user": 7, "s": "y"}, "user = 7 AND s = 'y'", {(d, b) for d in DAYS for b in range(BUCKETS)}),
])
def test_a_leading_key_filter_reads_by_prefix_lookups(spark, cluster, table, where,
                                                      spark_filter, parts_asked):
    """The plan's parts are prefix requests of the buckets the prefixes may be in (a prefix
    of `user` with `day` fixed: that partition's), one Spark partition per bucket asked, and
    the rows are those Spark's own filter keeps of a full read."""
    parts = planned_parts(cluster, table, where)
    assert parts and all(isinstance(p, PrefixRequest) for p in parts)
    assert {(p.partition, p.bucket) for p in parts} == parts_asked
    pruned = load(spark, cluster, table, where)
    assert pruned.rdd.getNumPartitions() == len(parts_asked)
    expected = rows_of(load(spark, cluster, table).filter(spark_filter))
    assert expected and rows_of(pruned) == expected


def test_other_filters_stay_scans(spark, cluster, table):
    """A filter that does not fix the first key column (`day` alone, the partition key) is
    read as a scan of that partition's buckets, with the same rows as before."""
    parts = planned_parts(cluster, table, {"day": "d3", "item": 1})
    assert parts and all(isinstance(p, ScanPart) for p in parts)
    df = load(spark, cluster, table, {"day": "d3", "item": 1})
    assert rows_of(df) == rows_of(load(spark, cluster, table).filter("day = 'd3' AND item = 1"))

"""spark.read.format("tally"): reads equal `to_arrow()`, one Spark partition per bucket (or
runs of whole buckets with `spark-partitions`), the `columns`/`filter`/`unwritten` options
prune what they say, and a DataFrame reused for a filtered and then an unfiltered query
returns every row to the second (Spark filters are not pushed down: PySpark 4.3 would reuse
the first query's pruned read for the second).
"""

from __future__ import annotations

import decimal
import json

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import sink
import tally
from sink.batch_reader import grouped
from tests.spark.sink_data import filled_table

DAYS = ["d1", "d2"]
SCHEMA = (tally.Schema.builder().column("day", pa.string()).column("k", pa.int64())
          .agg_column("total", pa.int64(), tally.AggFunction.SUM)
          .agg_column("amount", pa.decimal128(12, 2), tally.AggFunction.SUM)
          .agg_column("hits", pa.uint32(), tally.AggFunction.MAX)
          .agg_column("tags", pa.string(), tally.AggFunction.STRING_AGG, distinct=True)
          .primary_key("day", "k").partition_key("day").build())
BUCKETS = 3


@pytest.fixture(scope="module")
def registered(spark):
    return sink.register(spark)


def new_table(conn, rows: list[dict], name: str | None = None):
    return filled_table(conn, "sparkread", SCHEMA, BUCKETS, rows, name)


def reader(spark, cluster, table, **options):
    r = spark.read.format("tally").option("url", cluster.url).option("table", table.name)
    for key, value in options.items():
        r = r.option(key, value)
    return r


def spark_rows(df) -> list[tuple]:
    return sorted(tuple(r) for r in df.collect())


def arrow_rows(table: pa.Table) -> list[tuple]:
    return sorted(tuple(r.values()) for r in table.to_pylist())


row = st.fixed_dictionaries({
    "day": st.sampled_from(DAYS), "k": st.integers(0, 40), "total": st.integers(-50, 50),
    "amount": st.decimals(-1000, 1000, places=2, allow_nan=False, allow_infinity=False),
    "hits": st.integers(0, 2**32 - 1), "tags": st.sampled_from(["a", "b", "c,d", None])})


@settings(max_examples=4, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(rows=st.lists(row, max_size=60))
def test_read_equals_to_arrow(spark, registered, cluster, conn, rows):
    """Property: a Spark read holds exactly `to_arrow()`'s rows, unsigned and decimal columns
    included, in one Spark partition per bucket of every partition."""
    table = new_table(conn, rows)
    df = reader(spark, cluster, table).load()
    assert df.columns == ["day", "k", "total", "amount", "hits", "tags"]
    assert dict(df.dtypes)["hits"] == "bigint"  # uint32 reads as long
    expected = table.to_arrow()
    assert spark_rows(df) == arrow_rows(expected)
    partitions = len(table.meta.partitions)
    assert df.rdd.getNumPartitions() == max(1, partitions * BUCKETS)


@settings(max_examples=4, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(rows=st.lists(row, max_size=60), most=st.integers(1, 8),
       where=st.sampled_from([None, {"day": "d1"}, {"day": "d2", "k": [1, 2, 3, 39]}]))
def test_spark_partitions_group_whole_buckets(spark, registered, cluster, conn, rows, most,
                                              where):
    """Property: with `spark-partitions`, the read still holds exactly `to_arrow()`'s rows (of
    the filter's), in at most that many Spark partitions, each bucket (or lookup request) read
    by one of them."""
    table = new_table(conn, rows)
    options = {"spark-partitions": str(most)}
    if where is not None:
        options["filter"] = json.dumps(where)
    df = reader(spark, cluster, table, **options).load()
    planned = len(table.scan(filter=where).parts)
    assert df.rdd.getNumPartitions() == max(1, min(most, planned))
    assert spark_rows(df) == arrow_rows(table.to_arrow(filter=where))


@given(parts=st.integers(0, 50), most=st.one_of(st.none(), st.integers(1, 60)))
def test_grouped_keeps_every_part_once_in_order(parts, most):
    """Property: runs hold every part exactly once, in order, at most `most` runs (one per part
    without it), none empty, sizes within one of each other."""
    runs = grouped(list(range(parts)), most)
    assert [p for run in runs for p in run] == list(range(parts))
    assert len(runs) == (parts if most is None else min(most, parts))
    assert all(runs) and (not runs or max(map(len, runs)) - min(map(len, runs)) <= 1)


def test_reused_dataframe_filtered_then_unfiltered(spark, registered, cluster, conn):
    """The leak of PySpark 4.3's pushdown returned 1 row instead of all of them here."""
    rows = [{"day": d, "k": k, "total": 1, "amount": decimal.Decimal("1.00"), "hits": k,
             "tags": "x"} for d in DAYS for k in range(30)]
    table = new_table(conn, rows)
    df = reader(spark, cluster, table).load()
    assert df.filter("k = 7 AND day = 'd1'").count() == 1
    assert df.filter("day = 'd2'").count() == 30
    assert df.count() == 60
    assert spark_rows(df) == arrow_rows(table.to_arrow())
    pruned = reader(spark, cluster, table, filter=json.dumps({"day": "d1"})).load()
    assert pruned.filter("k = 3").count() == 1
    assert pruned.count() == 30  # the DataFrame is the filtered table, whatever ran before


def test_partition_and_bucket_filters_prune(spark, registered, cluster, conn):
    rows = [{"day": d, "k": k, "total": k, "amount": decimal.Decimal("0.50"), "hits": 1,
             "tags": "x"} for d in DAYS for k in range(40)]
    table = new_table(conn, rows)
    full = reader(spark, cluster, table).load()
    assert full.rdd.getNumPartitions() == len(DAYS) * BUCKETS

    by_day = reader(spark, cluster, table, filter='{"day": "d2"}').load()
    assert by_day.rdd.getNumPartitions() == BUCKETS  # one partition's buckets only
    assert spark_rows(by_day) == arrow_rows(table.to_arrow(filter={"day": "d2"}))

    ks = [3, 4]
    by_bucket = reader(spark, cluster, table, filter=json.dumps({"k": ks})).load()
    buckets = {table.bucket_of({"day": "d1", "k": k})[1] for k in ks}
    assert by_bucket.rdd.getNumPartitions() == len(DAYS) * len(buckets)
    assert sorted((r.day, r.k) for r in by_bucket.collect()) == \
        sorted((d, k) for d in DAYS for k in ks)

    nothing = reader(spark, cluster, table, filter='{"day": "d9"}').load()
    assert nothing.count() == 0


def test_key_filter_reads_by_lookups(spark, registered, cluster, conn):
    rows = [{"day": "d1", "k": k, "total": k, "amount": decimal.Decimal("2.00"), "hits": 5,
             "tags": "t"} for k in range(50)]
    table = new_table(conn, rows)
    where = {"day": "d1", "k": [2, 9, 77]}  # 77 does not exist
    df = reader(spark, cluster, table, filter=json.dumps(where)).load()
    plan = table.scan(filter=where)
    assert all(p.keys is not None for p in plan.parts)  # lookups, not bucket scans
    assert df.rdd.getNumPartitions() == len(plan.parts) == \
        len({table.bucket_of({"day": "d1", "k": k})[1] for k in where["k"]})
    assert sorted((r.k, r.total) for r in df.collect()) == [(2, 2), (9, 9)]


def test_columns_option_and_user_schema_read_only_those_columns(spark, registered, cluster,
                                                               conn):
    rows = [{"day": "d1", "k": k, "total": k, "amount": decimal.Decimal("1.25"), "hits": 2,
             "tags": "t"} for k in range(10)]
    table = new_table(conn, rows)
    df = reader(spark, cluster, table, columns="tags,k").load()
    assert df.columns == ["tags", "k"]
    assert spark_rows(df) == arrow_rows(table.to_arrow(columns=["tags", "k"]))
    narrow = (spark.read.format("tally").schema("k bigint, total bigint")
              .option("url", cluster.url).option("table", table.name).load())
    assert sorted(tuple(r) for r in narrow.collect()) == [(k, k) for k in range(10)]
    with pytest.raises(Exception, match="unknown column"):
        reader(spark, cluster, table, columns="k,nope").load()
    with pytest.raises(Exception, match="Unknown Tally read option"):
        reader(spark, cluster, table, colums="k").load()


def test_unwritten_only_when_asked(spark, registered, cluster, conn):
    table = new_table(conn, [])
    writer = table.upsert_writer(target_columns=["day", "k", "total"])
    writer.upsert([{"day": "d1", "k": 1, "total": 5}])
    writer.flush()
    writer.close()
    assert "_unwritten" not in reader(spark, cluster, table).load().columns
    df = reader(spark, cluster, table, unwritten="true").load()
    (only,) = df.collect()
    assert only.total == 5 and sorted(only._unwritten) == ["amount", "hits", "tags"]


@pytest.mark.parametrize("options, message", [
    ({"table": "db.t"}, "needs the option 'url'"),
    ({"url": "grpc://x:1"}, "needs the option 'table'"),
    ({"url": "grpc://x:1", "table": "db.t", "filter": "{nope"}, "'filter' must be a JSON"),
    ({"url": "grpc://x:1", "table": "db.t", "filter": "[1]"}, "'filter' must be a JSON object"),
    ({"url": "grpc://x:1", "table": "db.t", "batch-size": "0"}, "'batch-size'"),
    ({"url": "grpc://x:1", "table": "db.t", "batch-size": "many"}, "'batch-size'"),
    ({"url": "grpc://x:1", "table": "db.t", "unwritten": "perhaps"}, "unwritten"),
    ({"url": "grpc://x:1", "table": "db.t", "colums": "k"}, "Unknown Tally read option"),
    ({"url": "grpc://x:1", "table": "db.t", "spark-partitions": "0"}, "'spark-partitions'"),
    ({"url": "grpc://x:1", "table": "db.t", "spark-partitions": "two"}, "'spark-partitions'"),
    ({"url": "grpc://x:1", "table": "db.t", "spark-partitions": "2", "snapshot": "lake"},
     "'spark-partitions' applies to live reads only"),
])
def test_read_options_are_checked(options, message):
    from sink.batch_reader import ReadOptions
    from tally.errors import InvalidOptionError

    with pytest.raises(InvalidOptionError, match=message):
        ReadOptions.parse(options)


def test_a_task_reads_the_planned_table_not_one_recreated_under_its_name(cluster, conn):
    """Tasks read the driver's plan with cached metadata: a table dropped and re-created after
    planning still fails the task with TableRecreatedError, also in a worker whose cache
    already held the old table (this process, where the driver-side plan filled it)."""
    from pyspark.sql.types import LongType, StructField, StructType

    from sink.batch_reader import TallyBatchReader
    from tally.errors import TableRecreatedError

    rows = [{"day": "d1", "k": k, "total": k, "amount": decimal.Decimal("1.00"), "hits": 1,
             "tags": "t"} for k in range(20)]
    table = new_table(conn, rows)
    options = {"url": cluster.url, "table": table.name, "spark-partitions": "1"}
    planned = TallyBatchReader(options, StructType([StructField("k", LongType(), False)]))
    (partition,) = planned.partitions()
    assert sorted(k for b in planned.read(partition) for k in b.column("k").to_pylist()) == \
        list(range(20))
    conn.admin.drop_table(table.name)
    assert new_table(conn, rows, table.name).table_id != table.table_id
    with pytest.raises(TableRecreatedError):
        list(planned.read(partition))

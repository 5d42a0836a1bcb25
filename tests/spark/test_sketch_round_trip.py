"""Sketch columns and Spark: Spark makes the sketch bytes with its own aggregates, Tally merges
them (and raw values the sink writes), Spark's own estimate functions read the stored bytes."""

from __future__ import annotations

import uuid

import pyarrow as pa
import pytest
from pyspark.sql import functions as F

import sink
import tally
from aggfuncs import hll_sketch_estimate, kll_sketch_quantile, theta_sketch_estimate

SCHEMA = (tally.Schema.builder().column("g", pa.int64())
          .agg_column("users", pa.binary(), tally.AggFunction.HLL_SKETCH)
          .agg_column("users_theta", pa.binary(), tally.AggFunction.THETA_SKETCH)
          .agg_column("latency", pa.binary(), tally.AggFunction.KLL_SKETCH)
          .agg_column("size", pa.binary(), tally.AggFunction.KLL_SKETCH, items="bigint")
          .primary_key("g").build())


@pytest.fixture(scope="module")
def registered(spark):
    return sink.register(spark)


@pytest.fixture
def table(conn):
    name = f"sketches.t_{uuid.uuid4().hex[:10]}"
    conn.admin.create_database("sketches", ignore_if_exists=True)
    conn.admin.create_table(name, tally.TableDescriptor(
        SCHEMA, bucket_count=2, properties={"table.merge-engine": "aggregation"}))
    return conn.table(name)


def events(spark, start: int, end: int):
    """Rows of users start..end-1 in groups 0 and 1 (user u in group u % 2), a latency and a
    size per row."""
    return (spark.range(start, end).withColumnRenamed("id", "user")
            .withColumn("g", F.col("user") % 2)
            .withColumn("ms", F.col("user") / 10.0)
            .withColumn("bytes", F.col("user") * 3))


def test_spark_sketches_merge_in_tally_and_spark_reads_the_estimates(spark, registered, cluster,
                                                                     table):
    writer = tally.TallySink(cluster.url, table.name)
    # Spark pre-aggregates users 0..1999 into sketch bytes per group; Tally stores them.
    first = events(spark, 0, 2000).groupBy("g").agg(
        F.hll_sketch_agg("user").alias("users"), F.theta_sketch_agg("user").alias("users_theta"),
        F.kll_sketch_agg_double("ms").alias("latency"),
        F.kll_sketch_agg_bigint("bytes").alias("size"))
    writer.write(first)
    # Users 1000..2999 again as sketches (half of them already counted), merged into the cells.
    writer.write(events(spark, 1000, 3000).groupBy("g").agg(
        F.hll_sketch_agg("user").alias("users"), F.theta_sketch_agg("user").alias("users_theta"),
        F.kll_sketch_agg_double("ms").alias("latency"),
        F.kll_sketch_agg_bigint("bytes").alias("size")))
    # Raw values straight from a DataFrame: each row adds its value (users 3000..3099).
    writer.write(events(spark, 3000, 3100).select(
        "g", F.col("user").alias("users"), F.col("user").alias("users_theta"),
        F.col("ms").alias("latency"), F.col("bytes").alias("size")))

    stored = (spark.read.format("tally").option("url", cluster.url).option("table", table.name)
              .load())
    estimates = {r["g"]: r for r in stored.select(
        "g", F.hll_sketch_estimate("users").alias("hll"),
        F.theta_sketch_estimate("users_theta").alias("theta"),
        F.kll_sketch_get_n_double("latency").alias("n"),
        F.kll_sketch_get_quantile_double("latency", F.lit(1.0)).alias("max_ms"),
        F.kll_sketch_get_quantile_bigint("size", F.lit(0.0)).alias("min_bytes")).collect()}
    assert sorted(estimates) == [0, 1]
    for g, row in estimates.items():
        # 1550 distinct users per group; HLL at lg_k 12 errs ~1.6% (3 sigma: 5%), theta at
        # 4096 nominal entries is exact below 4096 entries.
        assert abs(row["hll"] - 1550) <= 0.05 * 1550, row
        assert row["theta"] == 1550
        assert row["n"] == 2050  # rows: 1000 + 1000 + 50 per group (each user of 1000..1999 twice)
        assert row["max_ms"] == pytest.approx((3098 + g) / 10.0)
        assert row["min_bytes"] == 3 * g
        # The client helpers read the same bytes to the same numbers.
        cell = table.lookup({"g": g})
        assert hll_sketch_estimate(cell["users"]) == row["hll"]
        assert theta_sketch_estimate(cell["users_theta"]) == row["theta"]
        assert kll_sketch_quantile(cell["latency"], 1.0) == row["max_ms"]
        assert kll_sketch_quantile(cell["size"], 0.0, items="bigint") == row["min_bytes"]
    # Asked for estimates, the read itself gives the distinct counts, and the KLL quantile at
    # the rank asked for (the median by default) as Spark's own quantile function reads it.
    def read(**options):
        reader = spark.read.format("tally").option("url", cluster.url) \
            .option("table", table.name).option("sketch-estimates", "true")
        for key, value in options.items():
            reader = reader.option(key.replace("_", "-"), value)
        return reader.load()

    medians = read()
    assert dict(medians.dtypes)["users"] == "bigint"
    assert dict(medians.dtypes)["latency"] == "double" and dict(medians.dtypes)["size"] == "bigint"
    spark_medians = {r["g"]: (r["ms"], r["b"]) for r in stored.select(
        "g", F.kll_sketch_get_quantile_double("latency", F.lit(0.5)).alias("ms"),
        F.kll_sketch_get_quantile_bigint("size", F.lit(0.5)).alias("b")).collect()}
    assert {r["g"]: (r["users"], r["users_theta"], r["latency"], r["size"])
            for r in medians.collect()} == \
        {g: (row["hll"], row["theta"], *spark_medians[g]) for g, row in estimates.items()}
    p90 = {r["g"]: r["latency"] for r in read(kll_quantile="0.9").collect()}
    assert p90 == {g: pytest.approx(kll_sketch_quantile(table.lookup({"g": g})["latency"], 0.9))
                   for g in (0, 1)}
    with pytest.raises(Exception, match="kll-quantile.*normalized rank"):
        read(kll_quantile="1.5").collect()


def test_kll_quantile_is_a_rank_and_needs_sketch_estimates():
    from sink.batch_reader import ReadOptions
    from tally.errors import InvalidOptionError

    base = {"url": "grpc://127.0.0.1:1", "table": "db.t"}
    with pytest.raises(InvalidOptionError, match="only applies with 'sketch-estimates'"):
        ReadOptions.parse({**base, "kll-quantile": "0.5"})
    for bad in ("-0.1", "1.01", "median", "nan"):
        with pytest.raises(InvalidOptionError, match="normalized rank from 0 to 1"):
            ReadOptions.parse({**base, "sketch-estimates": "true", "kll-quantile": bad})
    assert ReadOptions.parse({**base, "sketch-estimates": "true",
                              "kll-quantile": "0.99"}).kll_rank == 0.99
    assert ReadOptions.parse({**base, "sketch-estimates": "true"}).kll_rank == 0.5

"""Spark writes into a table with rollups: every rollup is written in the write's epoch, by
TallySink (task and driver deliveries, batch and streaming) and by `format("tally")` (batch and
streaming), exactly once through a retried task and a commit process that dies midway. Each
table is checked against a group-by of the input rows in plain Python.
"""

from __future__ import annotations

import datetime as dt
import json
import os

import pyarrow as pa
import pytest

import sink
from merge_engine import Schema, TableDescriptor
from sink import TallySink

UTC = dt.timezone.utc
BASE = dt.datetime(2026, 12, 1, tzinfo=UTC)
DDL = "product string, region string, ts timestamp, clicks long"
BUCKETS = 3


@pytest.fixture(scope="module")
def registered(spark):
    return sink.register(spark)


def events(n: int, seed: int) -> list[tuple]:
    import random

    rng = random.Random(seed)
    return [(f"p{rng.randrange(5)}", rng.choice(["eu", "us"]),
             BASE + dt.timedelta(minutes=rng.randrange(600)), rng.randrange(1, 9))
            for _ in range(n)]


def create(conn, name: str) -> dict[str, str]:
    """A source keyed by (product, region, ts) and two rollups: per hour and region, per
    product. {kind: rollup name}."""
    schema = (Schema.builder().column("product", pa.string()).column("region", pa.string())
              .column("ts", pa.timestamp("us", tz="UTC")).agg_column("clicks", pa.int64(), "sum")
              .primary_key("product", "region", "ts").build())
    conn.admin.create_database(name.split(".")[0], ignore_if_exists=True)
    conn.admin.create_table(name, TableDescriptor(
        schema, bucket_count=BUCKETS, properties={"table.merge-engine": "aggregation"}))
    hourly, products = f"{name}_hourly", f"{name}_products"
    conn.admin.create_rollup(name, hourly, ["region", "date_trunc('hour', ts) AS hour"],
                             {"clicks": "sum(clicks)", "events": "count(*)"}, start="from-now",
                             bucket_count=2)
    conn.admin.create_rollup(name, products, ["product"],
                             {"clicks": "sum(clicks)", "last_seen": "max(ts)"},
                             start="from-now", bucket_count=2)
    return {"hourly": hourly, "products": products}


def expected(rows: list[tuple]) -> dict:
    hourly, products = {}, {}
    for product, region, ts, clicks in rows:
        hour = ts.replace(minute=0, second=0, microsecond=0)
        cell = hourly.setdefault((region, hour), {"clicks": 0, "events": 0})
        cell["clicks"] += clicks
        cell["events"] += 1
        cell = products.setdefault((product,), {"clicks": 0, "last_seen": ts})
        cell["clicks"] += clicks
        cell["last_seen"] = max(cell["last_seen"], ts)
    return {"hourly": hourly, "products": products}


def stored(conn, name: str) -> dict:
    keys = list(conn.admin.describe_table(name).descriptor.schema.primary_key)
    return {tuple(row[k] for k in keys): {c: v for c, v in row.items() if c not in keys}
            for row in conn.table(name).to_arrow().to_pylist()}


def source_sums(conn, name: str) -> int:
    return sum(row["clicks"] for row in conn.table(name).to_arrow().to_pylist())


def assert_exact(conn, source: str, rollups: dict, rows: list[tuple]) -> None:
    assert source_sums(conn, source) == sum(r[3] for r in rows)
    want = expected(rows)
    for kind, name in rollups.items():
        assert stored(conn, name) == want[kind], kind


@pytest.mark.parametrize("delivery", ["tasks", "driver"])
def test_tally_sink_batch_writes_feed_every_rollup(spark, cluster, conn, table_name, delivery):
    rollups = create(conn, table_name)
    writer = TallySink(cluster.url, table_name, options={"delivery": delivery})
    first, second = events(40, 1), events(30, 2)
    result = writer.write(spark.createDataFrame(first, DDL))
    assert sorted(result.rollups) == sorted(rollups.values())
    writer.write(spark.createDataFrame(second, DDL))
    assert_exact(conn, table_name, rollups, first + second)
    for name in [table_name, *rollups.values()]:
        assert conn.locks.describe(name) == []  # every lock released with the run


def test_a_retried_task_counts_once_in_every_rollup(spark, cluster, conn, table_name):
    rollups = create(conn, table_name)
    rows = events(50, 3)
    writer = TallySink(cluster.url, table_name, options={"delivery": "tasks"},
                       fail_hook="tests.spark.hooks:fail_first_attempt")
    result = writer.write(spark.createDataFrame(rows, DDL))
    assert result.retried_tasks > 0
    assert any(done.retried_tasks for done in result.rollups.values())
    assert_exact(conn, table_name, rollups, rows)


def write_json(path, rows) -> None:
    with open(path, "w") as f:
        for product, region, ts, clicks in rows:
            f.write(json.dumps({"product": product, "region": region,
                                "ts": ts.isoformat(), "clicks": clicks}) + "\n")


def test_streams_feed_every_rollup_exactly_once(spark, registered, cluster, conn, table_name,
                                                tmp_path):
    """TallySink's and the data source's streams, each over two micro-batches (files)."""
    rollups = create(conn, table_name)
    batches = [events(20, 10), events(25, 11)]
    source = tmp_path / "src"
    source.mkdir()
    for i, rows in enumerate(batches):
        path = source / f"part-{i:04d}.json"
        write_json(path, rows)
        os.utime(path, (1_000_000 + i, 1_000_000 + i))
    frame = spark.readStream.schema(DDL).option("maxFilesPerTrigger", 1).json(str(source))
    query = TallySink(cluster.url, table_name).start(frame, str(tmp_path / "ckpt-sink"),
                                                     trigger={"availableNow": True})
    query.awaitTermination()
    assert query.exception() is None
    assert_exact(conn, table_name, rollups, batches[0] + batches[1])
    query = (frame.writeStream.format("tally").option("url", cluster.url)
             .option("table", table_name).option("checkpointLocation", str(tmp_path / "ckpt-ds"))
             .trigger(availableNow=True).start())
    query.awaitTermination()
    assert query.exception() is None
    assert_exact(conn, table_name, rollups, (batches[0] + batches[1]) * 2)


def test_a_data_source_commit_that_dies_midway_is_repaired_in_every_table(
        spark, registered, cluster, conn, table_name):
    rollups = create(conn, table_name)
    first, second = events(30, 20), events(30, 21)
    owner = f"ds-rollups-{table_name}"

    def save(rows, **options):
        writer = (spark.createDataFrame(rows, DDL).write.format("tally")
                  .option("url", cluster.url).option("table", table_name)
                  .option("client.column-lock.owner-id", owner).mode("append"))
        for key, value in options.items():
            writer = writer.option(key, value)
        writer.save()

    save(first)
    assert_exact(conn, table_name, rollups, first)
    with pytest.raises(Exception):
        # the commit process exits half-way through the source's second bucket
        save(second, **{"fail-hook": "tests.spark.hooks:crash_after_first_bucket",
                        "client.column-lock.ttl": "20"})
    assert source_sums(conn, table_name) != sum(r[3] for r in first + second)
    for _ in range(2):  # the re-run undoes the partial epoch everywhere, then writes it
        save(second, epoch="1")
        assert_exact(conn, table_name, rollups, first + second)

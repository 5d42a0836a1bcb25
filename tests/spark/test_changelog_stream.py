"""`spark.readStream.format("tally")`: the changelog as a stream, exactly once across restarts.

One story, run against the shared SparkSession: a query reads the changelog from the earliest
offset into a foreachBatch sink that keeps each micro-batch (by batch id, so a replayed batch
replaces its first attempt); it is stopped, restarted, crashed in the middle of a batch and
restarted again while writes go on and partitions appear. Retention runs between the runs with
`table.log.retention.offsets = 0`, held back only by the query's consumer position. At the end
the batches, in batch order, hold every record of every bucket exactly once and in offset order
per bucket, and the crashed batch was replanned over the same offsets. A slow variant kills
the driver and its JVM with SIGKILL mid-batch (tests/spark/changelog_job.py).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pyarrow as pa
import pytest
from pyspark.sql.types import LongType, StructField, StructType

import sink
from merge_engine import Schema, TableDescriptor
from sink.stream_reader import TallyStreamReader
from tally.errors import InvalidOptionError
from tally.wire.channel import FlightChannel
from tests.spark.changelog_job import Batches
from tests.spark.conftest import ROOT


@pytest.fixture(scope="module")
def registered(spark):
    return sink.register(spark)


def create(conn, name, retention=True):
    schema = (Schema.builder().column("p", pa.string()).column("k", pa.int64())
              .agg_column("a", pa.int64(), "sum").primary_key("p", "k").partition_key("p")
              .build())
    conn.admin.create_database(name.split(".")[0], ignore_if_exists=True)
    properties = {"table.merge-engine": "aggregation"}
    if retention:   # every record may go once read (tablet servers also run retention alone)
        properties["table.log.retention.offsets"] = "0"
    conn.admin.create_table(name, TableDescriptor(schema, bucket_count=3, properties=properties))
    return conn.table(name)


def write(table, partition, keys, a=1):
    with table.upsert_writer() as writer:
        writer.upsert([{"p": partition, "k": k, "a": a} for k in keys])


def run_job(spec: dict, timeout: float = 900) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tests.spark.changelog_job", json.dumps(spec)],
                          cwd=ROOT, env=dict(os.environ), capture_output=True, text=True,
                          timeout=timeout)


def run(spark, cluster, table, batches, checkpoint, **options):
    reader = (spark.readStream.format("tally").option("url", cluster.url)
              .option("table", table.name).option("changelog", "true")
              .option("startingOffsets", "earliest").option("consumer", "audit"))
    for key, value in options.items():
        reader = reader.option(key, value)
    query = (reader.load().writeStream.foreachBatch(batches)
             .option("checkpointLocation", checkpoint).trigger(availableNow=True).start())
    try:
        query.awaitTermination()
    except Exception as e:  # the injected crash ends the query: the caller checks for it
        return e
    return query.exception()


def test_stream_killed_and_restarted_delivers_every_record_once(
        spark, registered, cluster, conn, table_name, tmp_path):
    table = create(conn, table_name)
    batches, checkpoint = Batches(str(tmp_path / "out")), str(tmp_path / "ckpt")
    # The reference reads every record, and holds retention until it has: a consumer too.
    reference = table.changelog_reader(consumer="reference")
    reference.commit()
    conn.admin.commit_consumer(table_name, "audit", [])   # the query's, until it starts
    expected = []

    def retention():
        expected.extend(row for batch in reference for row in batch.to_pylist())
        reference.commit()
        for handle in cluster.tablet_servers:
            FlightChannel(handle.address).action("enforce_retention", {})

    write(table, "x", range(12))
    assert run(spark, cluster, table, batches, checkpoint, maxRecordsPerTrigger="9") is None
    assert batches.batch_count() >= 2                 # capped batches, all of them run
    retention()                                       # held back by the consumer position
    holding = conn.admin.consumer(table_name, "audit").positions
    assert {k: s for k, (s, _e) in conn.admin.list_log_offsets(table_name).items()} == holding
    assert sum(holding.values()) > 0                  # retention did cut, up to the position

    write(table, "x", range(6), a=2)
    write(table, "y", range(5))                       # a partition created after the start
    retention()
    batches.crash_at = crashed = batches.batch_count()
    error = run(spark, cluster, table, batches, checkpoint)
    assert error is not None and "injected crash" in str(error)

    write(table, "z", range(4))                       # more, before the restart
    write(table, "y", range(3), a=5)
    retention()
    assert run(spark, cluster, table, batches, checkpoint) is None
    assert batches.load(f"batch-{crashed:05d}") == batches.load(f"attempt-{crashed}")

    got = batches.delivered()
    retention()
    expected = [(r["_partition"], r["_bucket"], r["_offset"], r["_change_type"], r["k"], r["a"])
                for r in expected]
    assert sorted(got) == sorted(expected) and len(got) == len(set(got))
    per_bucket = {}
    for partition, bucket, offset, *_ in got:
        per_bucket.setdefault((partition, bucket), []).append(offset)
    assert all(offsets == sorted(offsets) for offsets in per_bucket.values())
    assert {p for p, _ in per_bucket} == {"x", "y", "z"}

    registered_positions = conn.admin.consumer(table_name, "audit").positions
    ends = table.list_offsets()
    assert all(0 <= registered_positions.get(key, 0) <= end for key, end in ends.items())


@pytest.mark.slow  # two Spark drivers of their own (about 3 minutes on a busy machine)
def test_a_stream_killed_mid_batch_replays_it_over_the_same_offsets(cluster, conn, table_name,
                                                                    tmp_path):
    """SIGKILL of the driver and its JVM in the middle of a micro-batch (its own processes),
    then a restart from the checkpoint while writes go on."""
    table = create(conn, table_name, retention=False)
    out, checkpoint = str(tmp_path / "out"), str(tmp_path / "ckpt")
    write(table, "x", range(9))
    spec = {"url": cluster.url, "table": table_name, "out": out, "checkpoint": checkpoint,
            "options": {"startingOffsets": "earliest", "maxRecordsPerTrigger": "6"}, "kill": 1}
    killed = run_job(spec)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    write(table, "x", range(3), a=4)
    write(table, "w", range(2))
    done = run_job({**spec, "kill": None})
    assert done.returncode == 0, done.stderr[-2000:]
    batches = Batches(out)
    assert batches.load("batch-00001") == batches.load("attempt-1")
    got = batches.delivered()
    expected = [(r["_partition"], r["_bucket"], r["_offset"], r["_change_type"], r["k"], r["a"])
                for r in table.changelog_reader().poll().to_pylist()]
    assert sorted(got) == sorted(expected) and len(got) == len(set(got))


def test_a_position_retention_passed_fails_the_stream_naming_the_bucket(
        spark, registered, cluster, conn, table_name, tmp_path):
    table = create(conn, table_name)
    batches, checkpoint = Batches(str(tmp_path / "out")), str(tmp_path / "ckpt")
    write(table, "x", range(6))
    assert run(spark, cluster, table, batches, checkpoint) is None
    write(table, "x", range(6))
    (partition, bucket), end = max(table.list_offsets().items(), key=lambda kv: kv[1])
    conn.admin.truncate_log(table_name, bucket, end, partition=partition, force=True)
    error = run(spark, cluster, table, batches, checkpoint)
    assert error is not None
    assert "OffsetOutOfRangeError" in str(error) and f"bucket {bucket}" in str(error)


def test_a_batch_read_of_the_changelog_equals_the_python_reader(
        spark, registered, cluster, conn, table_name):
    table = create(conn, table_name, retention=False)
    write(table, "x", range(7))
    write(table, "y", range(4), a=3)
    write(table, "x", range(2), a=2)
    python = {(r["_partition"], r["_bucket"], r["_offset"], r["_change_type"], r["k"], r["a"])
              for r in table.changelog_reader().poll().to_pylist()}
    df = (spark.read.format("tally").option("url", cluster.url).option("table", table_name)
          .option("changelog", "true").load())
    assert df.columns[:4] == ["_change_type", "_offset", "_partition", "_bucket"]
    rows = [(r["_partition"], r["_bucket"], r["_offset"], r["_change_type"], r["k"], r["a"])
            for r in df.collect()]
    assert sorted(rows) == sorted(python) and len(rows) == len(python)
    latest = {f"{p}": {str(b): end - 1} for (p, b), end in table.list_offsets().items()
              if p == "y" and b == 0 and end}
    tail = (spark.read.format("tally").option("url", cluster.url).option("table", table_name)
            .option("changelog", "true").option("startingOffsets", json.dumps(latest)).load())
    assert tail.filter("_partition = 'y' AND _bucket = 0").count() == (1 if latest else 0)


def test_a_stream_without_the_changelog_option_is_refused_with_the_reason(cluster):
    table_schema = StructType([StructField("k", LongType())])
    with pytest.raises(InvalidOptionError, match=r"option\('changelog', 'true'\)"):
        TallyStreamReader({"url": cluster.url, "table": "default.any"}, table_schema)
    with pytest.raises(InvalidOptionError, match="startingoffsets|Unknown option"):
        sink.stream_reader.StreamOptions.parse({"url": "u", "table": "d.t",
                                                "startingoffset": "earliest"})
    with pytest.raises(InvalidOptionError, match="maxRecordsPerTrigger"):
        sink.stream_reader.StreamOptions.parse({"url": "u", "table": "d.t",
                                                "maxrecordspertrigger": "0"})

"""The write and read paths do each piece of work once.

A read: one `spark.read.format("tally").load()` asks the coordinator for the table once
(counted by the coordinator itself, in its metrics) and parses its options once (counted by
wrapping the parser, which still runs, in this process through the steps Spark takes: schema()
on the data source, a pickled copy's reader(), the pickled reader's tasks). A write: each row
of a micro-batch is named (its partition) once on the executors, where it is bucketed, and its
bucket writer sends it under that name without naming it again.
"""

from __future__ import annotations

import pickle
import urllib.request

import pyarrow as pa
import pytest
from prometheus_client.parser import text_string_to_metric_families
from pyspark.sql.types import LongType, StringType, StructField, StructType

import tally
from sink import protocol
from sink.options import SinkOptions
from tests.spark.sink_data import filled_table

SCHEMA = (tally.Schema.builder().column("day", pa.string()).column("k", pa.int64())
          .agg_column("total", pa.int64(), tally.AggFunction.SUM)
          .primary_key("day", "k").partition_key("day").build())
BUCKETS = 3
SPARK_SCHEMA = StructType([StructField("day", StringType(), False),
                           StructField("k", LongType(), False),
                           StructField("total", LongType())])


@pytest.fixture(scope="module")
def metered(tmp_path_factory):
    """A cluster whose coordinator counts the calls it answers."""
    from tally.server import LocalCluster

    with LocalCluster(str(tmp_path_factory.mktemp("honest-paths")), tablet_servers=1,
                      metrics=True) as cluster:
        yield cluster


@pytest.fixture
def metered_conn(metered):
    connection = tally.connect(metered.url)
    yield connection
    connection.close()


def calls(cluster, call: str) -> float:
    """How many times the coordinator answered `call` so far."""
    with urllib.request.urlopen(cluster.coordinator.metrics, timeout=30) as answer:
        text = answer.read().decode()
    return sum(s.value for family in text_string_to_metric_families(text)
               for s in family.samples
               if s.name == "tally_request_seconds_count" and s.labels.get("call") == call)


def new_table(conn, rows: list[dict]):
    return filled_table(conn, "honest", SCHEMA, BUCKETS, rows)


ROWS = [{"day": f"d{k % 2}", "k": k, "total": k * 10} for k in range(40)]
EXPECTED = sorted((r["day"], r["k"], r["total"]) for r in ROWS)


def test_one_load_asks_the_coordinator_for_the_table_once(spark, metered, metered_conn):
    table = new_table(metered_conn, ROWS)
    before, described = calls(metered, "table_info"), calls(metered, "describe_table")
    df = spark.read.format("tally").option("url", metered.url).option("table", table.name) \
        .load()
    assert sorted(tuple(r) for r in df.collect()) == EXPECTED
    assert calls(metered, "table_info") - before == 1
    assert calls(metered, "describe_table") == described


def test_one_changelog_load_asks_the_coordinator_for_the_table_once(spark, metered,
                                                                     metered_conn):
    table = new_table(metered_conn, ROWS)
    before = calls(metered, "table_info")
    df = spark.read.format("tally").option("url", metered.url).option("table", table.name) \
        .option("changelog", "true").load()
    assert sorted((r["day"], r["k"], r["total"]) for r in df.collect()) == EXPECTED
    assert calls(metered, "table_info") - before == 1


def test_one_load_parses_its_options_once(metered, metered_conn, monkeypatch):
    """Spark's steps of a load in this process: schema() on the data source, reader() on a
    copy pickled after it, each task on a pickled copy of the reader."""
    from sink.batch_reader import ReadOptions
    from sink.datasource import TallyDataSource

    table = new_table(metered_conn, ROWS)
    parse = ReadOptions.parse.__func__
    parsed = []

    def counted(cls, options):
        parsed.append(options)
        return parse(cls, options)

    monkeypatch.setattr(ReadOptions, "parse", classmethod(counted))
    before = calls(metered, "table_info")
    source = TallyDataSource({"url": metered.url, "table": table.name,
                              "sketch-estimates": "true"})
    schema = source.schema()
    reader = pickle.loads(pickle.dumps(source)).reader(schema)
    rows = []
    for partition in reader.partitions():
        task = pickle.loads(pickle.dumps(reader))
        for batch in task.read(pickle.loads(pickle.dumps(partition))):
            rows.extend(zip(*(batch.column(n).to_pylist() for n in ("day", "k", "total"))))
    assert sorted(rows) == EXPECTED
    assert len(parsed) == 1
    assert calls(metered, "table_info") - before == 1


def test_a_read_with_a_given_schema_still_plans_once(metered, metered_conn, monkeypatch):
    """With `.schema(...)` Spark never calls schema(): reader() makes the plan."""
    from sink.batch_reader import ReadOptions
    from sink.datasource import TallyDataSource

    table = new_table(metered_conn, ROWS)
    parse = ReadOptions.parse.__func__
    parsed = []
    monkeypatch.setattr(ReadOptions, "parse",
                        classmethod(lambda cls, o: parsed.append(o) or parse(cls, o)))
    before = calls(metered, "table_info")
    source = TallyDataSource({"url": metered.url, "table": table.name})
    reader = source.reader(StructType([StructField("k", LongType(), False)]))
    keys = [k for p in reader.partitions() for b in reader.read(p)
            for k in b.column("k").to_pylist()]
    assert sorted(keys) == [r["k"] for r in ROWS]
    assert len(parsed) == 1 and calls(metered, "table_info") - before == 1


def test_each_written_row_is_named_once_on_the_executors(metered, metered_conn, monkeypatch):
    """TallySink's task delivery without Spark's shuffle: the first stage's PartitionFolder
    over the input, each bucket's parts through its BucketTask. Every row's partition name is
    computed once (where it is bucketed) and the bucket writer splits by the names it got."""
    from sink.job import PartitionFolder
    from sink.plan import BUCKET_COLUMN
    from sink.task import BucketTask
    from tally.client import bucket_writer
    from tally.wire import routing

    table = new_table(metered_conn, [])
    named = []
    name_rows = routing.partition_names

    def counted(rows, partition_key):
        named.append(rows.num_rows)
        return name_rows(rows, partition_key)

    monkeypatch.setattr(routing, "partition_names", counted)
    monkeypatch.setattr(bucket_writer, "partition_names", counted)
    data = pa.Table.from_pylist(ROWS + ROWS[:10], schema=SCHEMA.to_arrow())

    def deliver(conn, plan, epoch, label):
        parts = list(PartitionFolder(plan, label)(data.to_batches(max_chunksize=16)))
        by_bucket = {b: [p for p in parts if p.column(BUCKET_COLUMN)[0].as_py() == b]
                     for b in range(plan.bucket_count)}
        return [BucketTask(plan, epoch).write(by_bucket[b], b, 0)
                for b in range(plan.bucket_count)]

    options = SinkOptions.parse({}, url=metered.url, table=table.name)
    run = protocol.WriterRun.connect(options, None, f"job-{table.name}", schema=SPARK_SCHEMA)
    try:
        run.write_epoch(0, "epoch 0", deliver)
    finally:
        run.end()
    assert sum(named) == data.num_rows
    doubled = {r["k"] for r in ROWS[:10]}
    stored = sorted((r["day"], r["k"], r["total"]) for r in table.to_arrow().to_pylist())
    assert stored == sorted((d, k, t * (2 if k in doubled else 1)) for d, k, t in EXPECTED)

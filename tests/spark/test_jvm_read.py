"""`sink.read_table`, the JVM reader: the same rows, Spark types and options as
format("tally") (every column type it reads, partitioned tables, `columns`, `filter`,
`unwritten`, `spark-partitions`), a model of the rows written, each bucket read at one offset
while writes go on, and the options it refuses, each named.
"""

from __future__ import annotations

import datetime
import decimal
import json
import threading
import uuid

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import sink
import tally
from sink.jvm_reader import jvm_jar

UTC = datetime.timezone.utc
LAST = tally.AggFunction.LAST_VALUE
# every column type the Python reader reads, each as a LAST_VALUE column (so that the rows
# read are the last rows written, the model below)
TYPES = {"i8": pa.int8(), "i16": pa.int16(), "i32": pa.int32(), "i64": pa.int64(),
         "u8": pa.uint8(), "u16": pa.uint16(), "u32": pa.uint32(), "u64": pa.uint64(),
         "f32": pa.float32(), "f64": pa.float64(), "flag": pa.bool_(), "s": pa.string(),
         "bin": pa.binary(), "dec": pa.decimal128(12, 2), "ts": pa.timestamp("us", tz="UTC"),
         "d": pa.date32(), "arr": pa.list_(pa.int64()), "m": pa.map_(pa.string(), pa.int64()),
         # types Spark holds otherwise, cast by the tablet server as the ticket says
         "ntz": pa.timestamp("us"), "tns": pa.timestamp("ns", tz="UTC"),
         "ls": pa.large_string()}

def every_type_schema():
    builder = tally.Schema.builder().column("day", pa.string()).column("k", pa.int64())
    for name, arrow_type in TYPES.items():
        builder = builder.agg_column(name, arrow_type, LAST)
    return builder.primary_key("day", "k").partition_key("day").build()

SCHEMA = every_type_schema()
BUCKETS = 3

def values(name: str):
    t = TYPES[name]
    if pa.types.is_integer(t):
        bits = t.bit_width
        low, high = (0, 2**bits - 1) if pa.types.is_unsigned_integer(t) else \
            (-2**(bits - 1), 2**(bits - 1) - 1)
        return st.integers(low, high)
    return {"f32": st.floats(width=32, allow_nan=False), "f64": st.floats(allow_nan=False),
            "flag": st.booleans(), "s": st.text(max_size=8), "bin": st.binary(max_size=8),
            "dec": st.decimals(-9999, 9999, places=2, allow_nan=False, allow_infinity=False),
            "ts": st.datetimes(datetime.datetime(1970, 1, 2), datetime.datetime(2100, 1, 1),
                               timezones=st.just(UTC)),
            "d": st.dates(datetime.date(1970, 1, 1), datetime.date(2100, 1, 1)),
            "ntz": st.datetimes(datetime.datetime(1970, 1, 2), datetime.datetime(2100, 1, 1)),
            "tns": st.datetimes(datetime.datetime(1970, 1, 2), datetime.datetime(2200, 1, 1),
                                timezones=st.just(UTC)),
            "ls": st.text(max_size=8),
            "arr": st.lists(st.integers(-5, 5), max_size=3),
            "m": st.dictionaries(st.sampled_from("abc"), st.integers(-5, 5), max_size=2)}[name]

row = st.fixed_dictionaries({"day": st.sampled_from(["d1", "d2"]), "k": st.integers(0, 30),
                             **{n: st.one_of(st.none(), values(n)) for n in TYPES}})

def new_table(conn, schema=SCHEMA, buckets: int = BUCKETS):
    name = f"jvmread.t_{uuid.uuid4().hex[:10]}"
    conn.admin.create_database("jvmread", ignore_if_exists=True)
    conn.admin.create_table(name, tally.TableDescriptor(
        schema, bucket_count=buckets, properties={"table.merge-engine": "aggregation"}))
    return conn.table(name)

def write(table, rows: list[dict]) -> None:
    with table.upsert_writer() as writer:
        writer.upsert(pa.Table.from_pylist(rows, schema=table.routing.arrow_schema))

def python_read(spark, cluster, table, **options):
    r = spark.read.format("tally").option("url", cluster.url).option("table", table.name)
    for key, value in options.items():
        r = r.option(key, value)
    return r.load()

def jvm_read(spark, cluster, table, **options):
    return sink.read_table(spark, {"url": cluster.url, "table": table.name, **options})

def rows_of(df) -> list[tuple]:
    return sorted((tuple(r) for r in df.collect()), key=repr)

@pytest.fixture(scope="module", autouse=True)
def registered(spark):
    if jvm_jar() is None:
        pytest.skip("the JVM reader's jar is not built (scripts/setup.sh needs javac)")
    return sink.register(spark)

@settings(max_examples=5, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(batches=st.lists(st.lists(row, max_size=25), min_size=1, max_size=3))
def test_rows_written_are_the_rows_read(spark, cluster, conn, batches):
    """Property: the JVM read holds the model's rows (the last row written per key, nulls
    included), in exactly the Spark types and values of format("tally"), for every type."""
    table = new_table(conn)
    model: dict[tuple, dict] = {}
    for rows in batches:
        write(table, rows)
        for r in rows:
            model[(r["day"], r["k"])] = r
    df = jvm_read(spark, cluster, table)
    python = python_read(spark, cluster, table)
    assert df.schema == python.schema
    assert rows_of(df) == rows_of(python)
    read = {(r.day, r.k): r for r in df.collect()}
    assert set(read) == set(model)
    for key, r in model.items():
        got = read[key]
        for name in ("i8", "i64", "u8", "u64", "flag", "s", "bin", "dec", "d", "arr", "ntz",
                     "ls"):
            want = r[name]
            if name == "u64" and want is not None:
                want = decimal.Decimal(want)  # uint64 reads as decimal(20, 0)
            if name == "bin" and want is not None:
                want = bytearray(want)
            assert got[name] == want, (key, name)
        assert (got.m is None and r["m"] is None) or dict(got.m) == r["m"]
    assert df.rdd.getNumPartitions() == max(1, len(table.meta.partitions) * BUCKETS)

def test_a_bucket_is_read_at_one_offset_while_writes_go_on(spark, cluster, conn):
    """Each round adds 1 to every key of the table, one put per bucket: a bucket read at one
    offset shows one count on all its keys (buckets may differ from each other)."""
    schema = (tally.Schema.builder().column("k", pa.int64())
              .agg_column("n", pa.int64(), tally.AggFunction.SUM).primary_key("k").build())
    table = new_table(conn, schema, buckets=4)
    keys = list(range(400))
    ones = pa.table({"k": pa.array(keys, pa.int64()), "n": pa.array([1] * len(keys),
                                                                     pa.int64())})
    write(table, ones.to_pylist())
    stop = threading.Event()
    rounds = []

    def writer():
        with table.upsert_writer() as w:
            while not stop.is_set():
                w.upsert(ones)
                w.flush()
                rounds.append(1)

    thread = threading.Thread(target=writer)
    thread.start()
    try:
        from pyspark.sql import functions as F

        seen = 0
        while seen < 5 or not rounds:
            df = jvm_read(spark, cluster, table).withColumn("part", F.spark_partition_id())
            per_part = df.groupBy("part").agg(F.count("*").alias("rows"),
                                              F.countDistinct("n").alias("counts")).collect()
            assert sum(r.rows for r in per_part) == len(keys)
            assert all(r.counts == 1 for r in per_part), per_part
            seen += 1
    finally:
        stop.set()
        thread.join()
    final = jvm_read(spark, cluster, table).agg(F.min("n"), F.max("n")).collect()[0]
    assert final[0] == final[1] == 1 + len(rounds)

def test_options_read_as_format_tally_reads_them(spark, cluster, conn):
    """`columns`, `filter` (partition, bucket and whole-key), `unwritten`, `batch-size` and
    `spark-partitions` give format("tally")'s rows."""
    table = new_table(conn)
    rows = [{"day": d, "k": k, "i64": k * 10, "s": f"v{k}", "u32": k} for d in ("d1", "d2")
            for k in range(20)]
    write(table, rows)
    cases = [{"columns": "s,k"}, {"filter": json.dumps({"day": "d2"})},
             {"filter": json.dumps({"day": "d1", "k": [1, 2, 19]}), "columns": "i64"},
             {"filter": json.dumps({"k": [3, 4]})}, {"unwritten": "true", "columns": "k"},
             {"batch-size": "7", "spark-partitions": "2"}]
    for options in cases:
        jvm = jvm_read(spark, cluster, table, **options)
        python = python_read(spark, cluster, table, **options)
        assert jvm.columns == python.columns, options
        assert rows_of(jvm) == rows_of(python), options
    assert jvm_read(spark, cluster, table, **{"spark-partitions": "2"}).rdd \
        .getNumPartitions() == 2
    by_day = jvm_read(spark, cluster, table, filter=json.dumps({"day": "d2"}))
    assert by_day.rdd.getNumPartitions() == BUCKETS  # only d2's buckets were planned

def test_an_empty_table_reads_no_rows(spark, cluster, conn):
    table = new_table(conn)
    df = jvm_read(spark, cluster, table)
    assert df.count() == 0 and df.columns == ["day", "k", *TYPES]

@pytest.mark.parametrize("options, message", [
    ({"snapshot": "lake"}, "'snapshot' = lake: the JVM reader reads live tables only"),
    ({"sketch-estimates": "true"}, "'sketch-estimates' is not supported by the JVM reader"),
    ({"colums": "k"}, "Unknown Tally read option"),
    ({"columns": "k,nope"}, "unknown column"),
    ({"batch-size": "0"}, "'batch-size'"),
    ({"filter": "{nope"}, "'filter' must be a JSON"),
])
def test_refused_options_are_named(spark, cluster, conn, options, message):
    from tally.errors import TallyError

    table = new_table(conn)
    with pytest.raises(TallyError, match=message):
        jvm_read(spark, cluster, table, **options)

def test_a_missing_jar_is_one_clear_error(spark, cluster, conn, monkeypatch):
    """A session without the jar: the source's name is not found, and the error says how to
    add it. (The shared session has the jar, so the name looked up is one no jar provides.)"""
    from sink import jvm_reader
    from tally.errors import MissingDependencyError

    monkeypatch.setattr(jvm_reader, "FORMAT", "tally-jvm-absent")
    with pytest.raises(MissingDependencyError, match="spark.jars = sink.spark_jars"):
        jvm_read(spark, cluster, new_table(conn))

def test_format_tally_jvm_alone_says_where_to_start(spark):
    with pytest.raises(Exception, match="sink.read_table"):
        spark.read.format("tally-jvm").load().collect()

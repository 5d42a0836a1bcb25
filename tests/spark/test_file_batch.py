"""The driver delivery's own read of a one-file micro-batch (sink.file_batch) against Spark's
read of the same batch: whenever it reads, it gives exactly the rows `toArrow()` gives, in
order; it declines (Spark's job then reads) for a batch it cannot prove the same (a column
missing, renamed in case only or of a wider type in the file, several files, a DataFrame
derived from the batch); and a stream whose batches take either path leaves the table that the
plain-Python model folds."""

from __future__ import annotations

import os
import uuid

import pyarrow as pa
import pyarrow.parquet as pq
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import sink.driver_delivery as driver_delivery
from sink import TallySink
from sink.file_batch import read_file_batch
from tests.spark import sink_data

SLOW = settings(max_examples=4, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.function_scoped_fixture,
                                       HealthCheck.too_slow])

ARROW = pa.schema([("k", pa.int64()), ("v", pa.int64()), ("c", pa.string()),
                   ("s", pa.string()), ("a", pa.int64()), ("l", pa.string())])
# How a batch's file differs from the stream's schema, and whether the driver may read it.
SHAPES = {"as-is": True, "extra column": True, "int32 key": False, "missing column": False,
          "case-differing name": False}

texts = st.one_of(st.none(), st.sampled_from(["x", "y", "zz", ""]))
rows_strategy = st.lists(st.fixed_dictionaries({
    "k": st.integers(0, 12), "v": st.integers(-50, 100), "c": texts, "s": texts,
    "a": st.one_of(st.none(), st.integers(-5, 5)), "l": texts}), min_size=1, max_size=30)
batches_strategy = st.lists(st.tuples(rows_strategy, st.sampled_from(sorted(SHAPES))),
                            min_size=1, max_size=4)
EVERY_SHAPE = [(sink_data.make_rows(6, 4, seed=i), shape) for i, shape in enumerate(SHAPES)]


def write_batch_file(directory: str, index: int, rows: list[dict], shape: str) -> None:
    """One Parquet file of `rows` in `shape`, older than every later index's (the file source
    takes the oldest first)."""
    table = pa.Table.from_pylist(rows, schema=ARROW)
    if shape == "extra column":
        table = table.append_column("z", pa.array(range(len(rows)), pa.int64()))
    elif shape == "int32 key":
        table = table.set_column(0, "k", table.column("k").cast(pa.int32()))
    elif shape == "missing column":
        table = table.drop_columns(["l"])
    elif shape == "case-differing name":
        table = table.rename_columns(["k", "v", "c", "s", "a", "L"])
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, f"batch-{index:04d}.parquet")
    pq.write_table(table, path)
    os.utime(path, (1_000_000_000 + 10 * index, 1_000_000_000 + 10 * index))


def run_stream(spark, source: str, checkpoint: str, each_batch, files_per_batch: int = 1,
               where: str | None = None):
    stream = (spark.readStream.schema(sink_data.SCHEMA_DDL)
              .option("maxFilesPerTrigger", files_per_batch).parquet(source))
    if where is not None:
        stream = stream.where(where)
    query = (stream.writeStream.foreachBatch(each_batch).option("checkpointLocation", checkpoint)
             .trigger(availableNow=True).start())
    query.awaitTermination()
    assert query.exception() is None, query.exception()


def reads_of(spark, source: str, checkpoint: str, files_per_batch: int = 1,
             where: str | None = None) -> dict:
    """{batch id: (the driver's read, Spark's toArrow(), the driver's read of a filtered
    DataFrame of the batch)}."""
    seen = {}

    def each_batch(df, batch_id):
        query_id = df.sparkSession.sparkContext.getLocalProperty("sql.streaming.queryId")
        jquery = spark._jsparkSession.streams().get(query_id)
        seen[batch_id] = (read_file_batch(jquery, df), df.toArrow(),
                          read_file_batch(jquery, df.where("k >= 0")))

    run_stream(spark, source, checkpoint, each_batch, files_per_batch, where)
    return seen


@SLOW
@given(batches=batches_strategy)
@example(batches=EVERY_SHAPE)
def test_the_driver_reads_exactly_what_spark_reads_or_declines(spark, tmp_path, batches):
    work = tmp_path / uuid.uuid4().hex[:8]
    for index, (rows, shape) in enumerate(batches):
        write_batch_file(str(work / "source"), index, rows, shape)
    seen = reads_of(spark, str(work / "source"), str(work / "checkpoint"))
    assert sorted(seen) == list(range(len(batches)))
    for batch_id, (rows, shape) in enumerate(batches):
        read, spark_rows, derived = seen[batch_id]
        assert derived is None  # a DataFrame derived from the batch is not the batch
        if SHAPES[shape]:
            assert read is not None, shape
            assert read.equals(spark_rows), (shape, read, spark_rows)
            assert read.to_pylist() == rows
        else:
            assert read is None, shape


def test_a_batch_of_several_files_is_read_by_spark(spark, tmp_path):
    """Spark decides the order of several files' rows: the driver does not guess it."""
    rows = sink_data.make_rows(20, 8, seed=3)
    for index in range(4):
        write_batch_file(str(tmp_path / "source"), index, rows[5 * index:5 * index + 5],
                         "as-is")
    seen = reads_of(spark, str(tmp_path / "source"), str(tmp_path / "checkpoint"),
                    files_per_batch=2)
    assert len(seen) == 2
    assert all(read is None and spark_rows.num_rows == 10
               for read, spark_rows, _ in seen.values())


def test_a_stream_filtered_before_the_sink_is_read_by_spark(spark, tmp_path):
    """The query's own plan filters the file's rows: only Spark's job applies the filter."""
    rows = sink_data.make_rows(20, 8, seed=4)
    write_batch_file(str(tmp_path / "source"), 0, rows, "as-is")
    seen = reads_of(spark, str(tmp_path / "source"), str(tmp_path / "checkpoint"),
                    where="k >= 3")
    (read, spark_rows, _), = seen.values()
    assert read is None
    assert spark_rows.to_pylist() == [row for row in rows if row["k"] >= 3]


@SLOW
@given(batches=batches_strategy)
@example(batches=EVERY_SHAPE)
def test_a_stream_through_either_read_leaves_the_model_fold(spark, cluster, conn, tmp_path,
                                                             monkeypatch, batches):
    """TallySink (driver delivery) over batches of every shape: the table is the model's fold
    of every row once, in order, and the driver read exactly the batches it may read."""
    work = tmp_path / uuid.uuid4().hex[:8]
    for index, (rows, shape) in enumerate(batches):
        write_batch_file(str(work / "source"), index, rows, shape)
    read_by_driver = []
    real_read = driver_delivery.read_file_batch

    def observed_read(jquery, df):
        rows = real_read(jquery, df)
        read_by_driver.append(rows is not None)
        return rows

    monkeypatch.setattr(driver_delivery, "read_file_batch", observed_read)
    table = f"sparktest.f_{uuid.uuid4().hex[:10]}"
    sink_data.create_table(conn, table)
    sink = TallySink(cluster.url, table, options={"delivery": "driver"})
    stream = (spark.readStream.schema(sink_data.SCHEMA_DDL).option("maxFilesPerTrigger", 1)
              .parquet(str(work / "source")))
    query = sink.start(stream, str(work / "checkpoint"), trigger={"availableNow": True})
    query.awaitTermination()
    assert query.exception() is None, query.exception()
    model_rows = [dict(row, l=None if shape == "missing column" else row["l"])
                  for rows, shape in batches for row in rows]
    assert sink_data.table_state(conn, table) == sink_data.expected(model_rows)
    assert read_by_driver == [SHAPES[shape] for _, shape in batches]

"""`sink.tally_errors()` gives back the Tally error a Spark exception of format("tally")
carries, as its own class with its message alone; `sink.check_write` makes the data source's
write checks in the driver's own process (a stream's, before `start()`)."""

from __future__ import annotations

from decimal import Decimal

import pytest

import sink
from sink.epoch_errors import EpochFailedError
from tally.errors import (AggregateOverflowError, InvalidInputError, InvalidOptionError,
                          NotFoundError)
from tests.spark import sink_data

LAST_BUCKET = 3


def test_a_batch_write_refused_while_spark_plans_it_raises_the_tally_error(
        spark, cluster, conn, table_name):
    sink_data.create_table(conn, table_name)
    df = spark.createDataFrame([(1, 1, "x")], "k long, v long, color string")
    with pytest.raises(InvalidInputError) as raised:
        with sink.tally_errors():
            (df.write.format("tally").option("url", cluster.url).option("table", table_name)
             .mode("append").save())
    error = raised.value
    assert str(error) == (f"DataFrame column 'color' is not a column of table '{table_name}' "
                          "(its columns: ['k', 'v', 'c', 's', 'a', 'l']); drop or rename it "
                          "before writing")
    assert "PYTHON_DATA_SOURCE_ERROR" in str(error.spark_error)   # Spark's, kept
    assert error.__cause__ is None and error.__suppress_context__


def test_a_failed_stream_raises_the_tally_error_from_await_termination(
        spark, cluster, conn, table_name, tmp_path):
    sink_data.create_table(conn, table_name)
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "part-0.json").write_text('{"k": 1, "v": "many"}\n')
    query = (spark.readStream.schema("k long, v string").json(str(tmp_path / "src"))
             .writeStream.format("tally").option("url", cluster.url)
             .option("table", table_name).option("checkpointLocation", str(tmp_path / "ckpt"))
             .trigger(availableNow=True).start())

    @sink.tally_errors()   # a decorator too
    def wait():
        query.awaitTermination()

    with pytest.raises(InvalidInputError, match="^DataFrame column 'v' has type string, which "
                                                "cannot feed column 'v'"):
        wait()


def test_other_errors_pass_through_unchanged(spark):
    with pytest.raises(ZeroDivisionError):
        with sink.tally_errors():
            1 / 0
    with pytest.raises(Exception, match="UNRESOLVED_COLUMN") as raised:
        with sink.tally_errors():
            spark.range(1).select("nope").collect()
    assert type(raised.value).__module__.startswith("pyspark")


def test_a_commit_that_rolled_back_raises_the_typed_epoch_error(spark, cluster, conn,
                                                                  table_name):
    """A commit's failure (one key overflowing its decimal sum in the bucket written last)
    comes back as what TallySink raises for it: the cause's class and EpochFailedError."""
    sink_data.create_decimal_table(conn, table_name)
    first = sink_data.decimal_rows(12, "1.00", seed=11)
    bad_key = sink_data.key_in_bucket(LAST_BUCKET)

    def write(rows):
        (spark.createDataFrame(rows, sink_data.DECIMAL_DDL).write.format("tally")
         .option("url", cluster.url).option("table", table_name)
         .option("client.column-lock.owner-id", "typed-commit").mode("append").save())

    write(first)
    before = sink_data.decimal_state(conn, table_name)
    bad = sink_data.decimal_rows(12, "2.00", seed=12) + [(bad_key, Decimal(sink_data.MAX_DECIMAL))]
    with pytest.raises(AggregateOverflowError) as raised:
        with sink.tally_errors():
            write(bad)
    error = raised.value
    assert isinstance(error, EpochFailedError)
    assert error.rolled_back and error.buckets_undone == LAST_BUCKET
    assert str(error).startswith("batch write (epoch 1) by typed-commit into "
                                 f"{table_name} failed and was rolled back: nothing of it was "
                                 "applied")
    assert sink_data.decimal_state(conn, table_name) == before


def test_check_write_refuses_a_stream_before_it_starts(spark, cluster, conn, table_name,
                                                       tmp_path):
    sink_data.create_table(conn, table_name)
    (tmp_path / "empty").mkdir()   # no data yet: Spark would plan the write only later
    stream = spark.readStream.schema("k long, v long, color string").json(
        str(tmp_path / "empty"))
    options = {"url": cluster.url, "table": table_name}
    with pytest.raises(InvalidInputError, match="DataFrame column 'color' is not a column"):
        sink.check_write(stream, options)
    with pytest.raises(InvalidOptionError, match=r"\['delivery'\] are TallySink's"):
        sink.check_write(stream.drop("color"), {**options, "delivery": "driver"})
    plan = sink.check_write(stream.drop("color"), options)
    assert plan.table == table_name and plan.target_columns == ("k", "v")
    assert conn.locks.describe(table_name) == []


def test_a_message_without_a_tally_error_gives_none():
    from sink.spark_errors import tally_error_in

    assert tally_error_in(RuntimeError("[X] pyspark.errors.PySparkException: no")) is None
    found = tally_error_in(RuntimeError(
        "[PYTHON_DATA_SOURCE_ERROR] Failed to create Python data source instance: "
        "tally.errors.NotFoundError: table 'd.t' does not exist\n SQLSTATE: 38000"))
    assert type(found) is NotFoundError and str(found) == "table 'd.t' does not exist"

"""What a new user meets first, on the shared session: Spark's Python workers corrected to an
interpreter with Tally, one log line per epoch, and a contradicting function option refused."""

from __future__ import annotations

import logging
import sys

import pytest

import tally
from sink.worker_python import has_tally, use_driver_python
from tally.errors import InvalidOptionError
from tests.spark import sink_data


def test_local_workers_without_tally_run_the_driver_interpreter(spark, tmp_path):
    """A session whose workers would run a Python without Tally (PYSPARK_PYTHON unset when it
    started: `python3` from the PATH) gets this interpreter; a working one is left alone."""
    context = spark.sparkContext
    saved = context.pythonExec
    # This Python without its site-packages and PYTHONPATH: a Python without Tally.
    without = tmp_path / "python-without-tally"
    without.write_text(f'#!/bin/sh\nexec "{sys.executable}" -I -S "$@"\n')
    without.chmod(0o755)
    without = str(without)
    assert not has_tally(without)
    try:
        context.pythonExec = without
        use_driver_python(spark)
        assert context.pythonExec == sys.executable
        # ... and a job runs on it (Python workers import the sink's code).
        assert spark.range(4).rdd.map(lambda x: x.id * 2).sum() == 12
        context.pythonExec = saved
        use_driver_python(spark)
        assert context.pythonExec == saved
    finally:
        context.pythonExec = saved


def test_each_epoch_logs_one_line(spark, cluster, conn, table_name, caplog):
    sink_data.create_table(conn, table_name, buckets=2)
    rows = sink_data.make_rows(40, 6, seed=3)
    df = spark.createDataFrame(rows, sink_data.SCHEMA_DDL)
    caplog.set_level(logging.INFO, logger="tally.sink")
    result = tally.TallySink(cluster.url, table_name, options={
        "client.column-lock.owner-id": "first-hour"}).write(df)
    lines = [r.getMessage() for r in caplog.records
             if r.name == "tally.sink" and f"{table_name} epoch " in r.getMessage()]
    assert lines == [f"{table_name} epoch 0 (batch write (epoch 0) by first-hour): "
                     f"{result.rows} rows, {result.keys} keys, 0 undone, {result.seconds:.2f}s"]
    assert result.rows == 40


def test_a_function_option_contradicting_the_table_is_refused(spark, cluster, conn, table_name):
    sink_data.create_table(conn, table_name, buckets=1)
    df = spark.createDataFrame(sink_data.make_rows(4, 2, seed=1), sink_data.SCHEMA_DDL)
    sink = tally.TallySink(cluster.url, table_name, options={"fields.V.agg": "max"})
    with pytest.raises(InvalidOptionError, match=r"asks for max, but column 'v' .* sum"):
        sink.validate(df)
    with pytest.raises(InvalidOptionError, match="asks for max"):
        sink.write(df)
    assert conn.table(table_name).to_arrow().num_rows == 0  # nothing applied
    tally.TallySink(cluster.url, table_name, options={"fields.v.agg": "sum"}).validate(df)

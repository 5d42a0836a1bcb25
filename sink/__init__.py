"""Spark sinks: exactly-once aggregate and partial updates from PySpark jobs into Tally tables.

`TallySink` is the foreachBatch callable (with `start` for streaming and `write` for batch
jobs); `format("tally")` is found by Spark without registration (the installed
`pyspark_tally` module names it), and `register(spark)` registers it explicitly for a session
whose lookup ran a Python without Tally; a write that fails raises `EpochFailedError` after
rolling back what it wrote. `read_table(spark, options)` reads a table with the JVM reader
(its jar on the session's `spark.jars`: `spark_jars()`). See docs/spark.md.
"""

from sink.epoch_errors import EpochFailedError
from sink.options import SinkOptions
from sink.tally_sink import TallySink

__all__ = ["EpochFailedError", "SinkOptions", "TallySink", "read_table", "register",
           "spark_jars"]


def register(spark):
    """Register the "tally" Python data source on this SparkSession explicitly; not needed
    where Spark found it by itself (see sink.datasource)."""
    from sink.datasource import register as _register

    return _register(spark)


def read_table(spark, options: dict):
    """A live table read by Spark's JVM (format("tally-jvm")), planned here with the options
    of format("tally"); see sink.jvm_reader."""
    from sink.jvm_reader import read_table as _read_table

    return _read_table(spark, options)


def spark_jars(*others: str) -> str:
    """A `spark.jars` value: `others` and the JVM reader's jar when it is built."""
    from sink.jvm_reader import spark_jars as _spark_jars

    return _spark_jars(*others)

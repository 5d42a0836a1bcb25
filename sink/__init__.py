"""Spark sinks: exactly-once aggregate and partial updates from PySpark jobs into Tally tables.

`TallySink` is the foreachBatch callable (with `start` for streaming and `write` for batch
jobs); `format("tally")` is found by Spark without registration (the installed
`pyspark_tally` module names it), and `register(spark)` registers it explicitly for a session
whose lookup ran a Python without Tally; a write that fails raises `EpochFailedError` after
rolling back what it wrote. `tally_errors()` raises the Tally error a Spark exception of
`format("tally")` carries as itself; `check_write(df, options)` makes that source's write
checks in this process. `read_table(spark, options)` reads a table with the JVM reader (its
jar on the session's `spark.jars`: `spark_jars()`). See docs/spark.md.

Names are loaded on first use (PEP 562): Spark imports this package in every planning worker
of `format("tally")`, which needs none of TallySink's Spark jobs.
"""

from __future__ import annotations

import importlib

# name -> (module, attribute)
_NAMES = {
    "EpochFailedError": ("sink.epoch_errors", "EpochFailedError"),
    "SinkOptions": ("sink.options", "SinkOptions"),
    "TallySink": ("sink.tally_sink", "TallySink"),
    "tally_errors": ("sink.spark_errors", "tally_errors"),
    "check_write": ("sink.datasource", "check_write"),
}

__all__ = [*_NAMES, "read_table", "register", "spark_jars"]


def __getattr__(name: str):
    try:
        module_name, attribute = _NAMES[name]
    except KeyError:
        raise AttributeError(f"module 'sink' has no attribute {name!r}") from None
    value = getattr(importlib.import_module(module_name), attribute)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted([*__all__, *globals()])


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

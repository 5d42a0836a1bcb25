"""Spark sinks: exactly-once aggregate and partial updates from PySpark jobs into Tally tables.

`TallySink` is the foreachBatch callable (with `start` for streaming and `write` for batch
jobs); `format("tally")` is found by Spark without registration (the installed
`pyspark_tally` module names it), and `register(spark)` registers it explicitly for a session
whose lookup ran a Python without Tally; a write that fails raises `EpochFailedError` after
rolling back what it wrote. See docs/spark.md.
"""

from sink.epoch_errors import EpochFailedError
from sink.options import SinkOptions
from sink.tally_sink import TallySink

__all__ = ["EpochFailedError", "SinkOptions", "TallySink", "register"]


def register(spark):
    """Register the "tally" Python data source on this SparkSession explicitly; not needed
    where Spark found it by itself (see sink.datasource)."""
    from sink.datasource import register as _register

    return _register(spark)

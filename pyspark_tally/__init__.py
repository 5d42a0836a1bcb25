"""How Spark finds `format("tally")` without being told: PySpark (4.1 and later) imports every
installed top-level module whose name starts with `pyspark_` and registers its `DefaultSource`
under the source's `name()`, in every session. Nothing else belongs here: Spark imports this
module in each session's first data source lookup.
"""

from sink.datasource import TallyDataSource as DefaultSource

__all__ = ["DefaultSource"]

"""A streaming micro-batch of one Parquet file read on the driver, without a Spark job.

The driver delivery's `toArrow()` runs a Spark job per epoch (about 35 ms for 1,000 rows on
two cores, most of it scheduling and the task's set-up), which a no-op `foreachBatch` never
runs. When the micro-batch is exactly one local Parquet file read as it is, pyarrow reads the
same rows on the driver in about a millisecond. `read_file_batch` takes that path only when
it can prove the rows are the ones Spark's job would return, and says None otherwise (the
caller then runs the job):

- the DataFrame `foreachBatch` handed over is the micro-batch itself: its analyzed plan is a
  `LogicalRDD` over the very RDD of the query's current execution (not a DataFrame derived
  from it: a filter, a projection or a join makes a new plan);
- that execution's optimized plan is a bare Parquet file relation (no filter, projection or
  partition columns; a file stream source's batch) over one `file:` path;
- the file has every column under its exact name and Arrow type (types whose values Spark and
  pyarrow read alike: integers, floating point, boolean, string), and no other column that
  differs from one of them only in case (Spark matches names case-insensitively).

Anything else (several files, whose order Spark decides; a missing column, which Spark reads
as nulls; a widened type; another file system; a file pyarrow cannot read) runs the job.
"""

from __future__ import annotations

import logging

import pyarrow as pa
import pyarrow.parquet as pq

log = logging.getLogger("tally.sink")

LOGICAL_RDD = "org.apache.spark.sql.execution.LogicalRDD"
FILE_RELATION = "org.apache.spark.sql.execution.datasources.LogicalRelation"
FS_RELATION = "org.apache.spark.sql.execution.datasources.HadoopFsRelation"
PARQUET = "org.apache.spark.sql.execution.datasources.parquet.ParquetFileFormat"
LOCAL_SCHEME = "file:"

# Spark types whose Parquet values pyarrow reads exactly as Spark's Arrow export gives them.
PLAIN_TYPES = frozenset({"LongType", "IntegerType", "ShortType", "ByteType", "DoubleType",
                         "FloatType", "BooleanType", "StringType"})


def _class_name(jobj) -> str:
    return jobj.getClass().getName()


def batch_file(jquery, df) -> str | None:
    """The local path of the one Parquet file that is the whole micro-batch `df` of the
    running JVM streaming query `jquery`, or None (see the module docstring)."""
    execution = jquery.streamingQuery().lastExecution()
    if execution is None:
        return None
    analyzed = df._jdf.queryExecution().analyzed()
    if _class_name(analyzed) != LOGICAL_RDD or not analyzed.rdd().equals(execution.toRdd()):
        return None
    relation_node = execution.optimizedPlan()
    if _class_name(relation_node) != FILE_RELATION:
        return None
    relation = relation_node.relation()
    if _class_name(relation) != FS_RELATION or _class_name(relation.fileFormat()) != PARQUET \
            or relation.partitionSchema().nonEmpty() or relation.bucketSpec().isDefined():
        return None
    files = relation.location().inputFiles()  # a py4j array: one round trip per element read
    if len(files) != 1:
        return None
    path = files[0]
    return _local_path(path) if path.startswith(LOCAL_SCHEME) else None


def _local_path(uri: str) -> str:
    """`file:/a/b` or `file:///a/b` -> `/a/b`, undoing the URI's percent-escapes."""
    from urllib.parse import unquote, urlparse

    return unquote(urlparse(uri).path)


def expected_schema(spark_schema, large_strings: bool) -> pa.Schema | None:
    """The Arrow schema `toArrow()` gives for `spark_schema`, or None when a column's type is
    not one of PLAIN_TYPES."""
    from pyspark.sql.pandas.types import to_arrow_schema

    if any(type(field.dataType).__name__ not in PLAIN_TYPES for field in spark_schema.fields):
        return None
    return to_arrow_schema(spark_schema, timezone="UTC", prefers_large_types=large_strings)


def _same_values(file_type: pa.DataType, want: pa.DataType) -> bool:
    if pa.types.is_string(want) or pa.types.is_large_string(want):
        return pa.types.is_string(file_type) or pa.types.is_large_string(file_type)
    return file_type.equals(want)


def read_matching(path: str, schema: pa.Schema) -> pa.Table | None:
    """The file's columns of `schema`, cast to it, or None when the file does not hold each
    of them under its exact name and type (or holds a name differing only in case)."""
    parquet = pq.ParquetFile(path)
    stored = parquet.schema_arrow
    names = stored.names
    for field in schema:
        folded = [n for n in names if n.lower() == field.name.lower()]
        if folded != [field.name] or not _same_values(stored.field(field.name).type, field.type):
            return None
    return parquet.read(columns=schema.names, use_threads=False).cast(schema)


def read_file_batch(jquery, df) -> pa.Table | None:
    """The micro-batch's rows, read on the driver, when they are one local Parquet file read
    as it is (see the module docstring); None when Spark's job must read them. A failure to
    tell or to read is None too: the job then reads the batch (and reports any error)."""
    try:
        path = batch_file(jquery, df)
        if path is None:
            return None
        large = df.sparkSession.conf.get("spark.sql.execution.arrow.useLargeVarTypes",
                                         "false") == "true"
        schema = expected_schema(df.schema, large)
        return None if schema is None else read_matching(path, schema)
    except Exception as error:  # noqa: BLE001 - py4j and pyarrow errors: the job reads instead
        log.debug("tally sink: the micro-batch is read by Spark's job (%s)", error)
        return None

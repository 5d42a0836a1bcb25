"""`sink.read_table(spark, options)`: a live table read by Tally's JVM reader (DataSource V2).

    df = sink.read_table(spark, {"url": url, "table": "db.t"})

The same read as `spark.read.format("tally")` (sink.batch_reader), planned the same way on the
driver and read with the same options and typed errors, but read by Spark's JVM itself: no
Python worker, each bucket's rows an Arrow IPC stream handed to Spark column by column. The
driver plans the parts (one per bucket, pruned by the `filter` option as the Python reader
prunes them), asks each part's leader to sign a ticket for it (the `read_tickets` action), and
hands the tickets to `format("tally-jvm")` (the jar built from jvm/ by scripts/setup.sh), whose
tasks fetch each part over HTTP(S) from its tablet server (tally.server.tablet.part_reads) with the
same token and TLS files. The DataFrame's schema is the Python reader's (the same Spark types).

Limits: live reads only (`snapshot` lake/union and `sketch-estimates` are refused, naming the
option: read those with format("tally")); the `filter` option prunes buckets and partitions,
and its whole-key lookups read their keys' whole buckets, then the rows are filtered in Spark;
a bucket whose leader changed since planning fails its task (plan again: call read_table
again); tickets are valid while the planning leaders' processes live.
"""

from __future__ import annotations

import base64
import functools
import json
import os

import pyarrow as pa

from merge_engine.table.hidden_columns import UNWRITTEN
from sink.batch_reader import (LIVE, SKETCH_ESTIMATES, SNAPSHOT, ReadOptions, _open_table, grouped,
                               read_schema)
from sink.options import TLS_CA, TLS_CERT, TLS_KEY
from sink.types import spark_to_arrow
from tally.errors import InvalidOptionError, MissingDependencyError

FORMAT = "tally-jvm"
JAR_ENV = "TALLY_SPARK_JAR"
JAR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                   "jvm", "build", "tally-spark-reader.jar")


def jvm_jar() -> str | None:
    """The JVM reader's jar (`$TALLY_SPARK_JAR`, else the one scripts/setup.sh builds in this
    checkout), or None when there is none: give it to a session as `spark.jars`."""
    path = os.environ.get(JAR_ENV) or JAR
    return path if os.path.exists(path) else None


def spark_jars(*others: str) -> str:
    """A `spark.jars` value: `others` and the JVM reader's jar when it is built."""
    return ",".join([j for j in others if j] + ([jvm_jar()] if jvm_jar() else []))


def read_table(spark, options: dict):
    """The table named by `options` (those of format("tally")) as a DataFrame read by the JVM
    reader; see the module docstring."""
    parsed = ReadOptions.parse(options)
    if parsed.snapshot != LIVE:
        raise InvalidOptionError(f"Option '{SNAPSHOT}' = {parsed.snapshot}: the JVM reader "
                                 "reads live tables only; read the lake with format('tally')")
    if parsed.estimates:
        raise InvalidOptionError(f"Option '{SKETCH_ESTIMATES}' is not supported by the JVM "
                                 "reader (sketches are read as their bytes); read estimates "
                                 "with format('tally')")
    schema = read_schema(options)  # the Python reader's Spark types, `columns` checked
    plan = _plan(parsed, schema)
    reader = (spark.read.format(FORMAT).schema(plan["schema"])
              .option("table", parsed.table).option("parts", json.dumps(plan["partitions"]))
              .option("tls", str(plan["tls"]).lower()))
    if parsed.token is not None:
        reader = reader.option("token", parsed.token)
    if parsed.tls is not None:
        for key, path in ((TLS_CA, parsed.tls.ca), (TLS_CERT, parsed.tls.cert),
                          (TLS_KEY, parsed.tls.key)):
            if path is not None:
                reader = reader.option(key, os.path.abspath(path))
    try:
        df = reader.load()
    except Exception as e:  # noqa: BLE001 - only a missing source is translated
        if "DATA_SOURCE_NOT_FOUND" in str(e) or "Failed to find data source" in str(e):
            raise MissingDependencyError(
                f"format('{FORMAT}') is not on this Spark session's classpath: build its jar "
                "with scripts/setup.sh and start the session with spark.jars = "
                "sink.spark_jars() (or read with format('tally'))") from None
        raise
    if plan["filter"]:
        from pyspark.sql import functions as F

        df = df.filter(functools.reduce(lambda a, b: a & b, [
            F.col(c).isin(values) for c, values in plan["filter"].items()]))
    return df.select(*schema.fieldNames()) if plan["extra"] else df


def _plan(parsed: ReadOptions, schema) -> dict:
    """The parts of the read, signed by their leaders and grouped into Spark partitions."""
    from pyspark.sql.types import StructType

    from tally.client.table_scan import TableScan
    from tally.wire.tls import is_tls

    table = _open_table(parsed)
    conn = table.connection
    columns = [f.name for f in schema.fields if f.name != UNWRITTEN]
    scan = TableScan(table, columns, parsed.filter, parsed.batch_size, parsed.unwritten)
    read = scan.read_columns  # the filter's columns too, dropped after Spark filters on them
    fields = {f.name: f for f in schema.fields}
    extra = [c for c in read if c not in fields]
    read_schema_ = read_schema({**parsed_options(parsed), "columns": ",".join(read)}) \
        if extra else schema
    cast = pa.schema([pa.field(f.name, spark_to_arrow(f.dataType), f.nullable)
                      for f in read_schema_.fields])
    buckets = list(dict.fromkeys((p.partition, p.bucket) for p in scan.parts))
    tickets = []
    for partition, bucket in buckets:
        def sign(partition=partition, bucket=bucket):
            route = conn.route(table.name, partition, bucket, table.table_id)
            answer = conn.server(route.address).action("read_tickets", {
                "parts": [route.header()], "columns": read, "batch_size": parsed.batch_size,
                "unwritten": parsed.unwritten,
                "cast": base64.b64encode(cast.serialize().to_pybytes()).decode()})
            return answer["endpoint"], answer["tickets"][0]

        endpoint, ticket = conn.retry(sign, refresh=table.name)
        label = f"{bucket}" if partition is None else f"{bucket} of partition {partition}"
        tickets.append({"url": endpoint, "ticket": ticket, "bucket": label})
    secure = is_tls(parsed.url)
    if secure and any(not t["url"].startswith("https://") for t in tickets):
        raise InvalidOptionError(f"{parsed.table}: a tablet server offered a plaintext part "
                                 "endpoint to a TLS connection; refused")
    return {"schema": StructType(list(read_schema_.fields)),
            "partitions": grouped(tickets, parsed.spark_partitions) if tickets else [[]],
            "tls": secure, "extra": extra,
            "filter": {c: v.to_pylist() for c, v in scan.filter.values.items()}}


def parsed_options(parsed: ReadOptions) -> dict:
    """The options that name the table and the connection, as format("tally") takes them."""
    options = {"url": parsed.url, "table": parsed.table}
    if parsed.token is not None:
        options["token"] = parsed.token
    if parsed.tls is not None:
        for key, path in ((TLS_CA, parsed.tls.ca), (TLS_CERT, parsed.tls.cert),
                          (TLS_KEY, parsed.tls.key)):
            if path is not None:
                options[key] = path
    if parsed.unwritten:
        options["unwritten"] = "true"
    return options

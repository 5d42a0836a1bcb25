"""Schema and option mismatches are refused on the driver before any Spark job, for every entry
point (format("tally") batch and streaming writes and reads, TallySink batch and streaming
writes), and Tally's line is the first line of the error.

"Before any job" is read off Spark's status tracker: the write runs under a job group of its
own (a stream: its run id, the group of every job its micro-batches run), and no job of that
group was submitted; a good write under the same kind of group shows its jobs, so the check
can fail. Nothing is written and no lock is taken.
"""

from __future__ import annotations

import contextlib
import json
import uuid

import pytest

from sink import TallySink
from sink.spark_errors import tally_error_in
from tally.errors import InvalidInputError, InvalidOptionError, NotFoundError
from tests.spark import sink_data

GOOD_DDL = "k long, v long"

# kind -> (write options, DataFrame columns, the error's class, a part of its message)
WRITE_MISMATCHES = {
    "unknown option": ({"bogus": "1"}, GOOD_DDL, InvalidOptionError,
                       "Unknown Tally sink option(s) ['bogus']"),
    "column the table lacks": ({}, "k long, v long, color string", InvalidInputError,
                               "DataFrame column 'color' is not a column of table"),
    "missing key column": ({}, "v long", InvalidInputError,
                           "lacks the primary-key column(s) ['k']"),
    "wrong type": ({}, "k long, v string", InvalidInputError,
                   "DataFrame column 'v' has type string, which cannot feed column 'v'"),
    "lease ttl": ({"client.column-lock.ttl": "soon"}, GOOD_DDL, InvalidOptionError,
                  "Option 'client.column-lock.ttl' must be a positive duration"),
    "empty owner id": ({"client.column-lock.owner-id": " "}, GOOD_DDL, InvalidOptionError,
                       "Option 'client.column-lock.owner-id' must not be empty"),
    "missing table": ({}, GOOD_DDL, NotFoundError, "does not exist"),
}

READ_MISMATCHES = {
    "missing table": ({}, NotFoundError, "does not exist"),
    "unknown option": ({"bogus": "1"}, InvalidOptionError, "option(s) ['bogus']"),
    "unknown column": ({"columns": "k,nope"}, InvalidOptionError,
                       "Option 'columns' names unknown column(s) ['nope']"),
}


def row_of(ddl: str) -> dict:
    return {name: 1 if kind == "long" else "x"
            for name, kind in (column.split() for column in ddl.split(", "))}


@contextlib.contextmanager
def job_group(spark, group: str):
    context = spark.sparkContext
    context.setLocalProperty("spark.jobGroup.id", group)
    try:
        yield
    finally:
        context.setLocalProperty("spark.jobGroup.id", None)


def jobs_of(spark, group: str) -> list[int]:
    return list(spark.sparkContext.statusTracker().getJobIdsForGroup(group))


def stream_of(spark, ddl: str, directory):
    directory.mkdir()
    (directory / "part-0.json").write_text(json.dumps(row_of(ddl)) + "\n")
    return spark.readStream.schema(ddl).json(str(directory))


# Each entry point: run the write, return (what it raised or None, the job group to check).

def format_batch(spark, url, table, options, ddl, tmp_path):
    writer = (spark.createDataFrame([row_of(ddl)], ddl).write.format("tally")
              .option("url", url).option("table", table).mode("append"))
    for key, value in options.items():
        writer = writer.option(key, value)
    group = f"driver-checks-{uuid.uuid4().hex}"
    with job_group(spark, group):
        try:
            writer.save()
        except Exception as e:  # noqa: BLE001 - Spark's exception, examined by the test
            return e, group
    return None, group


def format_stream(spark, url, table, options, ddl, tmp_path):
    writer = (stream_of(spark, ddl, tmp_path / "src").writeStream.format("tally")
              .option("url", url).option("table", table)
              .option("checkpointLocation", str(tmp_path / "ckpt")).trigger(availableNow=True))
    for key, value in options.items():
        writer = writer.option(key, value)
    query = writer.start()
    try:
        query.awaitTermination()
    except Exception as e:  # noqa: BLE001
        return e, str(query.runId)
    return None, str(query.runId)


def sink_batch(spark, url, table, options, ddl, tmp_path):
    group = f"driver-checks-{uuid.uuid4().hex}"
    with job_group(spark, group):
        try:
            TallySink(url, table, options=options).write(
                spark.createDataFrame([row_of(ddl)], ddl))
        except Exception as e:  # noqa: BLE001
            return e, group
    return None, group


def sink_stream(spark, url, table, options, ddl, tmp_path):
    frame = stream_of(spark, ddl, tmp_path / "src")
    group = f"driver-checks-{uuid.uuid4().hex}"
    active = len(spark.streams.active)
    with job_group(spark, group):
        try:
            query = TallySink(url, table, options=options).start(
                frame, str(tmp_path / "ckpt"), trigger={"availableNow": True})
        except Exception as e:  # noqa: BLE001
            assert len(spark.streams.active) == active  # no query was started
            return e, group
    query.awaitTermination()
    return query.exception(), str(query.runId)


WRITERS = {"format batch": format_batch, "format stream": format_stream,
           "TallySink.write": sink_batch, "TallySink.start": sink_stream}


def assert_tally_line_first(error, cls, fragment: str) -> None:
    """Tally's line opens the message: the error itself (TallySink), or the first line of
    Spark's exception, right after Spark's own error class; and it gives the Tally error
    back, message alone."""
    first = str(error).splitlines()[0]
    if isinstance(error, cls):
        assert fragment in first and "Traceback" not in str(error), str(error)
    else:
        assert f"{cls.__module__}.{cls.__name__}: " in first, str(error)[:3000]
        assert fragment in first, str(error)[:3000]
    recovered = tally_error_in(error)
    assert type(recovered) is cls
    assert len(str(recovered).splitlines()) == 1 and fragment in str(recovered)


@pytest.mark.parametrize("entry", list(WRITERS))
@pytest.mark.parametrize("kind", list(WRITE_MISMATCHES))
def test_a_write_mismatch_is_refused_before_any_job_with_tallys_line_first(
        spark, cluster, conn, table_name, tmp_path, entry, kind):
    options, ddl, cls, fragment = WRITE_MISMATCHES[kind]
    if kind != "missing table":
        sink_data.create_table(conn, table_name)
    error, group = WRITERS[entry](spark, cluster.url, table_name, options, ddl, tmp_path)
    assert error is not None
    assert_tally_line_first(error, cls, fragment)
    assert jobs_of(spark, group) == []
    if kind != "missing table":
        assert conn.table(table_name).to_arrow().num_rows == 0
        assert conn.locks.describe(table_name) == []


@pytest.mark.parametrize("entry", ["format batch", "format stream"])
def test_a_good_write_shows_its_jobs_under_the_same_group(spark, cluster, conn, table_name,
                                                        tmp_path, entry):
    sink_data.create_table(conn, table_name)
    options = {"client.column-lock.owner-id": f"good-{uuid.uuid4().hex[:6]}"}
    error, group = WRITERS[entry](spark, cluster.url, table_name, options, GOOD_DDL, tmp_path)
    assert error is None
    assert jobs_of(spark, group) != []
    assert sink_data.table_state(conn, table_name)[1]["v"] == 1


# a changelog stream has no `columns` option: naming one is an unknown option there
READS = [(kind, stream) for kind in READ_MISMATCHES for stream in (False, True)
         if not (stream and kind == "unknown column")]


@pytest.mark.parametrize("kind, stream", READS,
                         ids=[f"{k}-{'readStream' if s else 'read'}" for k, s in READS])
def test_a_read_mismatch_is_refused_at_load_with_tallys_line_first(
        spark, cluster, conn, table_name, kind, stream):
    options, cls, fragment = READ_MISMATCHES[kind]
    if kind != "missing table":
        sink_data.create_table(conn, table_name)
    reader = spark.readStream if stream else spark.read
    reader = reader.format("tally").option("url", cluster.url).option("table", table_name)
    if stream:
        reader = reader.option("changelog", "true")
    for key, value in options.items():
        reader = reader.option(key, value)
    group = f"driver-checks-{uuid.uuid4().hex}"
    with job_group(spark, group):
        with pytest.raises(Exception) as raised:
            reader.load()
    assert_tally_line_first(raised.value, cls, fragment)
    assert jobs_of(spark, group) == []

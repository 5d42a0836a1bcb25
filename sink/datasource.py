"""`format("tally")`: the sink as a Python data source, for batch and streaming writes,
batch reads of the table (sink.batch_reader), of its lake copy (sink.lake_reader) and of its
changelog, and the changelog stream (sink.stream_reader).

    spark.read.format("tally").option("url", url).option("table", "db.t").load()
    df.write.format("tally").option("url", url).option("table", "db.t").mode("append").save()
    df.writeStream.format("tally").option("url", url).option("table", "db.t")
        .option("checkpointLocation", ckpt).start()

Tasks validate, bucket-check and fold their rows and return them in commit messages (they
write nothing: a task that fails has applied nothing); the commit (one process, winning
attempts only) runs the epoch protocol that TallySink runs too (sink.protocol.WriterRun), with
the folded parts as the delivery (sink.funnel). Spark finds the source by itself (the installed
`pyspark_tally` module names it), so no session needs to register it. Batch writes: one epoch
under `client.column-lock.owner-id` (default: derived from the application id, which the tasks
read from their context: the planning and commit processes cannot see it); a failed commit
rolls the epoch back, and a re-run with the same owner undoes what a crashed commit
left. Streaming writes: the epoch is the micro-batch id, the owner the query id (read from the
tasks), so a replayed micro-batch is skipped or undone and rewritten. Only `append` (batch) and
the Append output mode (streaming) are supported.

Streams read the table's changelog (sink.stream_reader), asked for with the `changelog` option.

Every check of the options, the table and the DataFrame's columns runs in the methods Spark
calls while it plans (schema, reader, writer and their streaming forms), before any job: a
Tally error raised there reaches the user as its one line (sink.spark_errors). A batch read
parses its options and asks the coordinator for the table once (sink.batch_reader.ReadPlan),
kept on the instance: Spark pickles it after `schema()` and calls `reader()` on the copy.
"""

from __future__ import annotations

import dataclasses
import logging

import pyarrow as pa
from pyspark.sql.datasource import (DataSource, DataSourceArrowWriter, DataSourceStreamArrowWriter,
                                    WriterCommitMessage)

from sink.options import SinkOptions
from sink.owner import batch_owner_id, streaming_owner_id
from sink.spark_errors import one_line
from tally.errors import InvalidOptionError

log = logging.getLogger("tally.sink")


# The task-context property that holds the Spark application id (SQL executions copy the
# session's `spark.*` settings into every task's local properties).
APP_ID_PROPERTY = "spark.app.id"


@dataclasses.dataclass
class TallyCommitMessage(WriterCommitMessage):
    part: object  # sink.funnel.FoldedPart
    app_id: str | None = None  # batch writes: the application, for the default owner id
    # {rollup table: the FoldedPart of this task's rows projected into it}
    rollup_parts: dict = dataclasses.field(default_factory=dict)


class TallyDataSource(DataSource):
    _app_id: str | None = None

    @classmethod
    def name(cls) -> str:
        return "tally"

    def _refuse_overwrite(self, overwrite: bool) -> None:
        if overwrite:
            raise InvalidOptionError(
                "The tally data source only appends (aggregates into the table): use "
                "mode('append') for batch writes and the Append output mode for streams")

    @one_line
    def schema(self):
        """The table's schema as Spark reads it (sink.batch_reader), or with the `changelog`
        option the changelog's: Spark gives schema() no hint of whether a batch or a stream
        read follows."""
        from sink.stream_reader import wants_changelog

        if wants_changelog(self.options):
            return self._changelog_plan().spark_schema()
        from sink.batch_reader import plan_schema

        return plan_schema(self._read_plan())

    @one_line
    def reader(self, schema):
        from sink.stream_reader import ChangelogBatchReader, wants_changelog

        if wants_changelog(self.options):
            return ChangelogBatchReader(self._changelog_plan(), schema)
        from sink.batch_reader import LIVE, TallyBatchReader

        plan = self._read_plan()
        if plan.options.snapshot != LIVE:
            from sink.lake_reader import LakeBatchReader

            return LakeBatchReader(plan, schema)
        return TallyBatchReader(plan, schema)

    def _read_plan(self):
        """This load()'s ReadPlan: made by the first of `schema()` and `reader()` that needs
        it and kept on the instance (Spark pickles the instance between them; a read with a
        schema given never calls `schema()`)."""
        plan = self.__dict__.get("_read")
        if plan is None:
            from sink.batch_reader import ReadPlan

            plan = self._read = ReadPlan.of(self.options)
        return plan

    def _changelog_plan(self):
        """`_read_plan` of a changelog read (the `changelog` option)."""
        plan = self.__dict__.get("_changelog")
        if plan is None:
            from sink.stream_reader import ChangelogPlan

            plan = self._changelog = ChangelogPlan.of(dict(self.options))
        return plan

    @one_line
    def streamReader(self, schema):
        from sink.stream_reader import TallyStreamReader

        return TallyStreamReader(dict(self.options), schema)

    @one_line
    def writer(self, schema, overwrite: bool):
        self._refuse_overwrite(overwrite)
        return TallyBatchWriter(dict(self.options), schema, self._app_id)

    @one_line
    def streamWriter(self, schema, overwrite: bool):
        self._refuse_overwrite(overwrite)
        return TallyStreamWriter(dict(self.options), schema)


def _plan(options: SinkOptions, schema):
    """(the write's plan, the rollups it feeds): tasks project their rows into each."""
    from sink import remote
    from sink.plan import plan_write
    from sink.rollup_feeds import rollup_feeds

    conn = remote.connect(options.url, options.token, options.tls)
    try:
        plan = plan_write(conn, options, schema)
        return plan, tuple(rollup_feeds(conn, plan))
    finally:
        conn.close()


class _TaskSide:
    """What both writers do in a task: rename, bucket-check keys, fold, return the part."""

    def _fold(self, batches, query_id):
        from tally.errors import TallyError

        try:
            return self._fold_part(batches, query_id)
        except TallyError as e:
            raise type(e)(
                f"{e} (in a task of the tally data source: tasks only fold rows and the "
                f"commit writes them, so nothing of this write was applied to "
                f"{self.plan.table})") from e

    def _fold_part(self, batches, query_id):
        from pyspark import TaskContext

        from sink.funnel import fold_task_rows
        from sink.plan import HIDDEN_SEQUENCE_COLUMN

        plan = self.plan
        names = dict(zip(plan.input_columns, plan.table_columns))
        if plan.sequence_column and plan.sequence_column not in names:
            names[plan.sequence_column] = HIDDEN_SEQUENCE_COLUMN

        def renamed():
            for b in batches:
                yield b.select(list(names)).rename_columns(list(names.values()))

        label = "batch write" if query_id is None else f"micro-batch of query {query_id}"
        context = TaskContext.get()
        partition = context.partitionId()
        app_id = context.getLocalProperty(APP_ID_PROPERTY) if query_id is None else None
        part, rollup_parts = fold_task_rows(plan, self.feeds, renamed(), partition, label,
                                            query_id)
        if part is None:
            return TallyCommitMessage(part=None if query_id is None else
                                      _empty(partition, query_id), app_id=app_id)
        return TallyCommitMessage(part=part, app_id=app_id, rollup_parts=rollup_parts)


def _empty(partition: int, query_id: str):
    from sink.fold import FoldedPart

    return FoldedPart(partition, 0, b"", True, query_id)


def _parse(options: dict) -> SinkOptions:
    """The write options; TallySink's delivery options are refused: the data source's tasks
    cannot own buckets, so its epochs always go through its commit process."""
    from sink.options import DELIVERY, DRIVER_MAX_BYTES, lowered

    given = sorted(k for k in lowered(options) if k in (DELIVERY, DRIVER_MAX_BYTES))
    if given:
        raise InvalidOptionError(
            f"Option(s) {given} are TallySink's: the tally data source always writes through "
            "its commit process (docs/spark.md); drop them, or write with TallySink")
    return SinkOptions.parse(options)


def check_write(df, options: dict):
    """The checks this source makes when Spark plans a write of `df` (the options, the table,
    every column, the key, the types), made now in this process, raising the Tally error
    itself: for a stream, whose write Spark plans only at its first micro-batch, before
    `start()`. Returns the checked plan."""
    return _plan(_parse(options), df.schema)[0]


class TallyBatchWriter(_TaskSide, DataSourceArrowWriter):
    def __init__(self, options: dict, schema, app_id: str | None):
        self.options = _parse(options)
        self.plan, self.feeds = _plan(self.options, schema)
        self.app_id = app_id  # known only when the session registered the source itself

    def write(self, iterator):
        return self._fold(iterator, None)

    def owner_of(self, messages) -> str | None:
        """The owner id: the option, else derived from the application id the tasks saw;
        None when no task ran (a DataFrame without partitions) and no option names it."""
        if self.options.owner_id:
            return self.options.owner_id
        app_id = next((m.app_id for m in messages if m is not None and m.app_id),
                      None) or self.app_id
        if app_id:
            return batch_owner_id(None, app_id, self.plan.table, self.plan.lock_columns)
        if any(m is not None for m in messages):
            raise InvalidOptionError(
                "The tally data source cannot tell the Spark application id (its tasks had no "
                f"'{APP_ID_PROPERTY}'); set the option 'client.column-lock.owner-id'")
        return None

    def commit(self, messages):
        from sink.funnel import FunnelDelivery
        from sink.protocol import WriterRun

        owner_id = self.owner_of(messages)
        if owner_id is None:
            log.info("tally data source: batch write into %s ran no task; nothing to write",
                     self.plan.table)
            return
        parts = [m.part for m in messages if m is not None]
        run = WriterRun.connect(self.options, self.plan, owner_id)
        try:
            epoch = run.batch_epoch()
            run.write_epoch(epoch, f"batch write (epoch {epoch}) by {owner_id}",
                            FunnelDelivery(parts, self.feeds, messages))
        finally:
            run.end()

    def abort(self, messages):
        pass  # tasks write nothing, and a failed commit rolled its epoch back itself (or died,
        # leaving the undo to a re-run under the same owner id)


class TallyStreamWriter(_TaskSide, DataSourceStreamArrowWriter):
    def __init__(self, options: dict, schema):
        self.options = _parse(options)
        self.plan, self.feeds = _plan(self.options, schema)

    def write(self, iterator):
        from pyspark import TaskContext

        query_id = TaskContext.get().getLocalProperty("sql.streaming.queryId")
        return self._fold(iterator, query_id or "")

    def commit(self, messages, batchId):
        from sink.funnel import FunnelDelivery, StreamRuns

        parts = [m.part for m in messages if m is not None and m.part is not None]
        query_id = next((p.query_id for p in parts if p.query_id), None) or \
            _checkpoint_query_id(self.options.checkpoint_location)
        owner = streaming_owner_id(self.options.owner_id, query_id, self.plan.table,
                                   self.plan.lock_columns)
        run = StreamRuns.get(self.options, self.plan, owner)
        try:
            run.write_epoch(int(batchId), f"micro-batch {batchId} of query {query_id}",
                            FunnelDelivery(parts, self.feeds, messages))
        except BaseException:
            if run.dirty:
                StreamRuns.drop(run)
            raise

    def abort(self, messages, batchId):
        pass  # nothing was written; the failed query's restart replays the batch


def _checkpoint_query_id(location: str | None) -> str:
    """The query id from `<checkpoint>/metadata` (a micro-batch with no input partitions)."""
    import json
    import os

    path = (location or "").removeprefix("file:")
    try:
        with open(os.path.join(path, "metadata")) as f:
            return json.loads(f.readline())["id"]
    except (OSError, ValueError, KeyError):
        raise InvalidOptionError(
            "Cannot tell which streaming query this micro-batch belongs to; set the option "
            "'client.column-lock.owner-id'") from None


def register(spark):
    """Register `format("tally")` on this session explicitly. Not needed where Spark found the
    installed source by itself; kept for sessions whose lookup ran another Python (see
    sink.worker_python) and for code written before discovery. Batch owner ids are the same
    either way: the application id, which this records too (for a write that runs no task)."""
    from sink.worker_python import use_driver_python

    use_driver_python(spark)
    source = type("TallyDataSource", (TallyDataSource,),
                  {"_app_id": spark.sparkContext.applicationId, "__module__": __name__})
    spark.dataSource.register(source)
    return source

"""TallySink: exactly-once aggregate and partial writes from PySpark streaming and batch jobs.

    sink = TallySink(url, "db.metrics", target_columns=["clicks"], options={...})
    query = sink.start(events_df, checkpoint_location="/ckpt/metrics")   # streaming
    df.writeStream.foreachBatch(sink).option("checkpointLocation", ...).start()  # the same
    sink.write(df)                                                     # a batch job

Each streaming query run gets its own `WriterRun` (sink.protocol, the epoch protocol shared
with the data source), created at its first micro-batch, when the query id (the owner id's
root) is known; each epoch's rows reach the buckets through one Spark job with a task per
bucket (sink.job), or, for a batch Spark estimates small, through the driver
(sink.driver_delivery): the `delivery` option, `choose_delivery`. A
StreamingQueryListener ends the run when the query terminates: the lock is released unless an
epoch is partly applied (a rollback that failed), which leaves it to the owner's restart.
A failed epoch is rolled back before the error reaches Spark (sink.errors.EpochFailedError).
"""

from __future__ import annotations

import dataclasses
import threading
from typing import NamedTuple

from sink import remote
from sink.driver_delivery import DriverDelivery, size_estimate
from sink.job import SparkJob, table_named
from sink.options import SinkOptions
from sink.owner import batch_owner_id, streaming_owner_id
from sink.plan import plan_write
from sink.protocol import EpochResult, WriterRun
from sink.worker_python import use_driver_python
from tally.errors import InvalidInputError, InvalidOptionError


QUERY_ID_PROPERTY = "sql.streaming.queryId"
RUN_ID_PROPERTY = "spark.jobGroup.id"


def check_speculation(spark) -> None:
    """Refuse speculative execution: two attempts of one bucket's task would write at once."""
    refuse_speculation(spark.sparkContext.getConf().get("spark.speculation", "false"))


def refuse_speculation(value) -> None:
    if str(value).strip().lower() == "true":
        raise InvalidOptionError(
            "The Tally sink refuses to run with spark.speculation=true: a speculative copy of "
            "a bucket's task would write the bucket at the same time as the original. Set "
            "spark.speculation=false for this job.")


def choose_delivery(df, options: SinkOptions, plan=None, query=None):
    """The epoch's delivery: `tasks` or `driver` as the option says; `auto` takes the driver
    when Spark estimates the batch at most `delivery.driver-max-bytes`, else the tasks (also
    when it cannot estimate: a source without statistics). Given the run's plan, the estimate
    is of the columns the driver would collect, whose optimized plan the collect then reuses.
    `query`: the JVM streaming query whose micro-batch `df` is (the driver delivery may then
    read a one-file batch itself, sink.file_batch)."""
    if options.delivery == "tasks":
        return SparkJob(df)
    selected = None if plan is None else table_named(df, plan)
    if options.delivery == "driver":
        return DriverDelivery(df, selected, query)
    size = size_estimate(df if selected is None else selected)
    if size is not None and size <= options.driver_max_bytes:
        return DriverDelivery(df, selected, query)
    return SparkJob(df)


class ChosenDelivery:
    """A micro-batch's delivery, chosen (`choose_delivery`) in the epoch's `prepare` step: the
    choice asks Spark for its size estimate (py4j round trips), which then runs while the
    coordinator begins the epoch, as the driver delivery's read of the batch does."""

    def __init__(self, df, options: SinkOptions, query=None):
        self.df = df
        self.options = options
        self.query = query
        self.chosen = None

    def prepare(self, plan, label: str) -> None:
        self.chosen = choose_delivery(self.df, self.options, plan, self.query)
        prepare = getattr(self.chosen, "prepare", None)
        if prepare is not None:
            prepare(plan, label)

    def __call__(self, conn, plan, epoch, label: str):
        if self.chosen is None:
            self.prepare(plan, label)
        return self.chosen(conn, plan, epoch, label)

    def rollup(self, feed, source):
        """The chosen delivery's rollup delivery (the source's epoch was begun: chosen)."""
        return self.chosen.rollup(feed, source)


class _QueryRun(NamedTuple):
    """A streaming query run's WriterRun, and its JVM StreamingQuery (None if its session does
    not know it): the driver delivery asks the query what the micro-batch is."""

    run: WriterRun
    query: object


class TallySink:
    """A foreachBatch callable plus `start` (streaming) and `write` (batch); see module doc.

    `fail_hook` is for tests only (the option `fail-hook`): "module:function" called by each
    bucket's write after half of its folded rows (the function may raise to fail the attempt).
    """

    def __init__(self, url: str, table: str, target_columns=None, options: dict | None = None,
                 *, fail_hook: str | None = None):
        self.options = SinkOptions.parse(options, url=url, table=table, columns=target_columns)
        if fail_hook is not None:
            self.options = dataclasses.replace(self.options, fail_hook=fail_hook)
        self._runs: dict[tuple[str, str], _QueryRun] = {}
        self._lock = threading.Lock()
        self._session = None  # the session that started the query (start() sets it)

    # --- planning -----------------------------------------------------------------------

    def validate(self, df) -> None:
        """Check the DataFrame against the table (creating it if asked) without writing."""
        conn = remote.connect(self.options.url, self.options.token, self.options.tls)
        try:
            plan_write(conn, self.options, df.schema)
        finally:
            conn.close()

    # --- streaming ----------------------------------------------------------------------

    def start(self, df, checkpoint_location: str, trigger: dict | None = None):
        """Start a streaming query writing `df` through this sink; returns the StreamingQuery."""
        if not df.isStreaming:
            raise InvalidInputError("TallySink.start needs a streaming DataFrame; use write(df)")
        check_speculation(df.sparkSession)
        use_driver_python(df.sparkSession)
        self.validate(df)
        self._session = df.sparkSession
        writer = df.writeStream.foreachBatch(self).option("checkpointLocation",
                                                          checkpoint_location)
        if trigger:
            writer = writer.trigger(**trigger)
        return writer.start()

    def __call__(self, df, batch_id: int) -> None:
        spark = df.sparkSession
        context = spark.sparkContext
        query_id = context.getLocalProperty(QUERY_ID_PROPERTY)
        if not query_id:
            raise InvalidInputError(
                "TallySink was called outside a streaming query; for a batch DataFrame use "
                "sink.write(df)")
        run_id = context.getLocalProperty(RUN_ID_PROPERTY) or ""
        run, query = self._run_for(df, query_id, run_id)
        run.write_epoch(int(batch_id), f"micro-batch {batch_id} of query {query_id}",
                        ChosenDelivery(df, self.options, query))

    def _run_for(self, df, query_id: str, run_id: str) -> "_QueryRun":
        with self._lock:
            known = self._runs.get((query_id, run_id))
        if known is not None:
            return known
        check_speculation(df.sparkSession)
        use_driver_python(df.sparkSession)
        _QueryEnds.watch(self._owning_session(), self)
        run = WriterRun.connect(
            self.options, None, lambda plan: streaming_owner_id(
                self.options.owner_id, query_id, plan.table, plan.lock_columns),
            schema=df.schema)
        known = _QueryRun(run, self._jvm_query(query_id))
        with self._lock:
            self._runs[(query_id, run_id)] = known
        return known

    def _owning_session(self):
        """The session whose StreamingQueryManager runs the query: foreachBatch hands the
        function a clone of it, whose listeners never hear of the query."""
        if self._session is not None:
            return self._session
        from pyspark.sql import SparkSession

        return SparkSession.builder.getOrCreate()

    def _jvm_query(self, query_id: str):
        """The JVM StreamingQuery of `query_id` in the owning session, or None."""
        try:
            return self._owning_session()._jsparkSession.streams().get(query_id)
        except Exception:  # noqa: BLE001 - py4j's errors: the driver delivery runs the job
            return None

    def query_ended(self, query_id: str, run_id: str) -> None:
        """End the query run's WriterRun; it stays in `owner_ids()` until its lock is
        released (or left to expire)."""
        with self._lock:
            known = self._runs.get((query_id, run_id))
        if known is not None:
            try:
                known.run.end()
            finally:
                with self._lock:
                    self._runs.pop((query_id, run_id), None)

    def owner_ids(self) -> list[str]:
        with self._lock:
            return [known.run.owner_id for known in self._runs.values()]

    # --- batch --------------------------------------------------------------------------

    def write(self, df) -> EpochResult:
        """Write a batch DataFrame exactly once (see docs/spark.md for re-runs and `epoch`)."""
        if df.isStreaming:
            raise InvalidInputError("TallySink.write takes a batch DataFrame; use start(df, ...)")
        spark = df.sparkSession
        check_speculation(spark)
        use_driver_python(spark)
        app_id = spark.sparkContext.applicationId
        run = WriterRun.connect(
            self.options, None, lambda plan: batch_owner_id(
                self.options.owner_id, app_id, plan.table, plan.lock_columns),
            schema=df.schema)
        try:
            epoch = run.batch_epoch()
            return run.write_epoch(epoch, f"batch write (epoch {epoch}) by {run.owner_id}",
                                   choose_delivery(df, self.options, run.plan))
        finally:
            run.end()


class _QueryEnds:
    """One StreamingQueryListener per SparkSession, telling sinks when their queries end."""

    _by_session: dict[int, "_QueryEnds"] = {}
    _guard = threading.Lock()

    def __init__(self):
        self.sinks: list[TallySink] = []

    @classmethod
    def watch(cls, spark, sink: TallySink) -> None:
        with cls._guard:
            ends = cls._by_session.get(id(spark))
            if ends is None:
                ends = cls._by_session[id(spark)] = cls()
                _add_listener(spark, ends)
            if sink not in ends.sinks:
                ends.sinks.append(sink)

    def ended(self, query_id: str, run_id: str) -> None:
        for sink in list(self.sinks):
            sink.query_ended(query_id, run_id)


class _TerminationListener:
    """Spark's PythonStreamingQueryListener, implemented through py4j, that hears only of
    terminations. pyspark's StreamingQueryListener turns every event into Python objects
    before calling its method: dozens of py4j round trips per micro-batch's progress, on the
    driver beside the next batch, for an event the sink ignores."""

    def __init__(self, ends: _QueryEnds):
        self.ends = ends

    def onQueryStarted(self, event):
        pass

    def onQueryProgress(self, event):
        pass

    def onQueryIdle(self, event):
        pass

    def onQueryTerminated(self, event):
        self.ends.ended(event.id().toString(), event.runId().toString())

    class Java:
        implements = ["org.apache.spark.sql.streaming.PythonStreamingQueryListener"]


def _add_listener(spark, ends: _QueryEnds) -> None:
    """Register a _TerminationListener on the session's StreamingQueryManager (as pyspark's
    `spark.streams.addListener` registers its own wrapper)."""
    from pyspark import SparkContext
    from pyspark.java_gateway import ensure_callback_server_started

    gateway = SparkContext._gateway
    ensure_callback_server_started(gateway)
    wrapper = gateway.jvm.org.apache.spark.sql.streaming.PythonStreamingQueryListenerWrapper(
        _TerminationListener(ends))
    spark._jsparkSession.streams().addListener(wrapper)

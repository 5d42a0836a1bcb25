"""`spark.readStream.format("tally")`: a table's changelog as a Spark stream.

    spark.readStream.format("tally").option("url", url).option("table", "db.t")
        .option("changelog", "true").option("startingOffsets", "earliest").load()

Each row is one changelog record: `_change_type` (+I, -U, +U, -D), `_offset`, `_partition`,
`_bucket`, then the row image. A micro-batch reads every bucket from where the previous one
ended up to each bucket's log end when the batch was planned, one Spark task per bucket with
records, each bucket in offset order. Spark's offsets are per-bucket positions and live in the
query's checkpoint, so a restarted query plans the failed batch again over the same ranges:
nothing is skipped and nothing repeated. Partitions created since the last batch are found by
the next one and read from their log start (the offset says where, so a replan reads the same).

With the `consumer` option the query registers its positions with the coordinator when it
starts and after every batch Spark commits, so that retention keeps what it has not read (see
`table.log.retention.consumer-ms`). A position below a bucket's log start fails the batch with
OffsetOutOfRangeError naming the bucket and the offsets.

Spark does not tell `DataSource.schema()` whether a batch or a stream read follows, and the two
read different rows, so the changelog schema is asked for with the `changelog` option
(`wants_changelog`, `ChangelogPlan.spark_schema`); `streamReader` refuses a table schema with a
message saying so. A batch read with that option (`ChangelogBatchReader`) reads the records
from `startingOffsets` (default earliest) up to each bucket's log end.
"""

from __future__ import annotations

import dataclasses
import logging

import pyarrow as pa
from pyspark.sql.datasource import DataSourceReader, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import SupportsTriggerAvailableNow

from merge_engine.table.hidden_columns import CHANGE_TYPE
from merge_engine.table.option_values import parse_bool_option
from sink.options import CLIENT_TIMEOUTS, client_timeouts, connection_options, lowered
from tally.errors import InvalidOptionError
from tally.wire.tls import TlsFiles

log = logging.getLogger(__name__)

CHANGELOG = "changelog"
STARTING_OFFSETS = "startingoffsets"
CONSUMER = "consumer"
MAX_RECORDS = "maxrecordspertrigger"
READ_STEP = 10_000  # records per changelog request of a task
_KEYS = {"url", "table", "token", "token-file", "tls.ca", "tls.cert", "tls.key", CHANGELOG,
         STARTING_OFFSETS, CONSUMER, MAX_RECORDS, "path", "checkpointlocation", *CLIENT_TIMEOUTS}


@dataclasses.dataclass(frozen=True)
class StreamOptions:
    """The changelog stream's options, checked on the driver. Picklable."""

    url: str
    table: str
    token: str | None = dataclasses.field(default=None, repr=False)  # never in logs
    tls: TlsFiles | None = None
    starting_offsets: str = "latest"
    consumer: str | None = None
    max_records: int | None = None   # per micro-batch, split evenly over the buckets
    timeouts: tuple = ()             # the client.*-timeout options: (keyword, seconds)

    @classmethod
    def parse(cls, options: dict) -> "StreamOptions":
        raw = lowered(options)
        unknown = sorted(k for k in raw if k not in _KEYS)
        if unknown:
            raise InvalidOptionError(
                f"Unknown option(s) {unknown} for a changelog stream of the tally data source. "
                "Known options: url, table, token, token-file, tls.*, changelog, "
                "startingOffsets (earliest, latest or per-bucket JSON), consumer, "
                "maxRecordsPerTrigger, client.request-timeout, client.retry-timeout, "
                "client.stream-idle-timeout")
        url, table, token, tls = connection_options(
            raw, "A changelog stream of the tally data source")
        consumer = raw.get(CONSUMER)
        if consumer is not None and not str(consumer).strip():
            raise InvalidOptionError("Option 'consumer' must not be empty")
        limit = raw.get(MAX_RECORDS)
        if limit is not None:
            text = str(limit).strip()
            if not text.isdigit() or int(text) < 1:
                raise InvalidOptionError(f"Option 'maxRecordsPerTrigger' must be a positive "
                                         f"integer, got {limit!r}")
        start = str(raw.get(STARTING_OFFSETS, "latest")).strip()
        return cls(url, table, token, tls,
                   start.lower() if start.lower() in ("earliest", "latest") else start,
                   None if consumer is None else str(consumer).strip(),
                   None if limit is None else int(str(limit).strip()),
                   client_timeouts(raw))


def wants_changelog(options: dict) -> bool:
    """Whether the read asks for the changelog (the `changelog` option), which is what
    `DataSource.schema()` must answer with `ChangelogPlan.spark_schema`."""
    raw = lowered(options)
    return parse_bool_option(CHANGELOG, raw.get(CHANGELOG, "false"))


def _connect(options: StreamOptions):
    from sink import remote

    return remote.connect(options.url, options.token, options.tls, options.timeouts)


@dataclasses.dataclass(frozen=True)
class ChangelogPlan:
    """One changelog `load()` as the driver decided it: the options, parsed once, and the
    table's metadata, asked of the coordinator once (kept by the data source from `schema()`
    for `reader()`, and carried by the reader to its tasks). Picklable."""

    options: StreamOptions
    meta: object                # tally.client.metadata.TableMeta
    starting_given: bool        # whether `startingOffsets` was set (a batch read's default
                                # is earliest, a stream's latest)

    @classmethod
    def of(cls, options) -> "ChangelogPlan":
        parsed = StreamOptions.parse(options)
        conn = _connect(parsed)
        try:
            meta = conn.table_meta(parsed.table, refresh=True)
        finally:
            conn.close()
        return cls(parsed, meta, STARTING_OFFSETS in lowered(options))

    def spark_schema(self):
        from pyspark.sql.pandas.types import from_arrow_schema

        from tally.client.changelog_reader import changelog_schema

        return from_arrow_schema(changelog_schema(self.meta.routing,
                                                  descriptor=self.meta.descriptor))


@dataclasses.dataclass(frozen=True)
class BucketRange(InputPartition):
    """One Spark task: the records [start, end) of one bucket."""

    partition: str | None
    bucket: int
    start: int
    end: int


def _positions(offset: dict, key: str = "positions") -> dict:
    return {(p, int(b)): int(o) for p, b, o in offset.get(key, [])}


class TallyStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Plans micro-batches over per-bucket changelog positions (see the module docstring).
    Offsets: {"table_id", "positions": [[partition, bucket, end]], "starts": [[partition,
    bucket, start]] for buckets the previous offset did not have}."""

    def __init__(self, options: dict, schema) -> None:
        if CHANGE_TYPE not in schema.fieldNames():
            raise InvalidOptionError(
                "A stream from the tally data source reads the table's changelog: add "
                ".option('changelog', 'true') to readStream (Spark does not tell the data "
                "source's schema() whether a batch or a stream read follows)")
        self.options = StreamOptions.parse(options)
        self.schema = schema
        self._conn = None
        self._until = None   # Trigger.AvailableNow: the log ends when the run began
        self.table_id = self._handle().table_id

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_conn": None}  # executors open their own connections

    def _handle(self):
        """The driver's handle on the table (pinned to the table id it first resolved)."""
        from tally.client import Table

        if self._conn is None:
            self._conn = _connect(self.options)
        table_id = getattr(self, "table_id", None)
        if table_id is None:
            return self._conn.table(self.options.table)
        return Table(self._conn, self.options.table, table_id)

    def _log_offsets(self) -> dict:
        return self._conn_admin().list_log_offsets(self.options.table, self.table_id)

    def _conn_admin(self):
        self._handle()
        return self._conn.admin

    def _register(self, positions: dict) -> None:
        if self.options.consumer is None:
            return
        from tally.client.changelog_reader import positions_to_json

        self._conn_admin().commit_consumer(self.options.table, self.options.consumer,
                                           positions_to_json(positions), table_id=self.table_id)

    def initialOffset(self) -> dict:
        from tally.client.changelog_reader import positions_to_json, resolve_start

        table = self._handle()
        positions = resolve_start(self.options.starting_offsets, self._log_offsets(),
                                  table.name, table.meta.routing)
        self._register(positions)
        return {"table_id": self.table_id, "positions": positions_to_json(positions),
                "starts": []}

    def latestOffset(self, start: dict, limit) -> dict:
        from tally.client.changelog_reader import positions_to_json

        if int(start.get("table_id", self.table_id)) != self.table_id:
            raise InvalidOptionError(
                f"this query's checkpoint belongs to table id {start['table_id']}, but table "
                f"'{self.options.table}' is table id {self.table_id} now (dropped and "
                "re-created): start the query with a new checkpoint location")
        known = _positions(start)
        offsets = self._log_offsets()
        # Spark's limit: the default one (maxRecordsPerTrigger) per micro-batch, or everything
        # (ReadAllAvailable: how Trigger.AvailableNow fixes where its run ends)
        cap = getattr(limit, "max_rows", None)
        per_bucket = None if cap is None else max(1, -(-int(cap) // max(1, len(offsets))))
        ends, starts = {}, {}
        for key, (log_start, log_end) in offsets.items():
            first = known.get(key)
            if first is None:
                first = starts[key] = log_start
                log.info("changelog stream of '%s': new partition %r bucket %d from offset %d",
                         self.options.table, key[0], key[1], log_start)
            end = max(first, log_end)
            if self._until is not None:
                end = max(first, min(end, self._until.get(key, first)))
            if per_bucket is not None:
                end = min(end, first + per_bucket)
            ends[key] = end
        return {"table_id": self.table_id, "positions": positions_to_json(ends),
                "starts": positions_to_json(starts)}

    def prepareForTriggerAvailableNow(self) -> None:
        """Trigger.AvailableNow reads what is there now, in micro-batches of the usual size."""
        self._until = {key: end for key, (_s, end) in self._log_offsets().items()}

    def getDefaultReadLimit(self):
        from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows

        if self.options.max_records is None:
            return ReadAllAvailable()
        return ReadMaxRows(self.options.max_records)

    def partitions(self, start: dict, end: dict):
        begins = {**_positions(end, "starts"), **_positions(start)}
        ranges = []
        for (partition, bucket), stop in _positions(end).items():
            first = begins.get((partition, bucket))
            if first is not None and first < stop:
                ranges.append(BucketRange(partition, bucket, first, stop))
        return ranges

    def read(self, partition: BucketRange):
        return read_bucket_range(self.options, self.table_id, self.schema, partition)

    def commit(self, end: dict) -> None:
        self._register(_positions(end))

    def stop(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


def read_bucket_range(options: StreamOptions, table_id: int, spark_schema, partition: BucketRange,
                      meta=None):
    """Arrow batches of the records [start, end) of one bucket, in Spark's schema (a task);
    `meta`: the table's metadata as the driver read it, routed from unless the worker's
    connection holds the table's already."""
    from sink import remote
    from tally.client import Table
    from tally.client.changelog_reader import read_range, shape_records

    conn = remote.shared_connection(options.url, options.token, options.tls, options.timeouts)
    if meta is not None:
        conn.adopt(options.table, meta)
    table = Table(conn, options.table, table_id)
    arrow = pa.schema([pa.field(f.name, _spark_arrow(f.dataType), f.nullable)
                       for f in spark_schema.fields])
    shape = _reader_schema(table, spark_schema)
    position = partition.start
    while position < partition.end:
        upto = min(partition.end, position + READ_STEP)
        records = read_range(table, partition.partition, partition.bucket, position, upto)
        shaped = shape_records(records, partition.partition, partition.bucket, shape)
        yield from pa.Table.from_arrays(
            [shaped.column(f.name).cast(f.type) for f in arrow], schema=arrow).to_batches()
        position = upto


class ChangelogBatchReader(DataSourceReader):
    """`spark.read.format("tally").option("changelog", "true")`: the changelog records from
    `startingOffsets` (default earliest) up to each bucket's log end when the read is planned,
    one Spark partition per bucket with records."""

    def __init__(self, plan: ChangelogPlan | dict, schema) -> None:
        from tally.client.changelog_reader import resolve_start

        plan = plan if isinstance(plan, ChangelogPlan) else ChangelogPlan.of(plan)
        self.options = plan.options
        self.meta = plan.meta
        self.schema = schema
        start = self.options.starting_offsets if plan.starting_given else "earliest"
        self.table_id = plan.meta.table_id
        conn = _connect(self.options)
        try:
            offsets = conn.admin.list_log_offsets(self.options.table, self.table_id)
            first = resolve_start(start, offsets, self.options.table, plan.meta.routing)
        finally:
            conn.close()
        self.ranges = [BucketRange(p, b, first[(p, b)], end)
                       for (p, b), (_s, end) in sorted(offsets.items(),
                                                       key=lambda kv: (kv[0][0] or "", kv[0][1]))
                       if first[(p, b)] < end]

    def partitions(self):
        return self.ranges

    def read(self, partition: BucketRange):
        return read_bucket_range(self.options, self.table_id, self.schema, partition,
                                 self.meta)


def _spark_arrow(data_type) -> pa.DataType:
    from sink.types import spark_to_arrow

    return spark_to_arrow(data_type)


def _reader_schema(table, spark_schema) -> pa.Schema:
    from tally.client.changelog_reader import changelog_schema

    schema = changelog_schema(table.meta.routing, descriptor=table.meta.descriptor)
    return pa.schema([schema.field(n) for n in spark_schema.fieldNames()])

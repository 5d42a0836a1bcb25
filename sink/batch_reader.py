"""`spark.read.format("tally")`: a table's rows as a Spark DataFrame, one Spark partition per bucket.

    spark.read.format("tally").option("url", url).option("table", "db.t").load()

The driver plans the read once (tally.client.table_scan): one Spark partition per bucket, each
read by its task in one request at one changelog offset of that bucket, streamed as Arrow
batches; tasks read the driver's plan without asking the coordinator again. One `load()` parses
its options once and asks the coordinator for the table once (`ReadPlan`): the data source
keeps the plan from `schema()` for `reader()`, and the reader hands its metadata to the tasks.
Read options:

- `spark-partitions`: at most this many Spark partitions, each reading a run of whole buckets
  one after another (each still at one offset of its own). A Python data source pays a fixed
  cost per task (its Python worker's round of the read), so on few cores fewer, longer tasks
  read faster; the default stays one partition per bucket.

- `snapshot`: what is read. `live` (the default): the table on its tablet servers, as above.
  `lake`: the table's lake copy (a lake-enabled table's Delta table at the version the
  coordinator knows of), read by the tasks from the Delta files themselves, one Spark
  partition per file, with no Delta jars (sink.lake_reader). `union`: the lake copy plus every
  change since, equal to a live read at the end offsets the driver read the changelog to
  (sink.lake_reader). Lake and union reads take `columns`, `filter` (files are pruned by it,
  rows filtered), `batch-size` and `sketch-estimates`; `unwritten` is refused (the lake does
  not keep the written bits).

- `columns`: the columns to read (comma-separated; default all). A schema given with
  `.schema(...)` that names a subset of the table's columns does the same. Spark's Python data
  sources cannot prune columns themselves (PySpark 4.3 has no such hook), so `select(...)`
  alone still reads every column; these options are how a read skips them.
- `filter`: a JSON object of column -> value or list of values, all required (the form of
  `Table.scan`): equality on the whole primary key reads those keys by lookups, on its
  leading columns their key ranges by prefix lookups (tally.client.prefix_lookups), on the
  partition key only those partitions, on the bucket key only those buckets. The DataFrame is
  the table's rows that match it; Spark's own `filter(...)` then applies on top.
- `unwritten`: "true" adds the hidden `_unwritten` column. `batch-size`: rows per Arrow batch.
- `sketch-estimates`: "true" reads sketch columns as what they estimate instead of their
  bytes: hll_sketch and theta_sketch as distinct counts (bigint, rounded as Spark's
  `hll_sketch_estimate` rounds), kll_sketch as the quantile at normalized rank `kll-quantile`
  (default 0.5, the median; inclusive ranks as Spark's `kll_sketch_get_quantile_*`; double,
  or bigint for a sketch of bigint items), top_k as its `k` most frequent items
  (array<struct<item, estimate, lower_bound, upper_bound>>). Without it sketch columns are
  their bytes, which Spark's own sketch functions read.

Spark's `df.filter(...)` is not pushed into the read: PySpark 4.3 turns filter pushdown off by
default (and a reader that accepts pushed filters then fails every read), and with it on, the
read planned for one filtered query is reused by every later query of the same `load()`, so
pruning there would return wrong rows to an unfiltered query of the same DataFrame. Filters in
the `filter` option belong to the DataFrame itself and cannot leak.
"""

from __future__ import annotations

import dataclasses
import json

import pyarrow as pa
from pyspark.sql.datasource import DataSourceReader, InputPartition
from pyspark.sql.types import StructField, StructType

from aggfuncs import (AggFunction, hll_sketch_estimate, kll_sketch_quantile, theta_sketch_estimate,
                      top_k_items)
from aggfuncs.top_k import TOP_K_ESTIMATE_TYPE
from merge_engine.table.hidden_columns import UNWRITTEN
from sink.options import (CLIENT_TIMEOUTS, TABLE, TLS_CA, TLS_CERT, TLS_KEY, TOKEN, TOKEN_FILE, URL,
                          client_timeouts, connection_options, lowered)
from sink.types import arrow_to_spark, spark_to_arrow
from tally.client import prefix_lookups
from tally.errors import InvalidOptionError
from tally.wire.messages import MAX_SCAN_BATCH_ROWS
from tally.wire.tls import TlsFiles

COLUMNS, FILTER, UNWRITTEN_OPTION, BATCH_SIZE = "columns", "filter", "unwritten", "batch-size"
SPARK_PARTITIONS = "spark-partitions"
SKETCH_ESTIMATES, KLL_QUANTILE = "sketch-estimates", "kll-quantile"
SNAPSHOT, LIVE, LAKE, UNION = "snapshot", "live", "lake", "union"
SNAPSHOTS = (LIVE, LAKE, UNION)
READ_KEYS = {URL, TABLE, TOKEN, TOKEN_FILE, TLS_CA, TLS_CERT, TLS_KEY, COLUMNS, FILTER,
             UNWRITTEN_OPTION, BATCH_SIZE, SKETCH_ESTIMATES, KLL_QUANTILE, SNAPSHOT,
             SPARK_PARTITIONS, *CLIENT_TIMEOUTS}
SPARK_KEYS = {"path"}


@dataclasses.dataclass(frozen=True)
class SketchEstimate:
    """How one sketch column is read with `sketch-estimates`: its function, the item type of a
    KLL sketch and the rank read from it."""

    function: AggFunction
    items: str | None = None
    rank: float = 0.5
    top: int = 10  # the items a top_k column reads as (its `k`)

    @property
    def arrow_type(self) -> pa.DataType:
        if self.function is AggFunction.TOP_K:
            return TOP_K_ESTIMATE_TYPE
        if self.function is AggFunction.KLL_SKETCH and self.items != "BIGINT":
            return pa.float64()
        return pa.int64()

    def of(self, values: pa.Array) -> pa.Array:
        if self.function is AggFunction.HLL_SKETCH:
            found = [hll_sketch_estimate(v) for v in values.to_pylist()]
        elif self.function is AggFunction.THETA_SKETCH:
            found = [theta_sketch_estimate(v) for v in values.to_pylist()]
        elif self.function is AggFunction.TOP_K:
            found = [top_k_items(v, self.top) for v in values.to_pylist()]
        else:
            found = [kll_sketch_quantile(v, self.rank, self.items) for v in values.to_pylist()]
        return pa.array(found, type=self.arrow_type)


@dataclasses.dataclass(frozen=True)
class ReadOptions:
    """Parsed, validated read options. Picklable: tasks receive a copy."""

    url: str
    table: str
    token: str | None = dataclasses.field(default=None, repr=False)  # never in logs
    tls: TlsFiles | None = None
    columns: tuple[str, ...] | None = None
    filter: dict | None = None
    unwritten: bool = False
    batch_size: int = 65536
    estimates: bool = False
    kll_rank: float = 0.5
    snapshot: str = LIVE
    spark_partitions: int | None = None  # None: one per bucket
    timeouts: tuple = ()  # the client.*-timeout options: (tally.connect keyword, seconds)

    @classmethod
    def parse(cls, options) -> "ReadOptions":
        from merge_engine.table.option_values import parse_bool_option

        raw = lowered(options)
        unknown = sorted(k for k in raw if k not in READ_KEYS and k not in SPARK_KEYS)
        if unknown:
            raise InvalidOptionError(f"Unknown Tally read option(s) {unknown}. Known options: "
                                     f"{sorted(READ_KEYS)}")
        url, table, token, tls = connection_options(raw, "Reading a Tally table")
        columns = None
        if raw.get(COLUMNS):
            columns = tuple(c.strip() for c in str(raw[COLUMNS]).split(",") if c.strip())
        where = None
        if raw.get(FILTER):
            try:
                where = json.loads(raw[FILTER])
            except ValueError as e:
                raise InvalidOptionError(f"Option '{FILTER}' must be a JSON object of column -> "
                                         f"value or list of values: {e}") from None
            if not isinstance(where, dict):
                raise InvalidOptionError(f"Option '{FILTER}' must be a JSON object of column -> "
                                         f"value or list of values, not {raw[FILTER]!r}")
        batch_size = 65536
        if raw.get(BATCH_SIZE) is not None:
            try:
                batch_size = int(str(raw[BATCH_SIZE]).strip())
            except ValueError:
                batch_size = 0
            if not 1 <= batch_size <= MAX_SCAN_BATCH_ROWS:
                raise InvalidOptionError(f"Option '{BATCH_SIZE}' must be an integer from 1 to "
                                         f"{MAX_SCAN_BATCH_ROWS:,}, not {raw[BATCH_SIZE]!r}")
        estimates = parse_bool_option(SKETCH_ESTIMATES, raw.get(SKETCH_ESTIMATES, "false"))
        unwritten = parse_bool_option(UNWRITTEN_OPTION, raw.get(UNWRITTEN_OPTION, "false"))
        snapshot = _snapshot(raw.get(SNAPSHOT), unwritten)
        return cls(url=url, table=table, token=token, tls=tls, columns=columns, filter=where,
                   unwritten=unwritten, batch_size=batch_size, estimates=estimates,
                   kll_rank=_kll_rank(raw.get(KLL_QUANTILE), estimates), snapshot=snapshot,
                   spark_partitions=_spark_partitions(raw.get(SPARK_PARTITIONS), snapshot),
                   timeouts=client_timeouts(raw))


@dataclasses.dataclass(frozen=True)
class ReadPlan:
    """One `load()`'s read as the driver decided it: the options, parsed once, and the table's
    metadata, asked of the coordinator once. Picklable: Spark pickles the data source between
    `schema()` and `reader()` (each may run in another Python worker), and the reader to its
    tasks, so every step of the read starts from the same answer."""

    options: ReadOptions
    meta: object  # tally.client.metadata.TableMeta

    @classmethod
    def of(cls, options) -> "ReadPlan":
        """Parse `options` and ask the coordinator for the table (the read's one time)."""
        from sink import remote

        parsed = ReadOptions.parse(options)
        conn = remote.shared_connection(parsed.url, parsed.token, parsed.tls, parsed.timeouts)
        return cls(parsed, conn.table_meta(parsed.table, refresh=True))

    @property
    def arrow_schema(self) -> pa.Schema:
        return self.meta.routing.arrow_schema

    def table(self):
        """A handle on the planned table (its id) on this process's shared connection, which
        routes from the plan's metadata unless it holds the table's already: a stale route is
        refused by its server and refreshed then, as any cached one is."""
        from sink import remote
        from tally.client.table import Table

        options = self.options
        conn = remote.shared_connection(options.url, options.token, options.tls,
                                         options.timeouts)
        conn.adopt(options.table, self.meta)
        return Table(conn, options.table, self.meta.table_id)


def _open_table(options: ReadOptions, table_id: int | None = None):
    """A handle on the table (on `table_id`, the table the driver planned, in tasks: a table
    dropped and re-created meanwhile raises TableRecreatedError instead of being read)."""
    from sink import remote
    from tally.client.table import Table

    conn = remote.shared_connection(options.url, options.token, options.tls,
                                     options.timeouts)
    if table_id is None:
        return conn.table(options.table)
    return Table(conn, options.table, table_id)


def _snapshot(value, unwritten: bool) -> str:
    if value is None:
        return LIVE
    snapshot = str(value).strip().lower()
    if snapshot not in SNAPSHOTS:
        raise InvalidOptionError(f"Invalid value for option '{SNAPSHOT}': {value!r}; "
                                 f"supported: {', '.join(SNAPSHOTS)}")
    if unwritten and snapshot != LIVE:
        raise InvalidOptionError(f"Option '{UNWRITTEN_OPTION}' cannot be read with "
                                 f"'{SNAPSHOT}' = {snapshot}: the lake does not keep which "
                                 "columns were written (read it live)")
    return snapshot


def _spark_partitions(value, snapshot: str) -> int | None:
    if value is None:
        return None
    if snapshot != LIVE:
        raise InvalidOptionError(f"Option '{SPARK_PARTITIONS}' applies to live reads only; "
                                 f"'{SNAPSHOT}' = {snapshot} reads one Spark partition per file")
    try:
        count = int(str(value).strip())
    except ValueError:
        count = 0
    if count < 1:
        raise InvalidOptionError(f"Option '{SPARK_PARTITIONS}' must be a positive integer, "
                                 f"not {value!r}")
    return count


def _kll_rank(value, estimates: bool) -> float:
    if value is None:
        return 0.5
    if not estimates:
        raise InvalidOptionError(f"Option '{KLL_QUANTILE}' only applies with "
                                 f"'{SKETCH_ESTIMATES}' = true (without it kll_sketch columns "
                                 "are read as their bytes)")
    try:
        rank = float(str(value).strip())
    except ValueError:
        rank = -1.0
    if not 0.0 <= rank <= 1.0:
        raise InvalidOptionError(f"Option '{KLL_QUANTILE}' must be a normalized rank from 0 to "
                                 f"1 (0.5 is the median), not {value!r}")
    return rank


def estimated_columns(plan: ReadPlan) -> dict[str, SketchEstimate]:
    """{column: how it is read} of the sketch columns read as estimates (none unless
    `sketch-estimates`), from the descriptor in the plan's metadata."""
    options = plan.options
    if not options.estimates:
        return {}
    descriptor = plan.meta.descriptor
    return {agg.column: SketchEstimate(agg.function, agg.params.get("items"), options.kll_rank,
                                       agg.params["k"] if agg.function is AggFunction.TOP_K
                                       else 10)
            for agg in descriptor.schema.aggregators(descriptor.is_aggregation)
            if agg.estimated}


def read_schema(options: dict) -> StructType:
    """The Spark schema of a read of `options` (see `plan_schema`)."""
    return plan_schema(ReadPlan.of(options))


def plan_schema(plan: ReadPlan) -> StructType:
    """The Spark schema of a read: the table's columns (or the `columns` option's), then
    `_unwritten` when asked for."""
    parsed = plan.options
    arrow = plan.arrow_schema
    names = list(parsed.columns) if parsed.columns else arrow.names
    unknown = [c for c in names if c not in arrow.names]
    if unknown:
        raise InvalidOptionError(f"Option '{COLUMNS}' names unknown column(s) {unknown} of "
                                 f"{parsed.table}; it has {arrow.names}")
    estimated = estimated_columns(plan)
    fields = [StructField(c, arrow_to_spark(estimated[c].arrow_type if c in estimated
                                            else arrow.field(c).type), arrow.field(c).nullable)
              for c in names]
    if parsed.unwritten:
        fields.append(StructField(UNWRITTEN, arrow_to_spark(pa.list_(pa.string())), True))
    return StructType(fields)


class TallyInputPartition(InputPartition):
    """The requests one task makes, one after another: each a bucket (or a lookup of some of
    its keys), read at one offset of that bucket."""

    def __init__(self, index: int, parts: list) -> None:
        super().__init__(index)
        self.parts = parts  # tally.client.table_scan.ScanPart each; none for an empty read


def grouped(parts: list, most: int | None) -> list[list]:
    """`parts` in at most `most` runs of neighbours (sizes differing by one at most)."""
    count = len(parts) if most is None else min(most, len(parts))
    return [parts[i * len(parts) // count:(i + 1) * len(parts) // count]
            for i in range(count)]


class TallyBatchReader(DataSourceReader):
    """Plans on the driver; each task reads its parts."""

    def __init__(self, plan: ReadPlan | dict, schema: StructType) -> None:
        from tally.client.table_scan import TableScan

        plan = plan if isinstance(plan, ReadPlan) else ReadPlan.of(plan)
        self.plan = plan
        self.options = plan.options
        table = plan.table()
        self.table_id = table.table_id
        arrow = plan.arrow_schema
        names = [f.name for f in schema.fields]
        self.unwritten = UNWRITTEN in names
        self.columns = [n for n in names if n != UNWRITTEN]
        unknown = [n for n in self.columns if n not in arrow.names]
        if unknown or not self.columns:
            raise InvalidOptionError(
                f"The schema given to read {self.options.table} names column(s) {unknown} the "
                f"table does not have (it has {arrow.names})" if unknown else
                f"The schema given to read {self.options.table} names none of its columns")
        self.arrow_schema = pa.schema([pa.field(f.name, spark_to_arrow(f.dataType), f.nullable)
                                       for f in schema.fields])
        scan = TableScan(table, self.columns, self.options.filter, self.options.batch_size,
                         self.unwritten, meta=plan.meta)
        # a filter fixing the key's leading columns reads their ranges by prefix lookups, one
        # Spark partition per bucket asked unless `spark-partitions` says fewer
        prefixes = prefix_lookups.filter_requests(scan, plan.meta)
        self.parts = scan.parts if prefixes is None else prefixes
        self.most_partitions = self.options.spark_partitions if prefixes is None else min(
            self.options.spark_partitions or len(prefixes),
            len({(p.partition, p.bucket) for p in prefixes}))
        self.estimated = estimated_columns(plan)

    def partitions(self):
        if not self.parts:
            return [TallyInputPartition(0, [])]  # Spark wants at least one partition
        return [TallyInputPartition(i, run)
                for i, run in enumerate(grouped(self.parts, self.most_partitions))]

    def read(self, partition: TallyInputPartition):
        from tally.client.table_scan import TableScan

        if not partition.parts:
            return
        scan = TableScan(self.plan.table(), self.columns, self.options.filter,
                         self.options.batch_size, self.unwritten, parts=partition.parts)
        schema = self.arrow_schema
        for part in partition.parts:
            for batch in (prefix_lookups.read_part(scan, part)
                          if isinstance(part, prefix_lookups.PrefixRequest)
                          else scan.read_part(part)):
                yield pa.RecordBatch.from_arrays(
                    [self._spark_column(batch, f) for f in schema], schema=schema)

    def _spark_column(self, batch: pa.RecordBatch, field: pa.Field) -> pa.Array:
        """A column as Spark holds it: a sketch's estimate when asked for, cast only where
        Spark's type differs (unsigned integers, ...)."""
        column = batch.column(field.name)
        if field.name in self.estimated:
            column = self.estimated[field.name].of(column)
        return column if column.type == field.type else column.cast(field.type)

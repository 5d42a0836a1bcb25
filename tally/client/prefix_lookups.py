"""Prefix lookups: every row whose leading primary-key columns equal given values.

A prefix is checked on the client as the tablet servers check it (merge_engine.write
.key_prefixes): the first m primary-key columns, no others, none null, each value fitting its
column. It is then sent to the buckets that may hold its rows, one `prefix_lookup` read each:

- a prefix holding every partition-key column is asked of that partition only (a partition
  that does not exist has no rows); any other prefix of every partition;
- a prefix holding every bucket-key column (the primary key minus the partition key) is
  asked of that key's bucket only; any other prefix of every bucket of each partition it is
  asked of (a prefix of a `(user, day)` table partitioned by `day` names its bucket, one of
  an unpartitioned `(user, day)` table does not).

Each bucket answers its range of rows in key order at one offset of its own (a read of many
buckets is consistent per bucket, as a scan is); the rows of all buckets come back as one
table ordered by primary key. Requests are sent in parallel and retried (fresh routing, the
same table id) like any other read; one request's answer is read whole within the
connection's `request_timeout`.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import itertools
from typing import Iterator

import numpy as np
import pyarrow as pa

from merge_engine.table.hidden_columns import UNWRITTEN
from merge_engine.write.key_prefixes import prefix_table
from tally.errors import InvalidInputError
from tally.wire.bucket_hash import bucket_ids
from tally.wire.messages import SCAN_OFFSET_KEY
from tally.wire.routing import TableRouting, partition_names

# The most requests a Spark read turns its `filter` into before it scans the buckets instead
# (a request per prefix and bucket asked; whole buckets read faster than that many requests).
MAX_PREFIX_REQUESTS = 4096
# Rows per batch a bucket streams a prefix's rows in: what the server holds decoded at once.
PREFIX_BATCH_ROWS = 65536


@dataclasses.dataclass(frozen=True)
class PrefixRequest:
    """One bucket asked for the rows under one prefix (a one-row table of leading key
    columns, typed like the table's)."""

    partition: str | None
    bucket: int
    prefix: pa.Table


def prefixes_of(routing: TableRouting, given) -> pa.Table:
    """`given` (a dict, a list of dicts, or an Arrow table of leading key columns) checked and
    typed: InvalidInputError naming what does not fit."""
    return prefix_table(routing.primary_key, routing.arrow_schema, given,
                        f"table {routing.name}")


def requests(meta, prefixes: pa.Table) -> list[PrefixRequest]:
    """The requests that ask for `prefixes` (from `prefixes_of`): per distinct prefix, the
    buckets of `meta` (a TableMeta) that may hold its rows, ordered by partition and bucket."""
    routing = meta.routing
    names = set(prefixes.schema.names)
    prefixes = _distinct(prefixes)
    partitions = partition_names(prefixes, routing.partition_key) \
        if routing.partitioned and set(routing.partition_key) <= names else None
    buckets = bucket_ids(prefixes, list(routing.bucket_key), routing.bucket_count).tolist() \
        if set(routing.bucket_key) <= names else None
    out = []
    for p, b in meta.all_buckets():
        for i in range(prefixes.num_rows):
            if (partitions is None or partitions[i] == p) and (buckets is None or buckets[i] == b):
                out.append(PrefixRequest(p, b, prefixes.slice(i, 1)))
    return out


def named_partitions(routing: TableRouting, prefixes: pa.Table) -> set[str]:
    """The partitions the prefixes name (none unless they hold the whole partition key)."""
    if not routing.partitioned or not set(routing.partition_key) <= set(prefixes.schema.names):
        return set()
    return set(partition_names(prefixes, routing.partition_key))


def ask(table, request: PrefixRequest, columns: list[str] | None = None,
        batch_size: int = PREFIX_BATCH_ROWS, unwritten: bool = False
        ) -> tuple[pa.Table, int]:
    """The rows of one request in key order (`columns`, default all, then `_unwritten` when
    asked for) and the offset its bucket was read at."""
    conn = table.connection

    def attempt() -> pa.Table:
        route = conn.route(table.name, request.partition, request.bucket, table.table_id)
        header = {"op": "prefix_lookup", **route.header(), "columns": columns,
                  "batch_size": batch_size, "unwritten": unwritten}
        return conn.server(route.address).get(header, request.prefix)

    rows = conn.retry(attempt, refresh=table.name)
    offset = int((rows.schema.metadata or {}).get(SCAN_OFFSET_KEY, b"-1"))
    return rows.replace_schema_metadata(None), offset


def lookup(table, given, columns=None, unwritten: bool = False) -> pa.Table:
    """Every row under the prefixes `given`, ordered by primary key (see Table.prefix_lookup)."""
    meta = table.meta
    prefixes = prefixes_of(meta.routing, given)
    named = named_partitions(meta.routing, prefixes)
    if not named or not all(meta.has_partition(p) for p in named):
        # every partition is asked, or one the cache does not know yet (created since)
        meta = table.connection.table_meta(table.name, refresh=True, table_id=table.table_id)
    routing = meta.routing
    pk = list(routing.primary_key)
    wanted = list(routing.arrow_schema.names) if columns is None else _columns(columns, routing)
    read = wanted + [c for c in pk if c not in wanted]  # the key orders the rows
    fields = [routing.arrow_schema.field(c) for c in read]
    if unwritten:
        fields.append(pa.field(UNWRITTEN, pa.list_(pa.string())))
    schema = pa.schema(fields)
    batch = requests(meta, prefixes)
    with concurrent.futures.ThreadPoolExecutor(max(1, min(8, len(batch)))) as pool:
        parts = list(pool.map(lambda r: ask(table, r, read, PREFIX_BATCH_ROWS, unwritten)[0],
                              batch))
    rows = pa.concat_tables([p.cast(schema) for p in parts]) if parts else schema.empty_table()
    if len(parts) > 1 and rows.num_rows > 1:
        rows = rows.sort_by([(c, "ascending") for c in pk])
    return rows.select(wanted + ([UNWRITTEN] if unwritten else []))


# --- Spark's reads of a `filter` that fixes a leading part of the key ---------------------------


def filter_requests(scan, meta) -> list[PrefixRequest] | None:
    """The prefix requests that read what a scan's filter allows when the filter fixes the
    leading key columns but not the whole key (a whole key is read by key lookups), limited
    to the partitions and buckets the filter allows; None when it does not, or when that
    would take more than MAX_PREFIX_REQUESTS requests."""
    routing = meta.routing
    pk = list(routing.primary_key)
    values = scan.filter.values
    leading = list(itertools.takewhile(lambda c: c in values, pk))
    if not leading or len(leading) == len(pk):
        return None
    if np.prod([len(values[c]) for c in leading], dtype=np.float64) > MAX_PREFIX_REQUESTS:
        return None
    combos = list(itertools.product(*(values[c].to_pylist() for c in leading)))
    if not combos:
        return []
    prefixes = pa.table({c: pa.array([r[i] for r in combos], routing.arrow_schema.field(c).type)
                         for i, c in enumerate(leading)})
    partitions = scan.filter.partitions(routing)
    buckets = scan.filter.buckets(routing)
    found = [r for r in requests(meta, prefixes)
             if (partitions is None or r.partition in partitions)
             and (buckets is None or r.bucket in buckets)]
    return found if len(found) <= MAX_PREFIX_REQUESTS else None


def read_part(scan, request: PrefixRequest) -> Iterator[pa.RecordBatch]:
    """A scan's batches of one prefix request (TableScan.read_part's for a bucket): filtered
    by the scan's whole filter and projected to its columns; the offset noted in
    `scan.offsets`."""
    rows, offset = ask(scan.table, request, scan.read_columns, scan.batch_size, scan.unwritten)
    scan.offsets[(request.partition, request.bucket)] = offset
    for batch in rows.to_batches(max_chunksize=scan.batch_size):
        batch = scan.filter.apply(batch)
        if batch.num_rows:
            yield batch.select(scan.output).cast(scan.schema)


def _distinct(prefixes: pa.Table) -> pa.Table:
    if prefixes.num_rows < 2:
        return prefixes
    return prefixes.group_by(prefixes.schema.names, use_threads=False).aggregate([]) \
        .select(prefixes.schema.names).cast(prefixes.schema)


def _columns(columns, routing: TableRouting) -> list[str]:
    names = routing.arrow_schema.names
    if isinstance(columns, str) or not all(isinstance(c, str) for c in columns):
        raise InvalidInputError(f"columns must be a list of column names, not {columns!r}")
    columns = list(columns)
    unknown = [c for c in columns if c not in names]
    if unknown:
        raise InvalidInputError(f"unknown column(s) {unknown}; the table has {names}")
    if not columns or len(set(columns)) != len(columns):
        raise InvalidInputError(f"columns {columns} must name each column once, at least one")
    return columns

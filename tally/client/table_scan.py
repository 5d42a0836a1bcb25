"""`table.scan(...)`: a table's rows as Arrow record batches, each bucket read at one offset.

A scan is planned once, from the table's metadata and the filter (tally.client.scan_filter):
its parts are the buckets to read, or, when the filter pins the whole primary key, the lookup
requests of the candidate keys. Each part is read by one request at one changelog offset of its
bucket (a scan streams the bucket's batches from a snapshot; a lookup request reads its keys
under the bucket's lock), and `offsets` records those offsets as the parts are read. Different
buckets are read at their own offsets: a scan is consistent per bucket, not across buckets.

A part is retried (fresh routing, same table id) until its first batch arrives. A stream that
fails after that (its server stopped answering for the connection's `stream_idle_timeout`, went
away, or no longer leads the bucket) is resumed on the bucket's current leader, still as of the
part's offset, without handing out a row twice (tally.client.scan_resume); it gives up once it
has made no progress for the connection's `retry_timeout`. Spark's reader (sink.batch_reader)
sends the parts to its tasks, which read them without planning again.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import logging
import time
from typing import Iterator

import pyarrow as pa

from merge_engine.table.hidden_columns import UNWRITTEN
from tally.client import key_lookups
from tally.client.changelog_reader import describe_bucket, read_range
from tally.client.scan_filter import ScanFilter
from tally.client.scan_resume import KeysSeen, resumed_batches
from tally.errors import (InvalidInputError, StaleMetadataError, TableRecreatedError,
                          UnavailableError)
from tally.wire.messages import FOUND_COLUMN, MAX_SCAN_BATCH_ROWS, SCAN_OFFSET_KEY

DEFAULT_BATCH_SIZE = 65536

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class ScanPart:
    """One request of a scan: a whole bucket, or (keys not None) lookups of some of its keys."""

    partition: str | None
    bucket: int
    keys: pa.Table | None = None


class TableScan:
    """An iterable of record batches in `schema`; see the module docstring."""

    def __init__(self, table, columns=None, filter=None, batch_size: int = DEFAULT_BATCH_SIZE,
                 unwritten: bool = False, parts: list[ScanPart] | None = None,
                 meta=None) -> None:
        """`parts`: the parts an earlier scan of the same table id planned (a Spark task reads
        its driver's plan): no planning again, and cached metadata serves, since a read of a
        bucket that moved re-routes and a dropped table's id is refused by its servers.
        `meta`: the table's metadata as the caller just asked for it (a Spark read's driver,
        once per load), planned from without asking the coordinator again."""
        self.table = table
        if meta is None or meta.table_id != table.table_id:
            meta = table.connection.table_meta(table.name, refresh=parts is None,
                                               table_id=table.table_id)
        routing = meta.routing
        names = routing.arrow_schema.names
        self.columns = _columns(columns, names)
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) \
                or not 1 <= batch_size <= MAX_SCAN_BATCH_ROWS:
            raise InvalidInputError(f"batch_size must be an integer from 1 to "
                                    f"{MAX_SCAN_BATCH_ROWS:,}, not {batch_size!r}")
        if not isinstance(unwritten, bool):
            raise InvalidInputError(f"unwritten must be True or False, not {unwritten!r}")
        self.batch_size = batch_size
        self.unwritten = unwritten
        self.filter = ScanFilter.parse(filter, routing.arrow_schema)
        # The server sends the filter's columns too, so that the client can filter on them.
        self.read_columns = self.columns + [c for c in self.filter.columns
                                            if c not in self.columns]
        self.output = self.columns + ([UNWRITTEN] if unwritten else [])
        fields = [routing.arrow_schema.field(c) for c in self.columns]
        if unwritten:
            fields.append(pa.field(UNWRITTEN, pa.list_(pa.string())))
        self.schema = pa.schema(fields)
        self.parts = self._plan(meta) if parts is None else list(parts)
        self.offsets: dict[tuple[str | None, int], int] = {}

    def _plan(self, meta) -> list[ScanPart]:
        routing = meta.routing
        keys = self.filter.candidate_keys(routing)
        if keys is not None:
            return [ScanPart(r.partition, r.bucket, r.keys)
                    for r in key_lookups.requests(routing, keys)]
        partitions = self.filter.partitions(routing)
        buckets = self.filter.buckets(routing)
        return [ScanPart(p, b) for p, b in meta.all_buckets()
                if (partitions is None or p in partitions) and (buckets is None or b in buckets)]

    # --- reading ----------------------------------------------------------------------------

    def __iter__(self) -> Iterator[pa.RecordBatch]:
        for part in self.parts:
            yield from self.read_part(part)

    def read_part(self, part: ScanPart) -> Iterator[pa.RecordBatch]:
        """The batches of one part, filtered and projected."""
        if part.keys is not None:
            rows, offset = key_lookups.ask(self.table, key_lookups.KeyRequest(
                part.partition, part.bucket, part.keys), self.unwritten)
            if offset is not None:
                self.offsets[(part.partition, part.bucket)] = offset
            found = rows.filter(rows.column(FOUND_COLUMN))
            found = found.select(self.read_columns + ([UNWRITTEN] if self.unwritten else []))
            batches = found.to_batches(max_chunksize=self.batch_size)
        else:
            batches = self._stream(part)
        for batch in batches:
            batch = self.filter.apply(batch)
            if batch.num_rows:
                yield batch.select(self.output).cast(self.schema)

    def _stream(self, part: ScanPart) -> Iterator[pa.RecordBatch]:
        """The part's stream; resumed as of its offset when it fails midway (the primary key
        is read too, so that a resumed stream knows which rows were handed out)."""
        table = self.table
        conn = table.connection
        pk = list(table.routing.primary_key)
        columns = self.read_columns + [c for c in pk if c not in self.read_columns]
        header = {"op": "scan", "columns": columns, "batch_size": self.batch_size,
                  "unwritten": self.unwritten}

        def attempt():
            route = conn.route(table.name, part.partition, part.bucket, table.table_id)
            schema, batches = conn.server(route.address).stream({**header, **route.header()})
            return int(schema.metadata[SCAN_OFFSET_KEY]), schema, batches

        offset, schema, batches = conn.retry(attempt, refresh=table.name)
        self.offsets[(part.partition, part.bucket)] = offset
        return self._resumable(part, offset, schema.remove_metadata(), batches, attempt, pk)

    def _resumable(self, part: ScanPart, offset: int, schema: pa.Schema, batches, attempt,
                   pk: list[str]) -> Iterator[pa.RecordBatch]:
        table = self.table
        conn = table.connection
        where = f"table '{table.name}' {describe_bucket(part.partition, part.bucket)}"
        seen = KeysSeen(pk)
        progressed = time.monotonic()

        def changes(start: int, end: int) -> pa.Table:
            return read_range(table, part.partition, part.bucket, start, end)

        while True:
            try:
                for batch in batches:
                    seen.add(batch)
                    progressed = time.monotonic()
                    yield batch
                return
            except TableRecreatedError:
                raise
            except (UnavailableError, StaleMetadataError) as e:
                if conn.closed or time.monotonic() - progressed > conn.retry_timeout:
                    raise
                log.warning("scan of %s as of offset %d: %s; resuming on its current leader",
                            where, offset, e)
                conn.forget_silent_server(e)
                conn.invalidate(table.name)
            fresh_offset, _schema, fresh = conn.retry(attempt, refresh=table.name)
            batches = resumed_batches(fresh, schema, seen, changes, offset, fresh_offset, where)

    def to_arrow(self, sort: bool = True) -> pa.Table:
        """Every batch as one table (its parts read in parallel), sorted by primary key when
        `sort` and the scan returns every primary-key column."""
        def whole(part: ScanPart) -> list[pa.RecordBatch]:
            return list(self.read_part(part))

        with concurrent.futures.ThreadPoolExecutor(max(1, min(8, len(self.parts)))) as pool:
            batches = [b for part in pool.map(whole, self.parts) for b in part]
        result = pa.Table.from_batches(batches, schema=self.schema)
        pk = list(self.table.routing.primary_key)
        if sort and result.num_rows > 1 and all(c in self.columns for c in pk):
            result = result.sort_by([(c, "ascending") for c in pk])
        return result

    def __repr__(self) -> str:
        return (f"TableScan({self.table.name!r}, {len(self.parts)} part(s), "
                f"columns {self.columns})")


def _columns(columns, names: list[str]) -> list[str]:
    if columns is None:
        return list(names)
    if isinstance(columns, str) or not all(isinstance(c, str) for c in columns):
        raise InvalidInputError(f"columns must be a list of column names, not {columns!r}")
    columns = list(columns)
    unknown = [c for c in columns if c not in names]
    if unknown:
        raise InvalidInputError(f"unknown column(s) {unknown}; the table has {names}")
    if len(set(columns)) != len(columns):
        raise InvalidInputError(f"columns {columns} name a column twice")
    if not columns:
        raise InvalidInputError("a scan needs at least one column")
    return columns

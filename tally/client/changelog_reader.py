"""`table.changelog_reader(...)`: the changelog of every bucket of a table, resumable.

A table's changelog is one log per (partition, bucket), each with its own offsets. A reader
keeps one position per bucket (the next offset to read), reads each bucket's records in offset
order, and hands out its positions as JSON, so a consumer that saves them after processing a
batch and starts again from them neither skips nor repeats a record. Partitions created after
the reader started are found on its next poll and read from their log start.

Positions are never moved past records that were not read: a position below a bucket's log start
(retention or `truncate_log` removed those records) is an OffsetOutOfRangeError naming the
bucket and both offsets, not a silent jump. A named consumer registers its positions with the
coordinator (`commit`), so that retention keeps what it has not read yet (within the table's
`table.log.retention.consumer-ms`).
"""

from __future__ import annotations

import json
import logging
from typing import Iterator

import pyarrow as pa

from merge_engine.table.hidden_columns import (BUCKET, CHANGE_TYPE, CONTRIBUTIONS, EXPIRED, OFFSET,
                                               PARTITION, UNWRITTEN)
from tally.errors import InvalidInputError, OffsetOutOfRangeError

log = logging.getLogger(__name__)

EARLIEST, LATEST = "earliest", "latest"
DEFAULT_BATCH_RECORDS = 10_000

Positions = dict[tuple[str | None, int], int]


def changelog_schema(routing, include_state: bool = False, descriptor=None) -> pa.Schema:
    """What a changelog reader yields: the change type, offset, partition and bucket of each
    record, then the row image (with `include_state`, also which columns the image leaves
    unwritten and the contribution counts of counted columns); for a table with a row TTL
    (`descriptor` tells), `_expired`, true on the -D records of expired rows."""
    fields = [pa.field(CHANGE_TYPE, pa.string(), nullable=False),
              pa.field(OFFSET, pa.int64(), nullable=False),
              pa.field(PARTITION, pa.string()),
              pa.field(BUCKET, pa.int32(), nullable=False)]
    fields += [pa.field(f.name, f.type) for f in routing.arrow_schema]
    if include_state:
        fields += [pa.field(UNWRITTEN, pa.list_(pa.string())),
                   pa.field(CONTRIBUTIONS, pa.list_(pa.int64()))]
    if descriptor is not None and descriptor.row_ttl_ms is not None:
        fields.append(pa.field(EXPIRED, pa.bool_()))
    return pa.schema(fields)


def shape_records(records: pa.Table, partition: str | None, bucket: int,
                  schema: pa.Schema) -> pa.Table:
    """One bucket's changelog records (as a tablet serves them) in the reader's schema."""
    n = records.num_rows
    columns = []
    for f in schema:
        if f.name == PARTITION:
            columns.append(pa.array([partition] * n, type=pa.string()))
        elif f.name == BUCKET:
            columns.append(pa.array([bucket] * n, type=pa.int32()))
        else:
            columns.append(records.column(f.name).cast(f.type))
    return pa.Table.from_arrays(columns, schema=schema)


def read_range(table, partition: str | None, bucket: int, start: int, end: int) -> pa.Table:
    """The records [start, end) of one bucket, or OffsetOutOfRangeError naming the table, the
    bucket and the range (what the tablet keeps is in the message)."""
    try:
        return table.changelog(bucket, start, end, partition=partition)
    except OffsetOutOfRangeError as e:
        where = describe_bucket(partition, bucket)
        raise OffsetOutOfRangeError(
            f"cannot read the changelog of table '{table.name}' {where} at offsets "
            f"[{start}, {end}): {e}. Records below a bucket's log start were "
            "removed by retention or truncate_log; register a consumer to make retention keep "
            "what it has not read, or start again from 'earliest'") from None


def describe_bucket(partition: str | None, bucket: int) -> str:
    return f"bucket {bucket}" if partition is None else f"partition '{partition}' bucket {bucket}"


# --- positions as JSON ---------------------------------------------------------------------


def positions_to_json(positions: Positions) -> list[list]:
    """[[partition or null, bucket, offset], ...], sorted by partition and bucket."""
    return [[p, int(b), int(o)] for (p, b), o in
            sorted(positions.items(), key=lambda kv: (kv[0][0] or "", kv[0][1]))]


def parse_positions(value) -> Positions:
    """Positions given as JSON (text or parsed) in either form:
    `[[partition or null, bucket, offset], ...]` (what `positions()` returns), or an object:
    `{"<bucket>": offset}` for a table without partitions,
    `{"<partition>": {"<bucket>": offset}}` for a partitioned one."""
    if isinstance(value, (str, bytes)):
        try:
            value = json.loads(value)
        except ValueError as e:
            raise InvalidInputError(f"changelog positions are not JSON: {e}") from None
    out: Positions = {}

    def put(partition, bucket, offset) -> None:
        if partition is not None and not isinstance(partition, str):
            raise InvalidInputError(f"a partition in changelog positions is text or null, "
                                    f"not {partition!r}")
        if isinstance(bucket, str) and bucket.isdigit():
            bucket = int(bucket)
        for what, number in (("bucket", bucket), ("offset", offset)):
            if isinstance(number, bool) or not isinstance(number, int) or number < 0:
                raise InvalidInputError(f"a {what} in changelog positions is a non-negative "
                                        f"integer, not {number!r}")
        out[(partition, bucket)] = offset

    if isinstance(value, list):
        for item in value:
            if not isinstance(item, list) or len(item) != 3:
                raise InvalidInputError("changelog positions are [partition, bucket, offset] "
                                        f"triples, not {item!r}")
            put(*item)
    elif isinstance(value, dict):
        for key, inner in value.items():
            if isinstance(inner, dict):
                for bucket, offset in inner.items():
                    put(key, bucket, offset)
            else:
                put(None, key, inner)
    else:
        raise InvalidInputError("changelog positions are a list of [partition, bucket, offset] "
                                f"or an object of buckets, not {type(value).__name__}")
    return out


def resolve_start(start, log_offsets: dict[tuple[str | None, int], tuple[int, int]],
                  table: str, routing) -> Positions:
    """The first position of every bucket there is now: 'earliest' (each log start),
    'latest' (each log end) or given positions (buckets they leave out start at their log
    start; a given position below its bucket's log start or past its end is refused)."""
    if start == EARLIEST:
        return {key: s for key, (s, _e) in log_offsets.items()}
    if start == LATEST:
        return {key: e for key, (_s, e) in log_offsets.items()}
    if isinstance(start, str) and start.strip()[:1] not in ("[", "{"):
        raise InvalidInputError(f"a changelog start is 'earliest', 'latest' or positions "
                                f"(JSON), not {start!r}")
    given = parse_positions(start)
    for (partition, bucket), offset in given.items():
        if partition is not None and not routing.partitioned:
            raise InvalidInputError(f"table '{table}' has no partitions, but the positions name "
                                    f"partition {partition!r}")
        if not 0 <= bucket < routing.bucket_count:
            raise InvalidInputError(f"table '{table}' has buckets 0..{routing.bucket_count - 1}, "
                                    f"but the positions name bucket {bucket}")
        found = log_offsets.get((partition, bucket))
        if found is None:
            continue  # a dropped partition: nothing left to read
        low, high = found
        if not low <= offset <= high:
            raise OffsetOutOfRangeError(
                f"the position {offset} of table '{table}' {describe_bucket(partition, bucket)} "
                f"is outside its log [{low}, {high})" + (
                    ": the records below the log start were removed by retention or "
                    "truncate_log" if offset < low else ""))
    out = {key: s for key, (s, _e) in log_offsets.items()}
    out.update({key: o for key, o in given.items() if key in log_offsets})
    return out


# --- the reader ----------------------------------------------------------------------------


class ChangelogReader:
    """Reads the changelog of every bucket of one table, one position per bucket.

    Iterating yields Arrow record batches of one bucket each, in offset order per bucket, until
    every bucket is read up to where its log ended when the iteration began a round; iterate
    again (or `poll`) for what was written since. `positions()` is up to date as each batch is
    handed out: save it after processing a batch, and a reader started from it continues with
    the next record. A batch handed out counts as read by this reader: a consumer that drops
    one unprocessed starts again from the positions it saved. With `consumer`, the reader starts from that consumer's registered
    positions when it has some (`start` otherwise), and `commit()` registers its positions.
    """

    def __init__(self, table, start=EARLIEST, *, consumer: str | None = None,
                 batch_records: int = DEFAULT_BATCH_RECORDS, include_state: bool = False) -> None:
        if isinstance(batch_records, bool) or not isinstance(batch_records, int) \
                or batch_records < 1:
            raise InvalidInputError(f"batch_records must be a positive integer, not "
                                    f"{batch_records!r}")
        self.table = table
        self.consumer = consumer
        self.batch_records = batch_records
        admin = table.connection.admin
        meta = table.connection.table_meta(table.name, refresh=True, table_id=table.table_id)
        self.schema = changelog_schema(meta.routing, include_state, meta.descriptor)
        if consumer is not None:
            registered = admin.consumer(table.name, consumer, table_id=table.table_id)
            if registered is not None:
                start = registered.positions_json()
        offsets = admin.list_log_offsets(table.name, table.table_id)
        self._positions: Positions = resolve_start(start, offsets, table.name, meta.routing)

    def positions(self) -> list[list]:
        """Where to resume: [[partition or null, bucket, next offset], ...] (JSON-friendly)."""
        return positions_to_json(self._positions)

    def commit(self) -> None:
        """Register this reader's positions as its consumer's: retention keeps every bucket's
        records from there on (bounded by the table's `table.log.retention.consumer-ms`)."""
        if self.consumer is None:
            raise InvalidInputError("this changelog reader has no consumer name to commit under; "
                                    "pass consumer='...' to changelog_reader")
        self.table.connection.admin.commit_consumer(self.table.name, self.consumer,
                                                    self.positions(), table_id=self.table.table_id)

    def _log_offsets(self) -> dict[tuple[str | None, int], tuple[int, int]]:
        """Every bucket's (log start, log end), adding partitions created since (from their
        log start) and forgetting dropped ones."""
        offsets = self.table.connection.admin.list_log_offsets(self.table.name,
                                                               self.table.table_id)
        for key, (start, _end) in offsets.items():
            if key not in self._positions:
                log.info("changelog of '%s': reading new %s from offset %d", self.table.name,
                         describe_bucket(*key), start)
                self._positions[key] = start
        for key in [k for k in self._positions if k not in offsets]:
            del self._positions[key]
        return offsets

    def __iter__(self) -> Iterator[pa.RecordBatch]:
        ends = {key: end for key, (_s, end) in self._log_offsets().items()}
        while True:
            progressed = False
            for key in sorted(ends, key=lambda k: (k[0] or "", k[1])):
                position = self._positions.get(key)
                if position is None or position >= ends[key]:
                    continue
                partition, bucket = key
                upto = min(ends[key], position + self.batch_records)
                records = read_range(self.table, partition, bucket, position, upto)
                shaped = shape_records(records, partition, bucket, self.schema)
                for batch in shaped.combine_chunks().to_batches():
                    if batch.num_rows == 0:
                        continue
                    self._positions[key] = int(batch.column(OFFSET)[-1].as_py()) + 1
                    progressed = True
                    yield batch
                self._positions[key] = max(self._positions[key], upto)
            if not progressed:
                return

    def poll(self) -> pa.Table:
        """Everything written since the last read, as one table (empty when caught up)."""
        batches = list(self)
        return pa.Table.from_batches(batches, schema=self.schema)

    def __repr__(self) -> str:
        return (f"ChangelogReader({self.table.name!r}, consumer={self.consumer!r}, "
                f"{len(self._positions)} buckets)")

"""`conn.table(name)`: writers, point and batch lookups, scans and changelog reads of one table.

A handle stays with the table it resolved (its table id), and so do its writers and reads: once
the table is dropped and its name given to a new table, every one of them raises
TableRecreatedError, and none reads or writes the new table. Mixing the two would be wrong in
both directions: a writer's rows would land in a table they were never validated against, and
a reader (undo reads changelog ranges at offsets it took from the old table) would take the
new table's records for the old one's. A new handle (`conn.table(name)`) reaches the new table.
"""

from __future__ import annotations

import pyarrow as pa

from tally.client import prefix_lookups
from tally.client.bucket_writer import BucketWriter
from tally.client.key_lookups import lookup_aligned
from tally.client.table_scan import DEFAULT_BATCH_SIZE, TableScan
from tally.client.writer import UpsertWriter
from tally.errors import MissingDependencyError
from tally.wire.messages import FOUND_COLUMN


class Table:
    """A handle on one table. Reads go straight to the tablet servers of its buckets."""

    def __init__(self, connection, name: str, table_id: int) -> None:
        self.connection = connection
        self.name = name
        self.table_id = table_id

    @property
    def meta(self):
        return self.connection.table_meta(self.name, table_id=self.table_id)

    @property
    def routing(self):
        return self.meta.routing

    def bucket_of(self, key: dict) -> tuple[str | None, int]:
        """(partition, bucket) of a key: the client's stable bucket function (for sinks)."""
        routing = self.routing
        return routing.partition_of(key), routing.bucket_of(key)

    # --- writes -------------------------------------------------------------------------

    def upsert_writer(self, target_columns=None, mode=None, lease=None, attempt=None,
                      **options) -> UpsertWriter:
        """A writer of full rows (or of `target_columns`, which must include the key) in
        `mode` (MergeMode.AGGREGATE by default). With `lease`, every write carries the lease's
        owner and fencing token, and fails once the lease is lost; `attempt` (from
        `conn.locks.register_attempt`) fences this writer when a later attempt registers."""
        return UpsertWriter(self, target_columns, mode, lease=lease, attempt=attempt, **options)

    def bucket_writer(self, bucket: int, target_columns=None, mode=None, lease=None,
                      attempt=None, **options) -> BucketWriter:
        """A writer of one bucket's rows that the caller already validated, bucketed and
        folded (the Spark sink's tasks): sent as they are, in order; the tablet server checks
        them. `lease` and `attempt` as for `upsert_writer`."""
        from merge_engine import MergeMode

        return BucketWriter(self, bucket, mode if mode is not None else MergeMode.AGGREGATE,
                            target_columns, lease=lease, attempt=attempt, **options)

    # --- reads --------------------------------------------------------------------------

    def _read(self, partition: str | None, bucket: int, header: dict,
              payload: pa.Table | None = None) -> pa.Table:
        conn = self.connection

        def attempt() -> pa.Table:
            route = conn.route(self.name, partition, bucket, self.table_id)
            return conn.server(route.address).get({**header, **route.header()}, payload)

        return conn.retry(attempt, refresh=self.name)

    def lookup(self, key: dict) -> dict | None:
        """The row with this primary key, or None. `key` holds the primary-key columns (other
        entries are ignored); a missing or null key column, or a value its column cannot
        take, is an InvalidInputError naming the column. Only committed rows (below the
        bucket's high watermark, which a failover keeps) are answered."""
        meta = self.meta
        keys = meta.point_keys
        partition, bucket, payload = keys.prepare(key)
        if partition is not None and not meta.has_partition(partition):
            if not self.connection.table_meta(self.name, refresh=True,
                                              table_id=self.table_id).has_partition(partition):
                return None
        conn = self.connection

        def attempt() -> dict | None:
            current = conn.table_meta(self.name, table_id=self.table_id)  # fresh on a retry
            address, head = current.lookup_head(partition, bucket)
            # read with the metadata asked with: a row of other columns (one added since)
            # is a StaleMetadataError, and the retry reads it with refreshed metadata
            return current.point_keys.answer_row(conn.server(address).lookup(head + payload))

        return conn.retry(attempt, refresh=self.name)

    def lookup_many(self, keys):
        """The rows of many keys, aligned with them: for a list of dicts a list holding each
        key's row as a dict, or None where the key has no row; for an Arrow table of keys
        (holding the primary-key columns) a table with one row per key, all null where the
        key has no row. Keys are sent per bucket, up to 4,096 per request, buckets in
        parallel; each request reads its bucket at one offset."""
        rows = lookup_aligned(self, keys)
        if isinstance(keys, (pa.Table, pa.RecordBatch)):
            return rows.drop_columns([FOUND_COLUMN])
        found = rows.column(FOUND_COLUMN).to_pylist()
        values = rows.drop_columns([FOUND_COLUMN]).to_pylist()
        return [row if hit else None for row, hit in zip(values, found)]

    def ids(self, keys) -> pa.Array:
        """A dictionary table's ids of `keys` (a list of str, or bytes for a binary dictionary,
        or an Arrow array), in input order, assigning new ids to absent keys (insert-if-absent,
        docs/dictionaries.md); InvalidInputError for a null key, a key of another type or a
        table that is no dictionary, with nothing assigned."""
        from tally.client.assigned_ids import assign_ids

        return assign_ids(self, keys)

    def lookup_ids(self, keys) -> pa.Array:
        """A dictionary table's ids of `keys`, null where a key has none; assigns nothing."""
        from tally.client.assigned_ids import lookup_ids

        return lookup_ids(self, keys)

    def prefix_lookup(self, prefix: dict, columns=None, unwritten: bool = False) -> pa.Table:
        """Every row whose leading primary-key columns equal `prefix` (a dict of the first
        one, two, ... key columns: all rows of user 7 of a `(user, day)` key are
        `prefix_lookup({"user": 7})`), ordered by primary key, as an Arrow table of
        `columns` (default all; `unwritten` adds `_unwritten`). A prefix holding the bucket
        key (the primary key minus the partition key) asks that key's bucket only, one
        holding the partition key that partition only; any other asks every bucket of every
        partition it may be in. Each bucket reads its range of rows at one offset. A prefix
        that is not a leading part of the key (a column before one it names is missing),
        names other columns or holds a null or a value its column cannot take is an
        InvalidInputError naming the columns (tally.client.prefix_lookups)."""
        return prefix_lookups.lookup(self, prefix, columns, unwritten)

    def prefix_lookup_many(self, prefixes, columns=None, unwritten: bool = False) -> pa.Table:
        """`prefix_lookup` of many prefixes (a list of dicts naming the same leading key
        columns, or an Arrow table of them) at once: the rows under any of them, each once,
        ordered by primary key; buckets are asked in parallel."""
        return prefix_lookups.lookup(self, prefixes, columns, unwritten)

    def scan(self, columns=None, filter=None, batch_size: int = DEFAULT_BATCH_SIZE,
             unwritten: bool = False) -> TableScan:
        """The table's rows as pyarrow RecordBatches of at most `batch_size` rows (iterate the
        result), each bucket read at one changelog offset (`.offsets` once read).

        `columns`: the columns to return, in that order (default all). `filter`: a dict of
        column -> value or list of values, all of which a row must match; equality on every
        primary-key column reads by key lookups, on every partition-key column only those
        partitions, on every bucket-key column only those buckets (see
        tally.client.scan_filter). `unwritten`: add the hidden `_unwritten` column (per row,
        the value columns no write has targeted yet). Rows come in no particular order."""
        return TableScan(self, columns, filter, batch_size, unwritten)

    def to_arrow(self, columns=None, filter=None, unwritten: bool = False) -> pa.Table:
        """Every row (of `filter`, see `scan`) as one table, ordered by primary key."""
        if columns is None:
            return self.scan(None, filter, unwritten=unwritten).to_arrow()
        columns = list(columns) if not isinstance(columns, str) else columns
        # The key orders the rows, so it is read even when not asked for.
        extra = [c for c in self.routing.primary_key
                 if isinstance(columns, list) and c not in columns]
        table = self.scan(columns + extra if extra else columns, filter,
                          unwritten=unwritten).to_arrow()
        return table.drop_columns(extra) if extra else table

    def to_pandas(self, columns=None, filter=None, unwritten: bool = False):
        """`to_arrow(...)` as a pandas DataFrame; MissingDependencyError without pandas."""
        import importlib

        try:
            importlib.import_module("pandas")  # optional: the client does not depend on it
        except ImportError:
            raise MissingDependencyError(
                "Table.to_pandas needs pandas, which is not installed: pip install pandas "
                "(or the [spark] extra), or use to_arrow()") from None
        return self.to_arrow(columns, filter, unwritten).to_pandas()

    def changelog(self, bucket: int, start: int = 0, end: int | None = None,
                  partition: str | None = None) -> pa.Table:
        """The changelog records of one bucket over [start, end)."""
        return self._read(partition, int(bucket),
                          {"op": "changelog", "start": int(start),
                           "end": None if end is None else int(end)})

    def changelog_reader(self, start="earliest", *, consumer: str | None = None,
                         batch_records: int = 10_000, include_state: bool = False):
        """A reader of the changelog of every bucket and partition (later ones included), with
        resumable positions: `start` is 'earliest', 'latest' or positions a reader's
        `positions()` returned; with `consumer`, that consumer's registered positions win and
        `reader.commit()` registers them (see ChangelogReader)."""
        from tally.client.changelog_reader import ChangelogReader

        return ChangelogReader(self, start, consumer=consumer, batch_records=batch_records,
                               include_state=include_state)

    def list_offsets(self) -> dict[tuple[str | None, int], int]:
        return self.connection.admin.list_offsets(self.name, self.table_id)

    def __repr__(self) -> str:
        return f"Table({self.name!r}, table id {self.table_id})"

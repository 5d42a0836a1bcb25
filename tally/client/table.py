"""`conn.table(name)`: writers, point lookups, full scans and changelog reads of one table.

A handle stays with the table it resolved (its table id), and so do its writers and reads: once
the table is dropped and its name given to a new table, every one of them raises
TableRecreatedError, and none reads or writes the new table. Mixing the two would be wrong in
both directions: a writer's rows would land in a table they were never validated against, and
a reader (undo reads changelog ranges at offsets it took from the old table) would take the
new table's records for the old one's. A new handle (`conn.table(name)`) reaches the new table.
"""

from __future__ import annotations

import concurrent.futures

import pyarrow as pa

from tally.client.bucket_writer import BucketWriter
from tally.client.writer import UpsertWriter
from tally.errors import InvalidInputError
from tally.wire.bucket_hash import bucket_ids


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
        """The row with this primary key, or None."""
        if not isinstance(key, dict):
            raise InvalidInputError(f"a lookup key is a dict of primary-key values, not {key!r}")
        routing = self.routing
        key_table = routing.key_table(key)
        partition = routing.partition_of(key)
        if partition is not None and not self.meta.has_partition(partition):
            if not self.connection.table_meta(self.name, refresh=True,
                                              table_id=self.table_id).has_partition(partition):
                return None
        bucket = int(bucket_ids(key_table, list(routing.bucket_key), routing.bucket_count)[0])
        conn = self.connection

        def attempt() -> pa.Table:
            route = conn.route(self.name, partition, bucket, self.table_id)
            return conn.server(route.address).lookup(route.header(), key_table)

        rows = conn.retry(attempt, refresh=self.name).to_pylist()
        return rows[0] if rows else None

    def to_arrow(self) -> pa.Table:
        """Every row of the table, ordered by primary key."""
        meta = self.connection.table_meta(self.name, refresh=True, table_id=self.table_id)
        buckets = meta.all_buckets()
        with concurrent.futures.ThreadPoolExecutor(max(1, min(8, len(buckets)))) as pool:
            parts = list(pool.map(lambda pb: self._read(pb[0], pb[1], {"op": "scan"}), buckets))
        schema = meta.routing.arrow_schema
        parts = [p for p in parts if p.num_rows] or [schema.empty_table()]
        table = pa.concat_tables([p.cast(parts[0].schema) for p in parts])
        if table.num_rows and (meta.routing.partitioned or len(buckets) > 1):
            table = table.sort_by([(k, "ascending") for k in meta.routing.primary_key])
        return table

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

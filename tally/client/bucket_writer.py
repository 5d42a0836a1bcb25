"""A bucket-addressed writer: rows already validated, bucketed and folded, sent to their bucket.

For a writer that did that work itself: a Spark task of the sink owns one bucket and folds its
rows per key with the table's own aggregators before it writes. Validating and bucketing again
here would only repeat it, so this writer does neither: it sends the rows as they are to the
tablet server of their (partition, bucket), one request after another (the bucket applies them
in call order), and the tablet server checks them at its trust boundary (every row in the
addressed bucket, the lease, the values). A partitioned table's bucket spans every partition,
so the rows are split by partition name first, unless the caller knows each row's partition
already (`put_partitions`: the sink names every row once, where it buckets it).

Every request carries the writer's (id, sequence) and keeps them across its retries
(`Connection.put`, the one way a write request leaves the client), so a request retried after
a lost acknowledgement is applied once. It carries the table id of the writer's table handle
too: once that table is dropped and re-created, writes raise TableRecreatedError.
"""

from __future__ import annotations

import uuid

import numpy as np
import pyarrow as pa

from tally.wire.routing import partition_names

DEFAULT_MAX_REQUEST_BYTES = 4 << 20


def write_header(table: str, op: str, mode, target_columns, writer: tuple[str, int],
                 lease=None, attempt: int | None = None) -> dict:
    """The JSON header of one write request (the bucket's address is added per route)."""
    header = {"op": op, "table": table, "mode": mode.name, "target_columns": target_columns,
              "writer": list(writer)}
    if lease is not None:
        header["lease"] = {"owner_id": lease.owner_id, "token": lease.token,
                           "secret": lease.secret, "attempt": attempt}
    return header


def rows_per_request(rows: pa.Table, max_bytes: int) -> int:
    """How many of `rows` make about `max_bytes` (at least one)."""
    return max(1, int(rows.num_rows * max_bytes / max(rows.nbytes, 1)))


def request_slices(rows: pa.Table, max_bytes: int) -> list[pa.Table]:
    """`rows` cut into zero-copy slices of about `max_bytes` each (at least one row each)."""
    if rows.num_rows == 0:
        return []
    per_request = rows_per_request(rows, max_bytes)
    return [rows.slice(start, per_request) for start in range(0, rows.num_rows, per_request)]


class BucketWriter:
    """Writes the rows of one bucket (see the module docstring). Not thread-safe: one bucket,
    one caller, requests in order."""

    def __init__(self, table, bucket: int, mode, target_columns=None, *, lease=None,
                 attempt: int | None = None,
                 max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES) -> None:
        from merge_engine import MergeMode

        self._conn = table.connection
        self._table = table.name
        self._table_id = table.table_id
        self._routing = table.routing
        self.bucket = int(bucket)
        self.mode = MergeMode.parse(mode)
        self.target_columns = list(target_columns) if target_columns is not None else None
        self.lease = lease
        self.attempt = attempt
        self.writer_id = f"w-{uuid.uuid4().hex}"
        self._sequence = 0
        self._max_request_bytes = max_request_bytes

    def put(self, rows: pa.Table) -> dict[tuple[str | None, int], int]:
        """Send `rows` (all of this bucket); {(partition, bucket): end offset after them}."""
        return self.put_partitions(self._by_partition(rows))

    def put_partitions(self, parts) -> dict[tuple[str | None, int], int]:
        """Send each (partition name, its rows of this bucket) of `parts`, in order; the end
        offsets as `put` returns them."""
        ends = {}
        for partition, part in parts:
            for piece in request_slices(part, self._max_request_bytes):
                ends[(partition, self.bucket)] = self._send(partition, piece)
        return ends

    def _by_partition(self, rows: pa.Table) -> list[tuple[str | None, pa.Table]]:
        """The rows of each partition, in input order (one part for unpartitioned tables)."""
        if not self._routing.partitioned or rows.num_rows == 0:
            return [(None, rows)] if rows.num_rows else []
        names = pa.array(partition_names(rows, self._routing.partition_key)).dictionary_encode()
        codes = names.indices.to_numpy(zero_copy_only=False)
        parts = []
        for code, name in enumerate(names.dictionary.to_pylist()):
            positions = np.flatnonzero(codes == code)
            parts.append((name, rows.take(pa.array(positions, type=pa.int64()))))
        return parts

    def _send(self, partition: str | None, rows: pa.Table) -> int:
        if self.lease is not None:
            self._conn.locks.check(self.lease)
        self._sequence += 1
        header = write_header(self._table, "put", self.mode, self.target_columns,
                              (self.writer_id, self._sequence), self.lease, self.attempt)
        return self._conn.put(self._table, self._table_id, partition, self.bucket, header, rows)

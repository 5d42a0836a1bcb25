"""The upsert writer: rows bucketed on the client, sent per bucket in order, retried exactly once.

`upsert(rows)` and `delete(keys)` validate the input, split it by (partition, bucket) with the
stable bucket function and queue each part on its bucket. Each bucket has at most one request in
flight, so its writes apply in call order; different buckets are sent in parallel on a small
thread pool. Consecutive queued parts of one bucket are coalesced into one request (up to
`max_request_bytes`), which keeps requests large when callers write small batches.

Every request carries `(writer_id, sequence)`. The sequence is taken when a request is formed
and kept for its retries, and it grows across the writer, so it grows within every bucket: a
request retried after a lost acknowledgement (a tablet server killed after applying it) is
recognised by the tablet and not applied again. Requests carry the writer's table id (its
table handle's): once that table is dropped and re-created, they raise TableRecreatedError
instead of following the name into the new table.

`flush()` waits until everything queued is acknowledged and returns the end offset of every
(partition, bucket) written since the previous flush; a request that failed for good (bad
input the client could not see, a server down past the retry timeout) raises there.

A flush is all or nothing by default: once one bucket refuses its part, nothing more of the
flush is sent, and the parts other buckets applied are taken back (each bucket's server writes
back the images from before this writer's records) before the refusal is
raised, saying so. A part that cannot be taken back (another writer changed its keys since, or
its server is away) makes the flush raise PartialWriteError, naming what stays applied. With
`atomic=False` nothing is taken back: a flush refused in some buckets and applied in others
raises PartialWriteError at once.

A writer of a table with rollups writes them too (tally.client.rollup_writes): each upsert's
rows projected onto every rollup it feeds, queued with the source's, and flushed with them as
one all-or-nothing flush across the tables.
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import threading
import uuid

import pyarrow as pa

from tally.client.bucket_writer import DEFAULT_MAX_REQUEST_BYTES, rows_per_request, write_header
from tally.client.write_tables import write_table
from tally.client.flush_outcome import FlushOutcome
from tally.client.rollup_writes import feeds_of, joined_outcome, rollup_parts
from tally.errors import TallyError
from tally.wire.routing import group_rows

DEFAULT_MAX_PENDING_BYTES = 256 << 20


@dataclasses.dataclass
class Part:
    op: str                   # "put" or "delete"
    rows: pa.Table


class BucketQueue:
    """The parts waiting for one (partition, bucket), and whether a sender is draining them."""

    def __init__(self) -> None:
        self.parts: collections.deque[Part] = collections.deque()
        self.sending = False


class UpsertWriter:
    """Writes to one table; see the module docstring. Thread-safe; use one per producer."""

    def __init__(self, table, target_columns=None, mode=None, *, lease=None, attempt=None,
                 atomic: bool = True, workers: int = 8,
                 max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES,
                 max_pending_bytes: int = DEFAULT_MAX_PENDING_BYTES,
                 rollups: bool | None = None) -> None:
        """`rollups`: write the table's rollups too (docs/rollups.md); None: unless this is
        an undo's writer (OVERWRITE under a lease), which restores the source alone."""
        from merge_engine import MergeMode

        self._table = table
        self._conn = table.connection
        self.table_id = table.table_id
        self.target_columns = list(target_columns) if target_columns is not None else None
        self.mode = MergeMode.parse(mode if mode is not None else MergeMode.AGGREGATE)
        self.lease = lease
        self.attempt = attempt
        self.writer_id = f"w-{uuid.uuid4().hex}"
        self._sequence = 0
        self._max_request_bytes = max_request_bytes
        self._max_pending_bytes = max_pending_bytes
        self._pending_bytes = 0
        self._queues: dict[tuple[str | None, int], BucketQueue] = {}
        self.atomic = bool(atomic)
        self._outcome = FlushOutcome()      # what this flush applied and what refused it
        self._cond = threading.Condition()
        self._pool = concurrent.futures.ThreadPoolExecutor(workers,
                                                           thread_name_prefix="tally-writer")
        self._closed = False
        if rollups is None:
            rollups = not (self.mode is MergeMode.OVERWRITE and lease is not None)
        self._feeds = feeds_of(table, self.target_columns, self.mode, workers, self.atomic) \
            if rollups else []
        self._conn.on_close(self.close)

    # --- public API ---------------------------------------------------------------------

    def upsert(self, rows) -> None:
        """Queue rows (an Arrow Table/RecordBatch or a list of dicts) for their buckets."""
        self._check_lease()
        meta = self._table.meta
        table = write_table(meta, rows, self.target_columns, self.mode)
        self._enqueue_fed(meta, table)

    def retract(self, rows) -> None:
        """Queue rows whose contributions are taken back (a refund, an edited order's old
        values): sum subtracts, count decrements, array_agg/string_agg remove one occurrence,
        last_value clears a matching value. Not a delete: the keys stay."""
        self._check_lease()
        meta = self._table.meta
        table = write_table(meta, rows, self.target_columns, self.mode, retract=True)
        self._enqueue_fed(meta, table)

    def delete(self, keys) -> None:
        """Queue deletes of the given keys (dicts or an Arrow table with the key columns)."""
        self._check_lease()
        for feed in self._feeds:
            feed.spec.check_delete()
        meta = self._table.meta
        table = write_table(meta, keys, self.target_columns, self.mode, keys_only=True)
        self._enqueue("delete", meta, table)

    def flush(self) -> dict[tuple[str | None, int], int]:
        """Wait for every queued write; {(partition, bucket): end offset} since the last flush."""
        outcome = self.settle()
        ends, undo = outcome.ends(), self._undo
        if self._feeds:  # the rollups' parts are all or nothing with the source's
            outcome, undo = joined_outcome(outcome, undo, self._feeds)
        if outcome.refused:
            raise outcome.failure(undo if self.atomic else None)
        self._check_lease()
        return ends

    def settle(self) -> FlushOutcome:
        """Wait for every queued write; what this flush applied and what refused it."""
        with self._cond:
            while any(q.parts or q.sending for q in self._queues.values()):
                self._cond.wait()
            outcome, self._outcome = self._outcome, FlushOutcome()
        return outcome

    def _check_lease(self) -> None:
        if self.lease is not None:
            self._conn.locks.check(self.lease)

    def close(self) -> None:
        """Flush what is queued (errors are dropped: call flush() to see them) and stop."""
        with self._cond:
            if self._closed:
                return
            self._closed = True
        try:
            self.flush()
        except TallyError:
            pass
        self._pool.shutdown(wait=True)
        for feed in self._feeds:
            feed.writer.close()

    def __enter__(self) -> "UpsertWriter":
        return self

    def __exit__(self, exc_type, *exc: object) -> None:
        if exc_type is None:
            self.flush()
        self.close()

    # --- queueing -----------------------------------------------------------------------

    def _enqueue(self, op: str, meta, table: pa.Table) -> None:
        self._raise_if_closed()
        groups = group_rows(meta.routing, table)
        size = sum(g.rows.nbytes for g in groups)
        with self._cond:
            if self.atomic and self._outcome.refused:
                return  # the flush is refused already: nothing more of it is sent
            while self._pending_bytes > self._max_pending_bytes and not self._outcome.refused:
                self._cond.wait()
            self._pending_bytes += size
            for g in groups:
                key = (g.partition, g.bucket)
                queue = self._queues.setdefault(key, BucketQueue())
                queue.parts.append(Part(op, g.rows))
                if not queue.sending:
                    queue.sending = True
                    self._pool.submit(self._drain, key, queue)

    def _enqueue_fed(self, meta, table: pa.Table) -> None:
        """Queue validated rows, and their projection onto every rollup this writer feeds."""
        parts = rollup_parts(self._feeds, table)  # every table's rows checked before any is queued
        self._enqueue("put", meta, table)
        for writer, rollup_meta, rows in parts:
            writer._enqueue("put", rollup_meta, rows)

    def _raise_if_closed(self) -> None:
        if self._closed:
            raise TallyError("this writer is closed")

    def _next_request(self, queue: BucketQueue) -> tuple[str, pa.Table, int, int] | None:
        """Coalesce the queue's leading parts of one op into a request (under the lock)."""
        if not queue.parts:
            return None
        op = queue.parts[0].op
        tables, size = [], 0
        while queue.parts and queue.parts[0].op == op and \
                (not tables or queue.parts[0].rows.schema.equals(tables[0].schema)):
            part = queue.parts[0]  # coalesce only parts of one shape (retractions carry more)
            if tables and size + part.rows.nbytes > self._max_request_bytes:
                break
            if not tables and part.rows.nbytes > self._max_request_bytes:
                count = rows_per_request(part.rows, self._max_request_bytes)
                head = part.rows.slice(0, count)
                part.rows = part.rows.slice(count)
                if part.rows.num_rows == 0:
                    queue.parts.popleft()
                tables.append(head)
                size += head.nbytes
                break
            queue.parts.popleft()
            tables.append(part.rows)
            size += part.rows.nbytes
        self._sequence += 1
        rows = tables[0] if len(tables) == 1 else pa.concat_tables(tables, promote_options="none")
        return op, rows, self._sequence, size

    def _drain(self, key: tuple[str | None, int], queue: BucketQueue) -> None:
        """Send one bucket's queue in order until it is empty (runs on the pool)."""
        while True:
            with self._cond:
                if self.atomic and self._outcome.refused:
                    self._pending_bytes -= sum(p.rows.nbytes for p in queue.parts)
                    queue.parts.clear()  # the flush is refused: the rest is not sent
                request = self._next_request(queue)
                if request is None:
                    queue.sending = False
                    if not any(q.parts or q.sending for q in self._queues.values()):
                        self._pending_bytes = 0  # slices' nbytes are estimates: resync
                    self._cond.notify_all()
                    return
            op, rows, sequence, size = request
            try:
                applied = self._send(key, op, rows, sequence)
                failure = None
            except TallyError as e:
                failure = e
            except Exception as e:  # noqa: BLE001 - surface bugs at flush, never lose them
                failure = TallyError(f"write to bucket {key} failed: {type(e).__name__}: {e}")
            with self._cond:
                self._pending_bytes -= size
                if failure is None:
                    self._outcome.applied(key, *applied)
                else:
                    self._outcome.refuse(key, failure)
                self._cond.notify_all()

    def _send(self, key: tuple[str | None, int], op: str, rows: pa.Table,
              sequence: int) -> tuple[int | None, int]:
        partition, bucket = key
        header = write_header(self._table.name, op, self.mode, self.target_columns,
                              (self.writer_id, sequence), self.lease, self.attempt)
        return self._conn.put_range(self._table.name, self.table_id, partition, bucket, header,
                                    rows)

    def _undo(self, key: tuple[str | None, int], ranges: list[tuple[int, int]]) -> int:
        """Take back this writer's records at `ranges` of one bucket (its server refuses if
        another writer changed their keys since); the bucket's end offset after."""
        partition, bucket = key
        with self._cond:
            self._sequence += 1
            sequence = self._sequence
        header = write_header(self._table.name, "undo", self.mode, self.target_columns,
                              (self.writer_id, sequence), self.lease, self.attempt)
        header["ranges"] = [list(r) for r in ranges]
        keys = self._table.meta.routing.arrow_schema.empty_table().select(
            list(self._table.meta.routing.primary_key))
        return self._conn.put(self._table.name, self.table_id, partition, bucket, header, keys)

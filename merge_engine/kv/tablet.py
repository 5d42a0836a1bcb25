"""KvTablet: one bucket of a primary-key table, rows in RocksDB plus an Arrow changelog.

Reads, the changelog's reading and truncation, the row TTL's sweep and replication (a follower's
copy of the leader's changelog, leader epochs, cutting the log's tail, checkpoints) are parts of
the class kept in modules of their own (tablet_reads, tablet_log, tablet_expiry,
tablet_replica, tablet_epochs).

A write runs in four steps: validate the input and group its rows by key; then, a slice of
keys at a time (merge_engine.write.slices), take those keys' current rows (BucketRows: the
in-memory row buffer, then RocksDB) and merge them with the RowMerger of the mode; then commit
the changelog records, the new offsets and the writer's sequence in one atomic RocksDB write
batch (merge_engine.kv.pending_write), after which the changed rows join the row buffer, which is
flushed to RocksDB in batches of its own when full. The changelog is the write-ahead log: a
reopened bucket replays it past the last flush of the row buffer (BucketRows, RowBuffer).
"""

from __future__ import annotations

import contextlib
import functools
import threading
import time
import weakref

import numpy as np
import pyarrow as pa

from merge_engine.format.visible_row import VisibleRows, flat
from merge_engine.kv import changelog as log
from merge_engine.kv.allocator import use_bucket_allocator
from merge_engine.kv.budget import MemoryBudget
from merge_engine.kv.pending_write import PendingWrite
from merge_engine.kv.row_layouts import RowLayouts, add_columns
from merge_engine.kv.row_ttl import Clock, RowTtl
from merge_engine.kv.rows import BucketRows
from merge_engine.kv.storage import BASE_WIDTH, DESCRIPTOR, END_OFFSET, START_OFFSET, TabletStore
from merge_engine.kv.tablet_epochs import TabletEpochs
from merge_engine.kv.tablet_expiry import TabletExpiry
from merge_engine.kv.tablet_log import TabletLog
from merge_engine.kv.tablet_reads import TabletReads
from merge_engine.kv.tablet_replica import TabletReplica
from merge_engine.kv.write_undo import WriteUndo, plan_write_undo
from merge_engine.mergers import AggregateRowMerger, DeleteMerger, OverwriteRowMerger
from merge_engine.table.descriptor import KV_SYNC, TableDescriptor
from merge_engine.table.modes import DeleteBehavior, MergeMode
from merge_engine.table.schema import Schema
from merge_engine.write.input import WriteInput, prepare_write
from merge_engine.write.keys import KeyArray, group_keys
from merge_engine.write.slices import SLICE_ROWS, key_slices
from merge_engine.write.state import StateBatch
from tally.errors import (DeleteDisabledError, InvalidInputError, OffsetOutOfRangeError,
                          StorageError, StorageWriteError)


class KvTablet(TabletReads, TabletLog, TabletExpiry, TabletReplica, TabletEpochs):
    """One bucket. Thread-safe: writes are serialised, reads run alongside them."""

    slice_rows = SLICE_ROWS  # rows merged at a time in a large write (whole keys)

    def __init__(self, path: str, descriptor: TableDescriptor, store: TabletStore,
                 budget: MemoryBudget | None = None, clock: Clock | None = None):
        self.path = path
        self.name = store.name  # what errors call the bucket (its path unless named)
        self.descriptor = descriptor
        self.schema = descriptor.schema
        self.arrow_schema = self.schema.to_arrow()
        self.aggregators = descriptor.aggregators()
        names = self.schema.names
        self.key_positions = {names.index(k) for k in self.schema.primary_key}
        self.value_positions = [i for i in range(len(names)) if i not in self.key_positions]
        # Sum and product cells also store how many contributions they hold (retraction).
        self.counted = [i for i in self.value_positions
                        if descriptor.is_aggregation and self.aggregators[i].counts_contributions]
        ttl = descriptor.row_ttl_ms
        self._clock = clock or time.time  # judges row expiry and stamps changelog entries
        self._ttl = None if ttl is None else RowTtl(ttl, self._clock)
        timed = self._ttl is not None
        self._images = log.Images(self.arrow_schema, self.aggregators, self.value_positions,
                                  self.counted, timed)
        base_width = store.get_int(BASE_WIDTH, len(self.schema.columns))
        self.codec = RowLayouts(self._images.state_schema(), self.counted, timed,
                                self.aggregators, base_width)
        # A point lookup's answer (None: a nested column, answered as Arrow). Only sequenced
        # and token-keeping aggregators show values other than their states, and both keep
        # states of another type than the column's.
        states_are_values = all(a.state_type == f.type
                                for a, f in zip(self.aggregators, self.arrow_schema))
        self.visible_rows = VisibleRows(self.arrow_schema, self.codec.current,
                                        states_are_values) if flat(self.arrow_schema) else None
        self._time_at = self.codec.current.time_offset  # a stored row's last-write time
        self.remove_on_empty = descriptor.bool_option("table.agg.remove-record-on-empty")
        merger_args = (self.aggregators, self.key_positions, self.counted)
        self._overwrite = OverwriteRowMerger(*merger_args)
        self._engine = AggregateRowMerger(*merger_args) if descriptor.is_aggregation \
            else self._overwrite
        self._deletes = DeleteMerger(self.aggregators, self.key_positions)
        self._store = store
        self._lock = threading.RLock()
        self._end = store.get_int(END_OFFSET)
        self._start = store.get_int(START_OFFSET)
        self._rows = BucketRows(store, self.codec, descriptor.kv_buffer_size)
        self._closed = False
        self._snapshots: weakref.WeakSet = weakref.WeakSet()  # released at close
        self._replay_unflushed()
        self._budget = budget
        if budget is not None:
            budget.join(self)

    @classmethod
    def open(cls, path: str, descriptor: TableDescriptor, budget: MemoryBudget | None = None,
             name: str | None = None, clock: Clock | None = None) -> "KvTablet":
        """Open (or create) the bucket at `path`; its schema must match the one it was made with.
        Buckets opened with one `budget` share its memory cap (MemoryBudget). `name` is what
        errors call the bucket (default: its path), e.g. "bucket 3 of db.t" on a server.
        `clock` (seconds, like time.time) times writes and judges the row TTL; tests move it."""
        if not descriptor.schema.primary_key:
            raise StorageError("A KvTablet needs a primary-key table")
        use_bucket_allocator()
        store = TabletStore(str(path), sync=descriptor.bool_option(KV_SYNC),
                            memtables=budget.memtables if budget is not None else None,
                            name=name)
        try:
            saved = store.get_bytes(DESCRIPTOR)
            if saved is None:
                batch = store.new_batch()
                batch.put(DESCRIPTOR, descriptor.schema.to_json().encode())
                BucketRows.initialise(batch)
                store.commit(batch)
            elif saved.decode() != descriptor.schema.to_json():
                add_columns(store, Schema.from_json(saved.decode()), descriptor.schema)
            return cls(str(path), descriptor, store, budget, clock)
        except BaseException:  # the replay may fail too (a full disk): let go of RocksDB
            store.close()
            raise

    # --- offsets ----------------------------------------------------------------------------

    @property
    def log_end_offset(self) -> int:
        """The offset the next changelog record will get (exclusive end of the log)."""
        return self._end

    @property
    def log_start_offset(self) -> int:
        return self._start

    # --- writes -----------------------------------------------------------------------------

    def put(self, rows, mode: MergeMode = MergeMode.AGGREGATE, target_columns=None,
            writer: tuple[str, int] | None = None) -> int:
        """Merge `rows` into the bucket; returns the log end offset after the write."""
        return self._write(self._put, rows, mode, target_columns, writer)

    def delete(self, keys, mode: MergeMode = MergeMode.AGGREGATE, target_columns=None,
               writer: tuple[str, int] | None = None) -> int:
        """Delete keys (or, with target_columns, reset those columns); returns the end offset."""
        return self._write(self._delete, keys, mode, target_columns, writer)

    def _write(self, apply, data, mode, target_columns, writer) -> int:
        """Run `apply` (_put or _delete) under the bucket's lock unless `writer` already applied
        this write (then its recorded end offset); afterwards, outside the lock, let a shared
        memory budget flush buffers."""
        mode = MergeMode.parse(mode)
        with self._lock:
            self._check_open()
            end = self._replayed(writer)
            if end is None:
                end = apply(data, mode, target_columns, writer)
        if self._budget is not None:
            self._budget.after_write()
        return end

    def _put(self, rows, mode, target_columns, writer) -> int:
        """Under the lock, not a replay: merge the rows and commit them all at once."""
        pending = self._pending()
        self._merge_into(pending, rows, mode, target_columns)
        return self._commit(pending, writer)

    def _merge_into(self, pending: PendingWrite, rows, mode, target_columns) -> None:
        """Merge the rows into `pending` (a slice of keys at a time, see
        merge_engine.write.slices)."""
        write = prepare_write(rows, self.schema, self.aggregators, target_columns,
                              allow_unwritten=mode is MergeMode.OVERWRITE,
                              allow_retractions=mode is not MergeMode.OVERWRITE)
        if write.rows == 0:
            return
        merger = self._overwrite if mode is MergeMode.OVERWRITE else self._engine
        slices = key_slices(write, *self._group(write), size=self.slice_rows)
        for keys, part, group_ids, firsts in slices:
            before, present = self._load(keys, part, firsts)
            if self._ttl is not None:
                before, present = self._ttl.expire_loaded(
                    pending, keys, before, present,
                    lambda rows, part=part, firsts=firsts: self._empty_rows(part, firsts[rows]))
            after = merger.merge(before, part, group_ids, mode)
            if self._ttl is not None:
                RowTtl.stamp(after, before, part, group_ids, pending.now_ms)
            outcome = np.where(present, np.where(self.codec.differs(before, after),
                                                 log.UPDATED, log.UNCHANGED),
                               log.INSERTED).astype(np.int8)
            if self.remove_on_empty and mode is not MergeMode.OVERWRITE:
                outcome = self._remove_empty(after, outcome, present)
            expired = None
            if self._ttl is not None:
                outcome, expired = self._ttl.expire_merged(after, outcome, present,
                                                           pending.now_ms)
            pending.add(keys, before, after, outcome, expired)

    def _delete(self, keys, mode, target_columns, writer) -> int:
        """Under the lock, not a replay: apply the table's delete behavior, then commit."""
        pending = self._pending()
        self._delete_into(pending, keys, mode, target_columns)
        return self._commit(pending, writer)

    def _delete_into(self, pending: PendingWrite, keys, mode, target_columns) -> None:
        behavior = DeleteBehavior.ALLOW if mode is MergeMode.OVERWRITE \
            else self.descriptor.delete_behavior
        if behavior is DeleteBehavior.DISABLE:
            raise DeleteDisabledError(
                "Delete operations are disabled for this table: 'table.delete.behavior' "
                "is 'disable'. Nothing was applied."
            )
        write = prepare_write(keys, self.schema, self.aggregators, target_columns,
                              keys_only=True)
        if behavior is DeleteBehavior.IGNORE or write.rows == 0:
            return
        unique, _, firsts = self._group(write)
        before, present = self._load(unique, write, firsts)
        if self._ttl is not None:
            before, present = self._ttl.expire_loaded(
                pending, unique, before, present,
                lambda rows: self._empty_rows(write, firsts[rows]))
        after, removed = self._deletes.delete(before, write.target)
        if self._ttl is not None:  # resetting columns is a write: it refreshes the key
            after.touched = np.full(len(after), pending.now_ms, dtype=np.int64)
        changed = self.codec.differs(before, after)
        outcome = np.select([present & removed, present & changed], [log.REMOVED, log.UPDATED],
                            log.UNCHANGED).astype(np.int8)
        pending.add(unique, before, after, outcome)

    def undo_writes(self, ranges: list[tuple[int, int]], target_columns=None,
                    writer: tuple[str, int] | None = None) -> tuple[int, WriteUndo]:
        """Take back the writes applied at offsets in `ranges` (one writer's, see
        merge_engine.kv.write_undo) in one commit; or, if another writer changed one of their keys
        since, nothing. The end offset after it, and what was planned (its conflicts)."""
        with self._lock:
            self._check_open()
            end = self._replayed(writer)
            if end is not None:  # a retried undo that was applied
                return end, WriteUndo()
            low = min(start for start, _ in ranges)
            if not (self._start <= low and all(s <= e <= self._end for s, e in ranges)):
                raise OffsetOutOfRangeError(
                    f"cannot undo writes at {ranges}: the log of {self.name} holds "
                    f"[{self._start}, {self._end}). Nothing was changed.")
            undo = plan_write_undo(self.changelog(low, self._end), ranges, self.schema,
                                   target_columns)
            if undo.conflicts:
                return self._end, undo
            pending = self._pending()
            if undo.restore is not None:
                self._merge_into(pending, undo.restore, MergeMode.OVERWRITE, target_columns)
            if undo.delete is not None:
                self._delete_into(pending, undo.delete, MergeMode.OVERWRITE, target_columns)
            return self._commit(pending, writer), undo

    def applied_end(self, writer: tuple[str, int] | None) -> int | None:
        """The end offset recorded for this (writer id, sequence) if it was applied already:
        a retry, which must not be applied again."""
        with self._lock:
            return self._replayed(writer)

    def _remove_empty(self, after: StateBatch, outcome: np.ndarray, present: np.ndarray) -> np.ndarray:
        """`table.agg.remove-record-on-empty`: a row whose every aggregate is back to its empty
        state is removed (-D), and a new key that would be empty is never stored."""
        empty = np.ones(len(after), dtype=bool)
        for i in self.value_positions:
            empty &= self.aggregators[i].holds_nothing(after.columns[i], after.written[:, i])
        outcome = outcome.copy()
        outcome[empty & present] = log.REMOVED
        outcome[empty & ~present] = log.UNCHANGED
        return outcome

    def _replayed(self, writer) -> int | None:
        """The recorded end offset if this (writer id, sequence) was already applied."""
        if writer is None:
            return None
        if not (isinstance(writer, tuple) and len(writer) == 2 and isinstance(writer[0], str)
                and isinstance(writer[1], int)):
            raise InvalidInputError(f"writer must be a (writer_id: str, sequence: int) pair, got {writer!r}")
        state = self._store.writer_state(writer[0])
        if state is not None and writer[1] <= state[0]:
            return state[1]
        return None

    def _group(self, write: WriteInput):
        """The write's distinct encoded keys in key order, each row's group id (its key's
        position), and each group's first row. Key order makes RocksDB's multi-get and
        memtable inserts sequential, which is several times faster than random order."""
        return group_keys(write.key_columns(self.schema))

    def _load(self, keys: KeyArray, write: WriteInput, firsts: np.ndarray):
        """The current state of each key (an empty row for new keys), and whether it exists."""
        return self._rows.current(keys, lambda new: self._empty_rows(write, firsts[new]))

    def _empty_rows(self, write: WriteInput, rows: np.ndarray) -> StateBatch:
        index = pa.array(rows, type=pa.int64())
        columns = []
        for i, agg in enumerate(self.aggregators):
            if i in self.key_positions:
                columns.append(write.columns[agg.column].take(index))
            else:
                columns.append(agg.empty(len(rows)))
        written = np.zeros((len(rows), len(columns)), dtype=bool)
        written[:, sorted(self.key_positions)] = True
        return StateBatch(columns, written, np.zeros(written.shape, dtype=np.int64))

    def _pending(self) -> PendingWrite:
        return PendingWrite(self._store, self._images, self._end, self.descriptor.kv_buffer_size,
                            int(self._clock() * 1000))

    def _commit(self, pending: PendingWrite, writer) -> int:
        """The write's one atomic RocksDB write batch: its changelog, offsets and writer
        sequence; then its changed rows join the buffer, which may flush. The end offset
        after it."""
        staged = pending.seal(self._rows, writer)
        return self._commit_batch(pending.batch, staged, pending.end)

    def _commit_batch(self, batch, staged, end: int) -> int:
        """Commit `batch` (changelog entries up to `end`, END_OFFSET), then hand the rows
        `staged` for it (if any) to the row buffer. The new log end offset."""
        start = self._end
        if not batch.is_empty():
            self._store.commit(batch)
        self._end = end
        if staged is not None:
            # The write is committed even if the disk refuses the flush: the buffer keeps its
            # rows, and the store refuses the next write (a reopen replays the changelog).
            with contextlib.suppress(StorageWriteError):
                self._rows.committed(staged, start, self._end,
                                     functools.partial(self._row_changes, start, self._end))
        return self._end

    def flush(self) -> None:
        """Write the buffered rows to RocksDB now (close and log truncation do this too)."""
        with self._lock:
            self._check_open()
            self._rows.flush(self._end)

    def flush_if_open(self) -> None:
        """flush(), or nothing once closed (a memory budget may ask while another thread closes)
        or once the disk refused a write (storage_failure, which a refused flush sets)."""
        with self._lock, contextlib.suppress(StorageWriteError):
            if not self._closed and self._store.failure is None:
                self._rows.flush(self._end)

    @property
    def buffered_bytes(self) -> int:
        """Memory held by rows merged since the last flush (an estimate, see RowBuffer)."""
        return self._rows.buffered_bytes

    @property
    def memtable_bytes(self) -> int:
        """What the bucket's RocksDB memtables hold now; 0 once closed."""
        with self._lock:
            return 0 if self._closed else self._store.memtable_bytes

    def _replay_unflushed(self) -> None:
        """After a crash: rebuild the row buffer from the changelog past the last flush."""
        applied = self._rows.applied_offset()
        self.replayed_records = self._end - applied  # what opening it cost (server metrics)
        if applied == self._end:
            return
        if not self._start <= applied < self._end:
            raise StorageError(
                f"The rows of {self.name} are applied up to offset {applied}, outside its log "
                f"[{self._start}, {self._end}): the tablet is corrupt")
        self._rows.replay(self._row_changes(applied, self._end), self._end)

    def _row_changes(self, start: int, end: int):
        """What the changelog records of [start, end) do to the rows, a stored entry at a time."""
        return (self._images.row_changes(records, self.schema.primary_key)
                for records in self.iter_changelog(start, end))

    # --- lifecycle --------------------------------------------------------------------------

    @property
    def storage_failure(self) -> StorageWriteError | None:
        """The write the disk refused: writes fail until the bucket is reopened (storage.py)."""
        return self._store.failure

    def _check_open(self) -> None:
        if self._closed:
            raise StorageError(f"{self.name} is closed")

    def close(self) -> None:
        """Flush the row buffer and close; a disk that refuses the flush loses nothing (the
        next open replays the changelog), so the bucket closes all the same."""
        with self._lock:
            if not self._closed:
                for snapshot in list(self._snapshots):
                    snapshot.release()  # an open iterator would keep RocksDB open
                with contextlib.suppress(StorageWriteError):
                    self._rows.flush(self._end)
                self._closed = True
                self._store.close()
        if self._budget is not None:
            self._budget.leave(self)

    def __enter__(self) -> "KvTablet":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"KvTablet({self.path!r}, offsets [{self._start}, {self._end}))"

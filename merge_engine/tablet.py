"""KvTablet: one bucket of a primary-key table, rows in RocksDB plus an Arrow changelog.

A write runs in four steps: validate the input and group its rows by key; then, a slice of
keys at a time (merge_engine.write_slices), take those keys' current rows (BucketRows: the
in-memory row buffer, then RocksDB) and merge them with the RowMerger of the mode; then commit
the changelog records, the new offsets and the writer's sequence in one atomic RocksDB write
batch (merge_engine.pending_write), after which the changed rows join the row buffer, which is
flushed to RocksDB in batches of its own when full. The changelog is the write-ahead log: a
reopened bucket replays it past the last flush of the row buffer (BucketRows, RowBuffer).
"""

from __future__ import annotations

import contextlib
import functools
import threading
import weakref
from typing import Iterator

import numpy as np
import pyarrow as pa

from merge_engine import changelog as log
from merge_engine.allocator import use_bucket_allocator
from merge_engine.budget import MemoryBudget
from merge_engine.descriptor import KV_SYNC, TableDescriptor
from merge_engine.hidden_columns import UNWRITTEN
from merge_engine.input import WriteInput, prepare_write
from merge_engine.keys import KeyArray, group_keys, key_array
from merge_engine.mergers import AggregateRowMerger, DeleteMerger, OverwriteRowMerger
from merge_engine.modes import DeleteBehavior, MergeMode
from merge_engine.rowcodec import RowCodec
from merge_engine.row_snapshot import RowSnapshot
from merge_engine.rows import BucketRows
from merge_engine.pending_write import PendingWrite
from merge_engine.state import StateBatch
from merge_engine.storage import DESCRIPTOR, END_OFFSET, START_OFFSET, TabletStore
from merge_engine.write_slices import SLICE_ROWS, key_slices
from tally.errors import (DeleteDisabledError, InvalidInputError, OffsetOutOfRangeError,
                          StorageError, StorageWriteError)


class KvTablet:
    """One bucket. Thread-safe: writes are serialised, reads run alongside them."""

    slice_rows = SLICE_ROWS  # rows merged at a time in a large write (whole keys)

    def __init__(self, path: str, descriptor: TableDescriptor, store: TabletStore,
                 budget: MemoryBudget | None = None):
        self.path = path
        self.name = store.name  # what errors call the bucket (its path unless named)
        self.descriptor = descriptor
        self.schema = descriptor.schema
        self.arrow_schema = self.schema.to_arrow()
        self.aggregators = self.schema.aggregators(descriptor.is_aggregation)
        names = self.schema.names
        self.key_positions = {names.index(k) for k in self.schema.primary_key}
        self.value_positions = [i for i in range(len(names)) if i not in self.key_positions]
        # Sum and product cells also store how many contributions they hold (retraction).
        self.counted = [i for i in self.value_positions
                        if descriptor.is_aggregation and self.aggregators[i].counts_contributions]
        self._images = log.Images(self.arrow_schema, self.aggregators, self.value_positions,
                                  self.counted)
        self.codec = RowCodec(self._images.state_schema(), self.counted)
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
             name: str | None = None) -> "KvTablet":
        """Open (or create) the bucket at `path`; its schema must match the one it was made with.
        Buckets opened with one `budget` share its memory cap (MemoryBudget). `name` is what
        errors call the bucket (default: its path), e.g. "bucket 3 of db.t" on a server."""
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
                raise StorageError(f"{store.name} was created with another schema; refusing "
                                   f"to open it with {descriptor.schema!r}")
            return cls(str(path), descriptor, store, budget)
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
        """Under the lock, not a replay: merge the rows (a slice of keys at a time, see
        merge_engine.write_slices) and commit them all at once."""
        write = prepare_write(rows, self.schema, self.aggregators, target_columns,
                              allow_unwritten=mode is MergeMode.OVERWRITE,
                              allow_retractions=mode is not MergeMode.OVERWRITE)
        pending = self._pending()
        if write.rows == 0:
            return self._commit(pending, writer)
        merger = self._overwrite if mode is MergeMode.OVERWRITE else self._engine
        slices = key_slices(write, *self._group(write), size=self.slice_rows)
        for keys, part, group_ids, firsts in slices:
            before, present = self._load(keys, part, firsts)
            after = merger.merge(before, part, group_ids, mode)
            outcome = np.where(present, np.where(self.codec.differs(before, after),
                                                 log.UPDATED, log.UNCHANGED),
                               log.INSERTED).astype(np.int8)
            if self.remove_on_empty and mode is not MergeMode.OVERWRITE:
                outcome = self._remove_empty(after, outcome, present)
            pending.add(keys, before, after, outcome)
        return self._commit(pending, writer)

    def _delete(self, keys, mode, target_columns, writer) -> int:
        """Under the lock, not a replay: apply the table's delete behavior, then commit."""
        behavior = DeleteBehavior.ALLOW if mode is MergeMode.OVERWRITE \
            else self.descriptor.delete_behavior
        if behavior is DeleteBehavior.DISABLE:
            raise DeleteDisabledError(
                "Delete operations are disabled for this table: 'table.delete.behavior' "
                "is 'disable'. Nothing was applied."
            )
        write = prepare_write(keys, self.schema, self.aggregators, target_columns,
                              keys_only=True)
        pending = self._pending()
        if behavior is DeleteBehavior.IGNORE or write.rows == 0:
            return self._commit(pending, writer)
        unique, _, firsts = self._group(write)
        before, present = self._load(unique, write, firsts)
        after, removed = self._deletes.delete(before, write.target)
        changed = self.codec.differs(before, after)
        outcome = np.select([present & removed, present & changed], [log.REMOVED, log.UPDATED],
                            log.UNCHANGED).astype(np.int8)
        pending.add(unique, before, after, outcome)
        return self._commit(pending, writer)

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
        return PendingWrite(self._store, self._images, self._end, self.descriptor.kv_buffer_size)

    def _commit(self, pending: PendingWrite, writer) -> int:
        """The write's one atomic RocksDB write batch: its changelog, offsets and writer
        sequence; then its changed rows join the buffer, which may flush. The end offset
        after it."""
        start = self._end
        staged = pending.seal(self._rows, writer)
        if not pending.batch.is_empty():
            self._store.commit(pending.batch)
        self._end = pending.end
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

    def _replay_unflushed(self) -> None:
        """After a crash: rebuild the row buffer from the changelog past the last flush."""
        applied = self._rows.applied_offset()
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

    # --- reads ------------------------------------------------------------------------------

    def lookup(self, key: dict) -> dict | None:
        """The row of `key` (a dict of the primary-key columns), or None."""
        self._check_open()
        if not isinstance(key, dict):
            raise InvalidInputError(f"lookup takes a dict of the primary key columns, got {key!r}")
        write = prepare_write([key], self.schema, self.aggregators, keys_only=True)
        state = self._rows.lookup(key_array(write.key_columns(self.schema)))
        return None if state is None else self._images.visible(state).to_pylist()[0]

    def lookup_many(self, keys, unwritten: bool = False) -> tuple[pa.Table, np.ndarray]:
        """The rows of many keys (a table or list of dicts of the primary-key columns), one row
        per key in input order, and whether each key has a row (where not, its row is
        meaningless). Duplicate keys are fine. `unwritten` adds the hidden `_unwritten`
        column."""
        with self._lock:  # one offset for every key, and no close underneath
            self._check_open()
            write = prepare_write(keys, self.schema, self.aggregators, keys_only=True)
            if write.rows == 0:
                return self.arrow_schema.empty_table(), np.zeros(0, dtype=bool)
            encoded = key_array(write.key_columns(self.schema))
            states, present = self._rows.current(
                encoded, lambda new: self._empty_rows(write, new))
        rows = self._images.visible(states).cast(self.arrow_schema)
        if unwritten:
            lists = log.unwritten_lists(states.written, self.value_positions,
                                        self.arrow_schema.names)
            rows = rows.append_column(pa.field(UNWRITTEN, pa.list_(pa.string())), lists)
        return rows, present

    def snapshot(self) -> RowSnapshot:
        """The rows as of the log end offset now, to read without holding the tablet's lock
        (merge_engine.row_snapshot). The tablet's close releases it."""
        with self._lock:
            self._check_open()
            snapshot = RowSnapshot(self._end, self._rows.buffer_copy(),
                                   self._store.row_iterator(), self.codec, self.aggregators,
                                   self.arrow_schema, self.value_positions, self.name)
            self._snapshots.add(snapshot)
        return snapshot

    def to_arrow(self) -> pa.Table:
        """Every row, ordered by primary key (buffered rows are flushed first)."""
        self.flush()
        tables = [self._images.visible(self.codec.decode(chunk))
                  for chunk in self._store.scan_rows()]
        if not tables:
            return self.arrow_schema.empty_table()
        return pa.concat_tables(tables).cast(self.arrow_schema)

    def changelog(self, start: int | None = None, end: int | None = None) -> pa.Table:
        """Changelog records with offsets in [start, end); start defaults to the log start
        offset (0 until the log is truncated), end to the log end."""
        schema = self._images.reader_schema()
        tables = list(self.iter_changelog(start, end))
        return pa.concat_tables(tables) if tables else schema.empty_table()

    def iter_changelog(self, start: int | None = None, end: int | None = None) -> Iterator[pa.Table]:
        """The records of [start, end) one stored batch at a time: bounded memory for undo."""
        self._check_open()
        start = self._start if start is None else start
        end = self._end if end is None else end
        if not (self._start <= start <= end <= self._end):
            raise OffsetOutOfRangeError(
                f"Changelog range [{start}, {end}) is outside the bucket's log "
                f"[{self._start}, {self._end}) of {self.name}"
            )
        for first, data in self._store.log_entries(start):
            if first >= end:
                break
            records = log.deserialize(data, first)
            low, high = max(start - first, 0), min(end - first, records.num_rows)
            if high > low:
                yield records.slice(low, high - low)

    def records_to_state(self, records: pa.Table) -> StateBatch:
        """Row states of changelog records, written bits included (for replay and undo)."""
        return self._images.to_state(records)

    # --- log truncation (its policy: merge_engine/log_retention.py) -------------------------

    def log_entry_spans(self) -> list[tuple[int, int, int]]:
        """(first offset, end offset, written-at ms) of every stored changelog batch, oldest
        first. The first may start below the log start offset (truncate_log keeps a batch that
        straddles it)."""
        with self._lock:
            self._check_open()
            entries = list(self._store.log_entry_times())
            ends = [first for first, _ in entries[1:]] + [self._end]
            return [(first, end, written) for (first, written), end in zip(entries, ends)]

    def truncate_log(self, before: int) -> int:
        """Drop changelog records below offset `before`; returns the new log start offset.

        Whole stored batches below `before` are deleted; a batch straddling it is kept but
        its records below `before` are no longer served.
        """
        with self._lock:
            self._check_open()
            if not isinstance(before, int) or not 0 <= before <= self._end:
                raise OffsetOutOfRangeError(
                    f"Cannot truncate {self.name} before offset {before!r}: the log ends at "
                    f"{self._end}")
            if before <= self._start:
                return self._start
            self._rows.flush(self._end)  # the records to go may be the only copy of buffered rows
            batch = self._store.new_batch()
            for first, following, _ in self.log_entry_spans():
                if following <= before:
                    TabletStore.delete_log_entry(batch, first)
            TabletStore.put_int(batch, START_OFFSET, before)
            self._store.commit(batch)
            self._start = before
            return before

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

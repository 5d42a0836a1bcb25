"""A bucket's write path: puts, deletes and the undo of a writer's writes.

A write runs in four steps: validate the input and group its rows by key; then, a slice of
keys at a time (merge_engine.write.slices), take those keys' current rows (BucketRows: the
in-memory row buffer, then RocksDB) and merge them with the RowMerger of the mode; then commit
the changelog records, the new offsets and the writer's sequence in one atomic RocksDB write
batch (the Committer), after which the changed rows join the row buffer.
"""

from __future__ import annotations

from typing import Callable

import numpy as np
import pyarrow as pa

from merge_engine.kv import changelog as log
from merge_engine.kv.budget import MemoryBudget
from merge_engine.kv.committer import Committer
from merge_engine.kv.guard import BucketGuard, LogOffsets
from merge_engine.kv.pending_write import PendingWrite
from merge_engine.kv.row_layouts import RowLayouts
from merge_engine.kv.row_ttl import RowTtl
from merge_engine.kv.rows import BucketRows
from merge_engine.kv.write_undo import WriteUndo, plan_write_undo
from merge_engine.mergers import AggregateRowMerger, DeleteMerger, OverwriteRowMerger
from merge_engine.table.descriptor import TableDescriptor
from merge_engine.table.modes import DeleteBehavior, MergeMode
from merge_engine.write.input import WriteInput, prepare_write
from merge_engine.write.keys import KeyArray, group_keys
from merge_engine.write.slices import SLICE_ROWS, key_slices
from merge_engine.write.state import StateBatch
from tally.errors import DeleteDisabledError, OffsetOutOfRangeError


class TabletWrites:
    """Merges puts, deletes and undos into a bucket's rows and commits them."""

    def __init__(self, guard: BucketGuard, offsets: LogOffsets, committer: Committer,
                 rows: BucketRows, codec: RowLayouts, descriptor: TableDescriptor,
                 aggregators: list, key_positions: set[int], value_positions: list[int],
                 counted: list[int], ttl: RowTtl | None, budget: MemoryBudget | None,
                 changelog: Callable):
        self.slice_rows = SLICE_ROWS  # rows merged at a time in a large write (whole keys)
        self._guard = guard
        self._offsets = offsets
        self._committer = committer
        self._rows = rows
        self._codec = codec
        self._descriptor = descriptor
        self._schema = descriptor.schema
        self._aggregators = aggregators
        self._key_positions = key_positions
        self._value_positions = value_positions
        self._ttl = ttl
        self._budget = budget
        self._changelog = changelog  # (start, end) -> the records, for an undo's plan
        self._remove_on_empty = descriptor.bool_option("table.agg.remove-record-on-empty")
        merger_args = (aggregators, key_positions, counted)
        self._overwrite = OverwriteRowMerger(*merger_args)
        self._engine = AggregateRowMerger(*merger_args) if descriptor.is_aggregation \
            else self._overwrite
        self._deletes = DeleteMerger(aggregators, key_positions)

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
        with self._guard.lock:
            self._guard.check_open()
            end = self._committer.replayed(writer)
            if end is None:
                end = apply(data, mode, target_columns, writer)
        if self._budget is not None:
            self._budget.after_write()
        return end

    def _put(self, rows, mode, target_columns, writer) -> int:
        """Under the lock, not a replay: merge the rows and commit them all at once."""
        pending = self._committer.pending()
        self._merge_into(pending, rows, mode, target_columns)
        return self._committer.commit(pending, writer)

    def _merge_into(self, pending: PendingWrite, rows, mode, target_columns) -> None:
        """Merge the rows into `pending` (a slice of keys at a time, see
        merge_engine.write.slices)."""
        write = prepare_write(rows, self._schema, self._aggregators, target_columns,
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
                    lambda rows, part=part, firsts=firsts: self.empty_rows(part, firsts[rows]))
            after = merger.merge(before, part, group_ids, mode)
            if self._ttl is not None:
                RowTtl.stamp(after, before, part, group_ids, pending.now_ms)
            outcome = np.where(present, np.where(self._codec.differs(before, after),
                                                 log.UPDATED, log.UNCHANGED),
                               log.INSERTED).astype(np.int8)
            if self._remove_on_empty and mode is not MergeMode.OVERWRITE:
                outcome = self._remove_empty(after, outcome, present)
            expired = None
            if self._ttl is not None:
                outcome, expired = self._ttl.expire_merged(after, outcome, present,
                                                           pending.now_ms)
            pending.add(keys, before, after, outcome, expired)

    def _delete(self, keys, mode, target_columns, writer) -> int:
        """Under the lock, not a replay: apply the table's delete behavior, then commit."""
        pending = self._committer.pending()
        self._delete_into(pending, keys, mode, target_columns)
        return self._committer.commit(pending, writer)

    def _delete_into(self, pending: PendingWrite, keys, mode, target_columns) -> None:
        behavior = DeleteBehavior.ALLOW if mode is MergeMode.OVERWRITE \
            else self._descriptor.delete_behavior
        if behavior is DeleteBehavior.DISABLE:
            raise DeleteDisabledError(
                "Delete operations are disabled for this table: 'table.delete.behavior' "
                "is 'disable'. Nothing was applied."
            )
        write = prepare_write(keys, self._schema, self._aggregators, target_columns,
                              keys_only=True)
        if behavior is DeleteBehavior.IGNORE or write.rows == 0:
            return
        unique, _, firsts = self._group(write)
        before, present = self._load(unique, write, firsts)
        if self._ttl is not None:
            before, present = self._ttl.expire_loaded(
                pending, unique, before, present,
                lambda rows: self.empty_rows(write, firsts[rows]))
        after, removed = self._deletes.delete(before, write.target)
        if self._ttl is not None:  # resetting columns is a write: it refreshes the key
            after.touched = np.full(len(after), pending.now_ms, dtype=np.int64)
        changed = self._codec.differs(before, after)
        outcome = np.select([present & removed, present & changed], [log.REMOVED, log.UPDATED],
                            log.UNCHANGED).astype(np.int8)
        pending.add(unique, before, after, outcome)

    def undo_writes(self, ranges: list[tuple[int, int]], target_columns=None,
                    writer: tuple[str, int] | None = None) -> tuple[int, WriteUndo]:
        """Take back the writes applied at offsets in `ranges` (one writer's, see
        merge_engine.kv.write_undo) in one commit; or, if another writer changed one of their keys
        since, nothing. The end offset after it, and what was planned (its conflicts)."""
        with self._guard.lock:
            self._guard.check_open()
            end = self._committer.replayed(writer)
            if end is not None:  # a retried undo that was applied
                return end, WriteUndo()
            offsets = self._offsets
            low = min(start for start, _ in ranges)
            if not (offsets.start <= low and all(s <= e <= offsets.end for s, e in ranges)):
                raise OffsetOutOfRangeError(
                    f"cannot undo writes at {ranges}: the log of {self._guard.name} holds "
                    f"[{offsets.start}, {offsets.end}). Nothing was changed.")
            undo = plan_write_undo(self._changelog(low, offsets.end), ranges, self._schema,
                                   target_columns)
            if undo.conflicts:
                return offsets.end, undo
            pending = self._committer.pending()
            if undo.restore is not None:
                self._merge_into(pending, undo.restore, MergeMode.OVERWRITE, target_columns)
            if undo.delete is not None:
                self._delete_into(pending, undo.delete, MergeMode.OVERWRITE, target_columns)
            return self._committer.commit(pending, writer), undo

    def applied_end(self, writer: tuple[str, int] | None) -> int | None:
        """The end offset recorded for this (writer id, sequence) if it was applied already:
        a retry, which must not be applied again."""
        with self._guard.lock:
            return self._committer.replayed(writer)

    def _remove_empty(self, after: StateBatch, outcome: np.ndarray, present: np.ndarray) -> np.ndarray:
        """`table.agg.remove-record-on-empty`: a row whose every aggregate is back to its empty
        state is removed (-D), and a new key that would be empty is never stored."""
        empty = np.ones(len(after), dtype=bool)
        for i in self._value_positions:
            empty &= self._aggregators[i].holds_nothing(after.columns[i], after.written[:, i])
        outcome = outcome.copy()
        outcome[empty & present] = log.REMOVED
        outcome[empty & ~present] = log.UNCHANGED
        return outcome

    def _group(self, write: WriteInput):
        """The write's distinct encoded keys in key order, each row's group id (its key's
        position), and each group's first row. Key order makes RocksDB's multi-get and
        memtable inserts sequential, which is several times faster than random order."""
        return group_keys(write.key_columns(self._schema))

    def _load(self, keys: KeyArray, write: WriteInput, firsts: np.ndarray):
        """The current state of each key (an empty row for new keys), and whether it exists."""
        return self._rows.current(keys, lambda new: self.empty_rows(write, firsts[new]))

    def empty_rows(self, write: WriteInput, rows: np.ndarray) -> StateBatch:
        """Rows of the keys of `write`'s `rows` that hold nothing yet: what a new key merges
        into, and what a read shows for a key without a row."""
        index = pa.array(rows, type=pa.int64())
        columns = []
        for i, agg in enumerate(self._aggregators):
            if i in self._key_positions:
                columns.append(write.columns[agg.column].take(index))
            else:
                columns.append(agg.empty(len(rows)))
        written = np.zeros((len(rows), len(columns)), dtype=bool)
        written[:, sorted(self._key_positions)] = True
        return StateBatch(columns, written, np.zeros(written.shape, dtype=np.int64))

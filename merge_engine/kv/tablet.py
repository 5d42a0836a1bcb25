"""KvTablet: one bucket of a primary-key table, rows in RocksDB plus an Arrow changelog.

The bucket is the one face of parts it owns, each given just the state it works on: reads
(TabletReads), the write path (TabletWrites, which commits through the Committer), the stored
changelog (StoredLog: its reading, truncation and the replay at open), the row TTL's sweep
(TabletExpiry), replication (TabletReplica: a leader's entries out, a follower's copy in,
checkpoints) and leader epochs with the cut of a diverged tail (TabletEpochs). They share the
bucket's lock and open state (BucketGuard) and its log offsets (LogOffsets).

The changelog is the write-ahead log: a write's records, offsets and writer sequence commit in
one atomic RocksDB write batch before its rows join the in-memory row buffer, and a reopened
bucket replays the log past the last flush of that buffer (BucketRows, RowBuffer).
"""

from __future__ import annotations

import contextlib
import time
from typing import Iterator

import numpy as np
import pyarrow as pa

from merge_engine.format.visible_row import VisibleRows, flat
from merge_engine.kv.allocator import use_bucket_allocator
from merge_engine.kv.budget import MemoryBudget
from merge_engine.kv.changelog import Images
from merge_engine.kv.committer import Committer
from merge_engine.kv.epochs import TabletEpochs
from merge_engine.kv.expiry import TabletExpiry
from merge_engine.kv.guard import BucketGuard, LogOffsets
from merge_engine.kv.prefix_reads import PrefixRows
from merge_engine.kv.reads import TabletReads
from merge_engine.kv.replica import TabletReplica
from merge_engine.kv.replica_entries import ReplicatedEntry
from merge_engine.kv.row_layouts import RowLayouts, add_columns
from merge_engine.kv.row_snapshot import RowSnapshot
from merge_engine.kv.row_ttl import Clock, RowTtl
from merge_engine.kv.rows import BucketRows
from merge_engine.kv.storage import BASE_WIDTH, DESCRIPTOR, END_OFFSET, START_OFFSET, TabletStore
from merge_engine.kv.stored_log import StoredLog
from merge_engine.kv.write_undo import WriteUndo
from merge_engine.kv.writes import TabletWrites
from merge_engine.table.descriptor import KV_SYNC, TableDescriptor
from merge_engine.table.modes import MergeMode
from merge_engine.table.schema import Schema
from merge_engine.write.keys import KeyArray
from tally.errors import StorageError, StorageWriteError


class KvTablet:
    """One bucket. Thread-safe: writes are serialised, reads run alongside them."""

    def __init__(self, path: str, descriptor: TableDescriptor, store: TabletStore,
                 budget: MemoryBudget | None = None, clock: Clock | None = None):
        self.path = path
        self.name = store.name  # what errors call the bucket (its path unless named)
        self.descriptor = descriptor
        self.schema = schema = descriptor.schema
        self.arrow_schema = self.schema.to_arrow()
        self.aggregators = descriptor.aggregators()
        names = self.schema.names
        self.key_positions = {names.index(k) for k in self.schema.primary_key}
        self.value_positions = [i for i in range(len(names)) if i not in self.key_positions]
        # Sum and product cells also store how many contributions they hold (retraction).
        self.counted = [i for i in self.value_positions
                        if descriptor.is_aggregation and self.aggregators[i].counts_contributions]
        ttl = descriptor.row_ttl_ms
        clock = clock or time.time  # judges row expiry and stamps changelog entries
        row_ttl = None if ttl is None else RowTtl(ttl, clock)
        timed = row_ttl is not None
        images = Images(self.arrow_schema, self.aggregators, self.value_positions, self.counted,
                        timed)
        base_width = store.get_int(BASE_WIDTH, len(self.schema.columns))
        self.codec = RowLayouts(images.state_schema(), self.counted, timed,
                                self.aggregators, base_width)
        # A point lookup's answer (None: a nested column, answered as Arrow). Only sequenced
        # and token-keeping aggregators show values other than their states, and both keep
        # states of another type than the column's.
        states_are_values = all(a.state_type == f.type
                                for a, f in zip(self.aggregators, self.arrow_schema))
        self.visible_rows = VisibleRows(self.arrow_schema, self.codec.current,
                                        states_are_values) if flat(self.arrow_schema) else None
        self.remove_on_empty = descriptor.bool_option("table.agg.remove-record-on-empty")
        self._store = store
        self._guard = guard = BucketGuard(store.name)
        self._offsets = offsets = LogOffsets(store.get_int(START_OFFSET),
                                             store.get_int(END_OFFSET))
        self._rows = rows = BucketRows(store, self.codec, descriptor.kv_buffer_size)
        self._budget = budget
        self.log = StoredLog(guard, offsets, store, images, rows, schema.primary_key)
        self.committer = Committer(guard, offsets, store, images, rows,
                                   descriptor.kv_buffer_size, clock, self.log.row_changes)
        self.writes = TabletWrites(
            guard, offsets, self.committer, rows, self.codec, descriptor, self.aggregators,
            self.key_positions, self.value_positions, self.counted, row_ttl, budget,
            self.log.changelog)
        self.expiry = TabletExpiry(row_ttl, guard, offsets, store, rows, self.codec, schema,
                                   self.committer)
        self.reads = TabletReads(
            guard, offsets, store, rows, images, self.codec, self.expiry, schema,
            self.arrow_schema, self.aggregators, self.value_positions, self.visible_rows,
            self.writes.empty_rows, self.committer.flush)
        self.replica = TabletReplica(guard, offsets, store, images, rows, self.committer, budget,
                                     descriptor.kv_buffer_size, schema.primary_key)
        self.epochs = TabletEpochs(guard, offsets, store, images, rows, schema.primary_key)
        self.replayed_records = self.log.replay_unflushed()  # what opening it cost (metrics)
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
        return self._offsets.end

    @property
    def log_start_offset(self) -> int:
        return self._offsets.start

    # --- writes (TabletWrites) --------------------------------------------------------------

    @property
    def slice_rows(self) -> int:
        """Rows merged at a time in a large write (whole keys); tests make it small."""
        return self.writes.slice_rows

    @slice_rows.setter
    def slice_rows(self, rows: int) -> None:
        self.writes.slice_rows = rows

    def put(self, rows, mode: MergeMode = MergeMode.AGGREGATE, target_columns=None,
            writer: tuple[str, int] | None = None) -> int:
        """Merge `rows` into the bucket; returns the log end offset after the write."""
        return self.writes.put(rows, mode, target_columns, writer)

    def delete(self, keys, mode: MergeMode = MergeMode.AGGREGATE, target_columns=None,
               writer: tuple[str, int] | None = None) -> int:
        """Delete keys (or, with target_columns, reset those columns); returns the end offset."""
        return self.writes.delete(keys, mode, target_columns, writer)

    def undo_writes(self, ranges: list[tuple[int, int]], target_columns=None,
                    writer: tuple[str, int] | None = None) -> tuple[int, WriteUndo]:
        """Take back one writer's writes at offsets in `ranges`, unless another changed a key."""
        return self.writes.undo_writes(ranges, target_columns, writer)

    def applied_end(self, writer: tuple[str, int] | None) -> int | None:
        """The end offset recorded for this (writer id, sequence) if it was applied already."""
        return self.writes.applied_end(writer)

    def flush(self) -> None:
        """Write the buffered rows to RocksDB now (close and log truncation do this too)."""
        self.committer.flush()

    def flush_if_open(self) -> None:
        """flush(), or nothing once closed or once the disk refused a write."""
        self.committer.flush_if_open()

    @property
    def buffered_bytes(self) -> int:
        """Memory held by rows merged since the last flush (an estimate, see RowBuffer)."""
        return self._rows.buffered_bytes

    @property
    def memtable_bytes(self) -> int:
        """What the bucket's RocksDB memtables hold now; 0 once closed."""
        with self._guard.lock:
            return 0 if self._guard.closed else self._store.memtable_bytes

    # --- reads (TabletReads) ----------------------------------------------------------------

    def lookup(self, key: dict) -> dict | None:
        """The row of `key` (a dict of the primary-key columns), or None."""
        return self.reads.lookup(key)

    def lookup_row(self, key_columns: list[pa.Array]) -> pa.RecordBatch | None:
        """The row of one key (one typed value per primary-key column) as a one-row batch."""
        return self.reads.lookup_row(key_columns)

    def lookup_key(self, key: KeyArray) -> pa.RecordBatch | None:
        """lookup_row() of a key already encoded as the store encodes it (one key)."""
        return self.reads.lookup_key(key)

    def lookup_visible(self, key: KeyArray) -> bytes | None:
        """lookup_key() as a visible row (merge_engine.format.visible_row), or None."""
        return self.reads.lookup_visible(key)

    def lookup_many(self, keys, unwritten: bool = False) -> tuple[pa.Table, np.ndarray]:
        """The rows of many keys, one per key in input order, and whether each key has one."""
        return self.reads.lookup_many(keys, unwritten)

    def snapshot(self) -> RowSnapshot:
        """The rows as of the log end offset now, to read without holding the lock."""
        return self.reads.snapshot()

    def prefix_rows(self, prefixes) -> PrefixRows:
        """The rows under key prefixes (leading primary-key columns), pinned at one offset."""
        return self.reads.prefix_rows(prefixes)

    def lookup_prefix(self, prefix, columns=None, unwritten: bool = False) -> pa.Table:
        """Every row whose leading key columns equal `prefix` (a dict, a list of dicts or an
        Arrow table of them), in key order, read at one offset."""
        return self.reads.prefix_rows(prefix).to_table(columns, unwritten)

    def to_arrow(self) -> pa.Table:
        """Every row, ordered by primary key (buffered rows are flushed first)."""
        return self.reads.to_arrow()

    # --- the changelog (StoredLog) ----------------------------------------------------------

    def changelog(self, start: int | None = None, end: int | None = None) -> pa.Table:
        """Changelog records with offsets in [start, end) (default: the whole log held)."""
        return self.log.changelog(start, end)

    def iter_changelog(self, start: int | None = None, end: int | None = None) -> Iterator[pa.Table]:
        """The records of [start, end) one stored batch at a time: bounded memory for undo."""
        return self.log.iter_changelog(start, end)

    def log_entry_spans(self) -> list[tuple[int, int, int]]:
        """(first offset, end offset, written-at ms) of every stored changelog batch."""
        return self.log.log_entry_spans()

    def truncate_log(self, before: int) -> int:
        """Drop changelog records below offset `before`; returns the new log start offset."""
        return self.log.truncate_log(before)

    # --- the row TTL (TabletExpiry) ---------------------------------------------------------

    def expire_rows(self) -> int:
        """The sweep of the row TTL: write the -D of every row past it; returns how many."""
        return self.expiry.expire_rows()

    # --- replication (TabletReplica) and leader epochs (TabletEpochs) -----------------------

    def replication_entries(self, start: int, max_bytes: int = 8 << 20) -> list[ReplicatedEntry]:
        """The stored changelog entries from offset `start`, whole, up to `max_bytes`."""
        return self.replica.replication_entries(start, max_bytes)

    def apply_replicated(self, entries: list[ReplicatedEntry]) -> int:
        """Append the leader's `entries` and apply their rows; returns the new log end."""
        return self.replica.apply_replicated(entries)

    def writer_states(self) -> dict[str, tuple[int, int]]:
        """Every idempotent writer's (last applied sequence, log end offset after it)."""
        return self.replica.writer_states()

    def checkpoint(self, directory: str) -> int:
        """Copy the bucket as of its log end offset now into `directory`; that offset."""
        return self.replica.checkpoint(directory)

    @property
    def leader_epochs(self) -> list[tuple[int, int]]:
        """(leader epoch, start offset) pairs recorded, ascending; [] for a new bucket."""
        return self.epochs.leader_epochs

    def record_leader_epoch(self, epoch: int, start_offset: int) -> None:
        """Record that leader epoch `epoch` starts at `start_offset`."""
        self.epochs.record_leader_epoch(epoch, start_offset)

    def epoch_end_offset(self, epoch: int) -> int:
        """Where leader epoch `epoch` ended in this log (Kafka's OffsetsForLeaderEpoch)."""
        return self.epochs.epoch_end_offset(epoch)

    def truncate_tail(self, offset: int) -> int:
        """Drop the records at and above `offset`, restoring rows, writers and epochs."""
        return self.epochs.truncate_tail(offset)

    # --- lifecycle --------------------------------------------------------------------------

    @property
    def storage_failure(self) -> StorageWriteError | None:
        """The write the disk refused: writes fail until the bucket is reopened (TabletStore)."""
        return self._store.failure

    def close(self) -> None:
        """Flush the row buffer and close; a disk that refuses the flush loses nothing (the
        next open replays the changelog), so the bucket closes all the same."""
        with self._guard.lock:
            if not self._guard.closed:
                self.reads.release_snapshots()  # an open iterator would keep RocksDB open
                with contextlib.suppress(StorageWriteError):
                    self._rows.flush(self._offsets.end)
                self._guard.closed = True
                self._store.close()
        if self._budget is not None:
            self._budget.leave(self)

    def __enter__(self) -> "KvTablet":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"KvTablet({self.path!r}, offsets [{self._offsets.start}, {self._offsets.end}))"

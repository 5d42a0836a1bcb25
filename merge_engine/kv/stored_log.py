"""The bucket's changelog read back and cut short.

Reading a range of records (for changelog readers, replay and undo) and dropping whole stored
batches below an offset (the retention policy decides which: merge_engine.kv.log_retention).
Both run under the bucket's lock and see its log start and end offsets. The changelog is also
the write-ahead log: a reopened bucket replays it past the last flush of its row buffer.
"""

from __future__ import annotations

from typing import Iterator

import pyarrow as pa

from merge_engine.kv import changelog as log
from merge_engine.kv.guard import BucketGuard, LogOffsets
from merge_engine.kv.rows import BucketRows
from merge_engine.kv.storage import START_OFFSET, TabletStore
from tally.errors import OffsetOutOfRangeError, StorageError


class StoredLog:
    """A bucket's changelog as stored: its records by offset, their stored batches, truncation."""

    def __init__(self, guard: BucketGuard, offsets: LogOffsets, store: TabletStore,
                 images: log.Images, rows: BucketRows, primary_key: list[str]):
        self._guard = guard
        self._offsets = offsets
        self._store = store
        self._images = images
        self._rows = rows
        self._primary_key = primary_key

    def changelog(self, start: int | None = None, end: int | None = None) -> pa.Table:
        """Changelog records with offsets in [start, end); start defaults to the log start
        offset (0 until the log is truncated), end to the log end."""
        schema = self._images.reader_schema()
        tables = list(self.iter_changelog(start, end))
        return pa.concat_tables(tables) if tables else schema.empty_table()

    def iter_changelog(self, start: int | None = None, end: int | None = None) -> Iterator[pa.Table]:
        """The records of [start, end) one stored batch at a time: bounded memory for undo."""
        self._guard.check_open()
        offsets = self._offsets
        start = offsets.start if start is None else start
        end = offsets.end if end is None else end
        if not (offsets.start <= start <= end <= offsets.end):
            raise OffsetOutOfRangeError(
                f"Changelog range [{start}, {end}) is outside the bucket's log "
                f"[{offsets.start}, {offsets.end}) of {self._guard.name}"
            )
        for first, data in self._store.log_entries(start):
            if first >= end:
                break
            records = self._images.conform(log.deserialize(data, first))
            low, high = max(start - first, 0), min(end - first, records.num_rows)
            if high > low:
                yield records.slice(low, high - low)

    def row_changes(self, start: int, end: int):
        """What the changelog records of [start, end) do to the rows, a stored entry at a time."""
        return (self._images.row_changes(records, self._primary_key)
                for records in self.iter_changelog(start, end))

    def replay_unflushed(self) -> int:
        """After a crash: rebuild the row buffer from the changelog past the last flush. How
        many records that took (what opening the bucket cost)."""
        applied = self._rows.applied_offset()
        start, end = self._offsets.start, self._offsets.end
        if applied == end:
            return 0
        if not start <= applied < end:
            raise StorageError(
                f"The rows of {self._guard.name} are applied up to offset {applied}, outside its "
                f"log [{start}, {end}): the tablet is corrupt")
        self._rows.replay(self.row_changes(applied, end), end)
        return end - applied

    # --- truncation ---------------------------------------------------------------------

    def log_entry_spans(self) -> list[tuple[int, int, int]]:
        """(first offset, end offset, written-at ms) of every stored changelog batch, oldest
        first. The first may start below the log start offset (truncate_log keeps a batch that
        straddles it)."""
        with self._guard.lock:
            self._guard.check_open()
            entries = list(self._store.log_entry_times())
            ends = [first for first, _ in entries[1:]] + [self._offsets.end]
            return [(first, end, written) for (first, written), end in zip(entries, ends)]

    def truncate_log(self, before: int) -> int:
        """Drop changelog records below offset `before`; returns the new log start offset.

        Whole stored batches below `before` are deleted; a batch straddling it is kept but
        its records below `before` are no longer served.
        """
        with self._guard.lock:
            self._guard.check_open()
            offsets = self._offsets
            if not isinstance(before, int) or not 0 <= before <= offsets.end:
                raise OffsetOutOfRangeError(
                    f"Cannot truncate {self._guard.name} before offset {before!r}: the log ends "
                    f"at {offsets.end}")
            if before <= offsets.start:
                return offsets.start
            self._rows.flush(offsets.end)  # the records to go may be the only copy of buffered rows
            self._rows.persist()  # or of rows RocksDB holds only in its memtables
            batch = self._store.new_batch()
            for first, following, _ in self.log_entry_spans():
                if following <= before:
                    TabletStore.delete_log_entry(batch, first)
            TabletStore.put_int(batch, START_OFFSET, before)
            self._store.commit(batch)
            offsets.start = before
            return before

"""The bucket's changelog read back and cut short: part of KvTablet, kept apart by concern.

Reading a range of records (for changelog readers, replay and undo) and dropping whole stored
batches below an offset (the retention policy decides which: merge_engine.kv.log_retention).
Both run under the tablet's lock and see its log start and end offsets.
"""

from __future__ import annotations

from typing import Iterator

import pyarrow as pa

from merge_engine.kv import changelog as log
from merge_engine.kv.storage import START_OFFSET, TabletStore
from merge_engine.write.state import StateBatch
from tally.errors import OffsetOutOfRangeError


class TabletLog:
    """KvTablet's changelog reads and truncation (a part of KvTablet, not used alone)."""

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
            records = self._images.conform(log.deserialize(data, first))
            low, high = max(start - first, 0), min(end - first, records.num_rows)
            if high > low:
                yield records.slice(low, high - low)

    def records_to_state(self, records: pa.Table) -> StateBatch:
        """Row states of changelog records, written bits included (for replay and undo)."""
        return self._images.to_state(records)

    # --- truncation ---------------------------------------------------------------------

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
            self._rows.persist()  # or of rows RocksDB holds only in its memtables
            batch = self._store.new_batch()
            for first, following, _ in self.log_entry_spans():
                if following <= before:
                    TabletStore.delete_log_entry(batch, first)
            TabletStore.put_int(batch, START_OFFSET, before)
            self._store.commit(batch)
            self._start = before
            return before

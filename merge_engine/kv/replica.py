"""A bucket's side of replication: a leader's entries out, a follower's copy in, checkpoints.

Followers are hot standbys: they append the leader's stored changelog entries verbatim (same
offsets, bytes and written times) and apply their row images to their own rows the way a
reopened bucket replays its log, so a follower's reads, changelog and idempotent-writer states
equal the leader's at the same log end offset, and it can take over as leader without a
replay. Cutting a deposed leader's diverged tail and the
leader epochs that find it are merge_engine.kv.epochs'.
"""

from __future__ import annotations

import os

from merge_engine.kv import changelog as log
from merge_engine.kv.budget import MemoryBudget
from merge_engine.kv.committer import Committer
from merge_engine.kv.guard import BucketGuard, LogOffsets
from merge_engine.kv.replica_entries import ReplicatedEntry
from merge_engine.kv.rows import BucketRows, RowsKept
from merge_engine.kv.storage import END_OFFSET, TabletStore
from tally.errors import InvalidInputError, OffsetOutOfRangeError, StorageError


class TabletReplica:
    """A bucket's changelog entries sent to followers, and a follower's copy of them."""

    def __init__(self, guard: BucketGuard, offsets: LogOffsets, store: TabletStore,
                 images: log.Images, rows: BucketRows, committer: Committer,
                 budget: MemoryBudget | None, buffer_size: int, primary_key: list[str]):
        self._guard = guard
        self._offsets = offsets
        self._store = store
        self._images = images
        self._rows = rows
        self._committer = committer
        self._budget = budget
        self._buffer_size = buffer_size
        self._primary_key = primary_key

    # --- the leader's side ------------------------------------------------------------------

    def replication_entries(self, start: int, max_bytes: int = 8 << 20) -> list[ReplicatedEntry]:
        """The stored changelog entries from offset `start` (an entry's first offset, at or
        above the log start), oldest first and whole, until `max_bytes` of entry data is
        reached (at least one entry, if there is any). [] at the log end."""
        name, offsets = self._guard.name, self._offsets
        with self._guard.lock:
            self._guard.check_open()
            if not isinstance(start, int) or not offsets.start <= start <= offsets.end:
                raise OffsetOutOfRangeError(
                    f"Cannot replicate {name} from offset {start!r}: its log is "
                    f"[{offsets.start}, {offsets.end})")
            if start == offsets.end:
                return []
            entries: list[ReplicatedEntry] = []
            size = 0
            for first, data in self._store.log_entries(start):
                if not entries and first != start:
                    raise OffsetOutOfRangeError(
                        f"Cannot replicate {name} from offset {start}: it is inside the "
                        f"changelog entry starting at offset {first}, not at an entry's start")
                if entries:
                    entries[-1] = _ending_at(entries[-1], first)
                    if size >= max_bytes:
                        return entries
                entries.append(ReplicatedEntry(first, -1, data, self._store.log_entry_time(first),
                                               self._store.entry_writer(first)))
                size += len(data)
            entries[-1] = _ending_at(entries[-1], offsets.end)
            return entries

    # --- the follower's side ----------------------------------------------------------------

    def apply_replicated(self, entries: list[ReplicatedEntry]) -> int:
        """Append the leader's `entries` (contiguous, the first at this bucket's log end) and
        apply their rows; returns the new log end offset.

        One atomic RocksDB batch holds every entry of the call with its written time and
        writer record, the writers' states and the new log end: a fetch answer lands whole or
        not at all, with one sync of the write-ahead log where the table asks for syncs. The
        rows then join the row buffer as a write's do (flushed by its policy; a crash before
        replays them from these entries). Entries that do not fit apply nothing."""
        with self._guard.lock:
            self._guard.check_open()
            decoded = self._check_replicated(entries)
            if not entries:
                return self._offsets.end
            batch = self._store.new_batch()
            kept = RowsKept(self._buffer_size)
            log_bytes = 0
            for entry, records in zip(entries, decoded):
                if entry.writer is not None:
                    writer_id, sequence = entry.writer
                    TabletStore.put_entry_writer(batch, entry.first_offset, writer_id, sequence)
                    TabletStore.put_writer(batch, writer_id, sequence, entry.end_offset)
                kept.add(*self._images.row_changes(records, self._primary_key))
                log_bytes += len(entry.data)
            end = entries[-1].end_offset
            TabletStore.put_int(batch, END_OFFSET, end)
            TabletStore.put_log_entries(batch, [(e.first_offset, e.data, e.written_ms)
                                                for e in entries])
            end = self._committer.commit_batch(batch, self._rows.stage(kept, log_bytes), end)
        if self._budget is not None:
            self._budget.after_write()
        return end

    def _check_replicated(self, entries: list[ReplicatedEntry]) -> list:
        """Each entry's records, read with this table's columns, once every entry is known to
        continue the log where the one before it ends and to hold the records it says."""
        name = self._guard.name
        end = self._offsets.end
        expected, decoded = end, []
        for entry in entries:
            if not isinstance(entry, ReplicatedEntry):
                raise InvalidInputError(f"apply_replicated takes ReplicatedEntry objects, got "
                                        f"{type(entry).__name__}")
            if entry.first_offset != expected:
                raise OffsetOutOfRangeError(
                    f"Cannot apply the replicated entry [{entry.first_offset}, "
                    f"{entry.end_offset}) to {name}: it must start at offset {expected}, "
                    f"where {'its log ends' if expected == end else 'the entry before it ends'}; "
                    f"nothing was applied")
            try:
                records = self._images.conform(log.deserialize(entry.data, entry.first_offset))
            except Exception as exc:  # noqa: BLE001 - Arrow's errors for damaged data vary
                raise InvalidInputError(
                    f"The replicated entry at offset {entry.first_offset} for {name} is not "
                    f"a changelog batch of this table ({exc}); nothing was applied") from None
            if records.num_rows == 0 or records.num_rows != entry.end_offset - entry.first_offset:
                raise InvalidInputError(
                    f"The replicated entry [{entry.first_offset}, {entry.end_offset}) for "
                    f"{name} holds {records.num_rows} records; nothing was applied")
            decoded.append(records)
            expected = entry.end_offset
        return decoded

    def writer_states(self) -> dict[str, tuple[int, int]]:
        """Every idempotent writer's (last applied sequence, log end offset after it)."""
        with self._guard.lock:
            self._guard.check_open()
            return self._store.writer_states()

    # --- checkpoints ------------------------------------------------------------------------

    def checkpoint(self, directory: str) -> int:
        """Copy the bucket as of its log end offset now into `directory` (which must not
        exist), and return that offset. The row buffer is flushed first, so the copy needs no
        replay. `directory` gets the layout of a bucket's path (its RocksDB in
        `directory/rocksdb`): KvTablet.open(directory) opens the copy; to put it in place of a
        bucket, make it (or its `rocksdb` folder) the bucket's path (its `rocksdb` folder)."""
        name = self._guard.name
        with self._guard.lock:
            self._guard.check_open()
            if os.path.lexists(directory):
                raise StorageError(f"Cannot make a checkpoint of {name}: its directory "
                                   f"{os.path.basename(os.path.normpath(directory))} exists")
            self._rows.flush(self._offsets.end)
            try:
                os.makedirs(directory)
            except OSError as exc:
                raise StorageError(f"Cannot make a checkpoint of {name}: "
                                   f"{exc.strerror}") from None
            self._store.checkpoint(os.path.join(directory, "rocksdb"))
            return self._offsets.end


def _ending_at(entry: ReplicatedEntry, end: int) -> ReplicatedEntry:
    return ReplicatedEntry(entry.first_offset, end, entry.data, entry.written_ms, entry.writer)

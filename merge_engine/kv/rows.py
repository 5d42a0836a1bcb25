"""BucketRows: a bucket's current rows, the RowBuffer in front of RocksDB's row keys.

KvTablet decides what a write changes and commits its changelog; this class decides where the
changed rows live. A put's rows join the buffer after its changelog batch commits; when the
buffer then outgrows its limit it is written to RocksDB in batches of its own, the offset the
rows are applied up to in the last one. Reads look in the buffer first, then in RocksDB. See
merge_engine/kv/buffer.py for why the rows wait in memory and how a crash is recovered (replay of
the changelog)."""

from __future__ import annotations

import collections
import dataclasses
import itertools
import operator
from typing import Callable, Iterable

import numpy as np
from rocksdict import WriteBatch

from merge_engine.format.rowcodec import RowCodec
from merge_engine.kv.buffer import ABSENT, ENTRY_BYTES, REMOVED, RowBuffer
from merge_engine.kv.storage import KV_APPLIED, ROW, TabletStore
from merge_engine.kv.stored_keys import StoredKeys
from merge_engine.write.keys import KeyArray
from merge_engine.write.state import StateBatch
from tally.errors import StorageError, StorageWriteError

# Rows per RocksDB write batch when rows go to RocksDB: a bound on what a flush holds at once.
# At 65,536 the multi-gets of later puts of new keys ran 2-3x slower (measured on the ingest
# benchmark's rows; the cause inside RocksDB is not known); at this size they do not.
BATCH_ROWS = 262144


# Rows are flushed once the changelog since the last flush reaches this many buffer sizes, so a
# hot key set that never fills the buffer still leaves a bounded changelog to replay; and
# RocksDB's memtables (which hold flushed rows without its write-ahead log) are flushed to
# table files once the changelog since that last happened does, which bounds a crash's replay.
REPLAY_FACTOR = 4
# ... the latter counted in buffers of at least this size: a tiny buffer (or none) flushes its
# rows every few writes, and a memtable flush as often would write a table file as often.
PERSIST_FROM_BYTES = 4 << 20

# A bucket opened with stored rows makes its filter of stored keys (StoredKeys, a scan of
# every row key: 0.3 us per key, 1M keys in 0.3 s) only once its puts have asked RocksDB
# about this many times as many keys as it holds: the scan then costs about what those
# multi-gets did, so opening a bucket (a restart, a failover's new leader) stays as fast as
# before and a bucket that rarely takes new keys never pays for it.
BUILD_AFTER = 1.0


@dataclasses.dataclass(frozen=True)
class StagedRows:
    """What one committed write changes in the rows: per merged slice (keys, their rows or
    None, removed keys), or None when the rows were not kept (RowsKept) and are read back
    from the write's changelog."""

    flush: bool                 # the buffer goes to RocksDB once the write's rows joined it
    parts: list[tuple[KeyArray, StateBatch | None, KeyArray]] | None
    log_bytes: int
    buffer: RowBuffer | None = None  # the buffer with the parts joined (prepare), if made
    persist: bool = False  # the memtables go to table files after the flush


class RowsKept:
    """A write's changed rows, kept a merged slice at a time while its changelog is built.

    Rows beyond `limit` bytes (the buffer size) would be flushed right after the commit anyway,
    and their full after-images are in the changelog: such a write drops its rows and they are
    read back from the committed log, a stored entry at a time. Keeping them doubled the
    working set of a write of a million new keys (rows and changelog at once)."""

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._bytes = 0
        self.parts: list[tuple[KeyArray, StateBatch | None, KeyArray]] | None = []

    def add(self, keys: KeyArray, rows: StateBatch | None, removed: KeyArray) -> None:
        if self.parts is None:
            return
        self._bytes += (rows.nbytes if rows is not None else 0) + \
            ENTRY_BYTES * (len(keys) + len(removed))
        if self._bytes > self._limit:
            self.parts = None
        else:
            self.parts.append((keys, rows, removed))

    @property
    def nbytes(self) -> int:
        return self._bytes


class BucketRows:
    """Rows by encoded key. Writes are serialised by the tablet; reads may run alongside."""

    batch_rows = BATCH_ROWS  # rows per write batch of a flush (tests make it small)
    persist_from = PERSIST_FROM_BYTES  # (tests make it 0: memtables flushed with the rows)
    build_after = BUILD_AFTER  # (tests make it 0: a filter at the first put)

    def __init__(self, store: TabletStore, codec: RowCodec, buffer_limit: int):
        self._store = store
        self._codec = codec
        self._limit = buffer_limit
        self._buffer = RowBuffer()
        self._log_bytes = 0  # changelog written since the last flush
        # ... and since RocksDB's memtables were last flushed: what a crash replays
        self._unpersisted_log = 0
        # A superset of the stored row keys, or None until made (BUILD_AFTER); a bucket
        # without rows starts with an empty one, which is exact.
        self._stored: StoredKeys | None = None if store.has_rows() else StoredKeys()
        self._asked = 0  # keys asked of RocksDB while there was no filter

    # --- reads ------------------------------------------------------------------------------

    def current(self, keys: KeyArray,
                empty_rows: Callable[[np.ndarray], StateBatch]) -> tuple[StateBatch, np.ndarray]:
        """Each key's current row (`empty_rows(positions)` for keys without one) and whether it
        exists. Buffered rows are taken as Arrow; the rest come from one RocksDB multi-get."""
        buffer = self._buffer
        if not len(keys):
            return empty_rows(np.zeros(0, dtype=np.int64)), np.zeros(0, dtype=bool)
        ids = buffer.find(keys)
        unknown = np.nonzero(ids == ABSENT)[0]
        filtered = self._stored_keys(len(unknown))
        if filtered is not None and len(unknown):
            # keys the filter proves not stored are new without asking RocksDB
            unknown = unknown[filtered.may_hold(keys.take(unknown))]
        stored = self._store.get_rows(keys.take(unknown).to_list(ROW))
        # map of a C function, not a generator: a Python step per key cost a tenth of a put
        # of new keys
        found = np.fromiter(map(operator.is_not, stored, itertools.repeat(None)), dtype=bool,
                            count=len(stored))
        present = ids >= 0
        present[unknown[found]] = True
        # One gather from the three sources puts the rows in key order: the buffer's runs
        # (where a row's id is its position), then the stored rows, then new keys' empty rows.
        # (the buffer's runs only when a key is in them: a put of new keys then takes its
        # empty rows as they are, without a gather)
        buffered = ids >= 0
        sources = buffer.runs() if buffered.any() else []
        where = np.where(buffered, ids, 0)
        placed = sum(len(run) for run in sources)
        from_store = unknown[found]
        if len(from_store):
            sources.append(self._codec.decode([v for v in stored if v is not None]))
            where[from_store] = placed + np.arange(len(from_store))
            placed += len(from_store)
        new = np.nonzero(~present)[0]
        if len(new):
            sources.append(empty_rows(new))
            where[new] = placed + np.arange(len(new))
        if len(sources) == 1 and len(where) == len(sources[0]) and \
                (where == np.arange(len(where))).all():
            state = sources[0]  # one source, already in key order
        else:
            state = StateBatch.gather(sources, where)
        return state, present

    def _stored_keys(self, asking: int) -> StoredKeys | None:
        """The filter of stored keys, made now if the keys asked of RocksDB without one
        (`asking` more now) have reached BUILD_AFTER times the keys it holds."""
        if self._stored is None:
            self._asked += asking
            estimate = self._store.estimated_keys
            if self._asked >= self.build_after * estimate:
                self._stored = StoredKeys.of_stored(self._store.row_keys(), ROW, estimate)
                self._asked = 0
        return self._stored

    @property
    def stored_keys(self) -> StoredKeys | None:
        """The filter of stored keys, if made (for metrics and tests)."""
        return self._stored

    def lookup(self, key: KeyArray) -> StateBatch | None:
        """One key's row (`key` holds one key), or None."""
        found = self.lookup_held(key)
        if isinstance(found, bytes):
            return self._codec.decode([found])
        return None if found is None else found[0].slice(found[1], found[1] + 1)

    def lookup_held(self, key: KeyArray) -> tuple[StateBatch, int] | bytes | None:
        """One key's row as it is held: (a run of the buffer, the row's position in it), the
        stored bytes from RocksDB (not decoded), or None."""
        buffer = self._buffer  # one buffer for the whole read: a flush replaces it
        found = buffer.find_one(key)
        if found == REMOVED:
            return None
        if found >= 0:
            return buffer.place(found)
        return self._store.get_rows(key.to_list(ROW))[0]

    def buffer_copy(self) -> RowBuffer:
        """The buffered rows as they are now, unchanged by later writes (for a snapshot)."""
        return self._buffer.copy()

    @property
    def buffered_bytes(self) -> int:
        return self._buffer.size_bytes

    # --- writes -----------------------------------------------------------------------------

    def prepare(self, kept: RowsKept) -> RowBuffer | None:
        """The buffer as it will be once a write's kept rows joined it (settled), made beside
        the live one, which readers keep seeing until `committed` installs it; None when the
        write will flush the buffer anyway or keeps no rows. A write prepares it while its
        changelog entry is being encoded (PendingWrite); nothing may change the buffer until
        the write is committed (the tablet's lock)."""
        if kept.parts is None or kept.nbytes == 0 or \
                self._buffer.size_bytes + kept.nbytes > self._limit:
            return None
        buffer = self._buffer.copy()
        for keys, rows, removed in kept.parts:
            buffer.add(keys, rows, removed)
        return buffer.settled(self._limit)

    def stage(self, kept: RowsKept, log_bytes: int,
              prepared: RowBuffer | None = None) -> StagedRows:
        """What a write's rows do once its changelog batch (`log_bytes` of it) is committed:
        join the buffer (the `prepared` one, when given), and flush it when it would outgrow
        its limit; flush it and persist RocksDB's memtables when a crash would otherwise
        replay more changelog than REPLAY_FACTOR buffers."""
        persist = self._unpersisted_log + log_bytes > \
            REPLAY_FACTOR * max(self._limit, self.persist_from)
        flush = kept.parts is None or persist or (
            kept.nbytes > 0 and (self._buffer.size_bytes + kept.nbytes > self._limit
                                 or self._log_bytes + log_bytes > REPLAY_FACTOR * self._limit))
        return StagedRows(flush, kept.parts, log_bytes, None if flush else prepared, persist)

    def committed(self, staged: StagedRows, start: int, end: int,
                  logged: Callable[[], Iterable[tuple[KeyArray, StateBatch, KeyArray]]]) -> None:
        """The staged write's changelog, offsets [start, end), is in RocksDB: its rows join the
        buffer, which is then flushed if staged so. Rows that were not kept are read back
        from the changelog (`logged()`, a stored entry at a time) and written straight to
        RocksDB after the buffer's own flush.

        Either way rows reach RocksDB after the commit, in batches of their own, never in the
        changelog's batch: a crash before the last of them leaves the applied offset where it
        was, and the reopened bucket replays the write from its changelog."""
        self._log_bytes += staged.log_bytes
        self._unpersisted_log += staged.log_bytes
        if staged.parts is None:
            try:
                self.flush(start)
                self._write_changes(logged(), end)
            except StorageWriteError:
                # The write is committed: until a reopen replays it, reads find its rows here.
                self._add_all(logged())
                raise
        elif staged.buffer is not None:
            self._buffer = staged.buffer
        else:
            for keys, rows, removed in staged.parts:
                self._buffer.add(keys, rows, removed)
            if staged.flush:
                self.flush(end)
            else:
                self._buffer = self._buffer.settled(self._limit)
        if staged.persist:
            self.persist()

    def flush(self, applied: int) -> None:
        """Write the buffered rows to RocksDB, applied up to offset `applied` (the log end).

        A slice of `batch_rows` keys per write batch (its rows as Python bytes and in the
        batch at once took several times the buffer's size), the applied offset in the last:
        until then a crash replays every buffered row from the changelog, and readers keep
        seeing the buffer, whose rows are the ones being written. The batches skip RocksDB's
        write-ahead log (TabletStore.commit_rows): a crash before RocksDB flushes its
        memtables replays them from the changelog too."""
        if len(self._buffer) == 0 and self.applied_offset() == applied:
            return
        batch = None
        for keys, rows, removed in self._buffer.chunks(self.batch_rows):
            if batch is not None:
                self._store.commit_rows(batch)
            batch = self._store.new_batch()
            self.put_rows(batch, keys, rows, removed)
        if batch is None:
            batch = self._store.new_batch()
        TabletStore.put_int(batch, KV_APPLIED, applied)
        self._store.commit_rows(batch)
        self._buffer, self._log_bytes = RowBuffer(), 0

    def persist(self) -> None:
        """Put the rows RocksDB holds only in its memtables into table files: a crash then
        replays nothing before the applied offset, and changelog entries may be deleted."""
        self._store.persist()
        self._unpersisted_log = 0

    def applied_offset(self) -> int:
        """The changelog offset RocksDB's rows are applied up to (set when the bucket is made)."""
        applied = self._store.get_int(KV_APPLIED, -1)
        if applied < 0:
            raise StorageError("The bucket's rows record no applied offset: the tablet is corrupt")
        return applied

    def replay(self, changes: Iterable[tuple[KeyArray, StateBatch, KeyArray]],
               log_end: int) -> None:
        """Rebuild the buffer from changelog changes past the last flush, oldest first: per
        write, (upserted keys, their after-images, removed keys). Then flush and persist, so
        a second crash does not replay them again on top of what it adds."""
        self._add_all(changes)
        self.flush(log_end)
        self.persist()

    def _add_all(self, changes: Iterable[tuple[KeyArray, StateBatch, KeyArray]]) -> None:
        for keys, rows, removed in changes:
            self._buffer.add(keys, rows, removed)
            self._buffer = self._buffer.settled(self._limit)

    def _write_changes(self, changes: Iterable[tuple[KeyArray, StateBatch, KeyArray]],
                       applied: int) -> None:
        """Write changes (each an entry of the changelog past the rows' applied offset, oldest
        first) to RocksDB, a batch each, then the applied offset in the last batch. The buffer
        is empty: readers see each row before or after, as RocksDB has it."""
        batch = None
        for keys, rows, removed in changes:
            for start in range(0, max(len(keys), 1), self.batch_rows):
                if batch is not None:
                    self._store.commit_rows(batch)
                batch = self._store.new_batch()
                stop = min(start + self.batch_rows, len(keys))
                self.put_rows(batch, keys.take(slice(start, stop)),
                               rows.slice(start, stop) if stop > start else None,
                               removed if start == 0 else removed.take(slice(0, 0)))
        if batch is None:
            batch = self._store.new_batch()
        TabletStore.put_int(batch, KV_APPLIED, applied)
        self._store.commit_rows(batch)

    def put_rows(self, batch: WriteBatch, keys: KeyArray, rows: StateBatch | None,
                 removed: KeyArray) -> None:
        """Add rows (`keys` aligned with `rows`) and the removal of `removed` to `batch`.
        Every row key RocksDB stores comes through here: the filter of stored keys takes the
        keys before the batch is committed (a batch RocksDB refuses leaves it a superset)."""
        filtered = self._stored
        if filtered is not None:
            if rows is not None:
                filtered.add(keys)
            filtered.removed += len(removed)
            if filtered.removed > max(len(filtered), StoredKeys.min_capacity) // 2:
                # Mostly deleted keys: a scan makes it anew once puts have asked for it.
                self._stored = None
        if rows is not None:
            # map drives the puts from C (a deque of length 0 drains it): a Python loop step
            # per row cost a fifth of the flush
            collections.deque(map(batch.put, keys.to_list(ROW), self._codec.encode(rows)),
                              maxlen=0)
        for key in removed.to_list(ROW):
            batch.delete(key)

    @staticmethod
    def initialise(batch: WriteBatch) -> None:
        """Mark a new bucket's (empty) rows as applied up to offset 0."""
        TabletStore.put_int(batch, KV_APPLIED, 0)

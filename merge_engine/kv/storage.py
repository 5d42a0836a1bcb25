"""One bucket's RocksDB: rows, changelog batches and bookkeeping under separate key prefixes.

Keeping all three in one database lets a single atomic write batch hold a write's row changes,
its changelog batch, the new log end offset and the writer's sequence number: after kill -9 the
bucket is either before or after the write, never in between.

A write RocksDB refuses (a full disk, an I/O error) applied nothing, but RocksDB stays
read-only from then on (its background-error state) and rocksdict offers no DB::Resume: the
store records the failure, refuses later writes with it, and the bucket must be closed and
opened again, which replays the write-ahead log up to the last complete write.

Rows are written without RocksDB's write-ahead log (`commit_rows`): the changelog, which is
logged, rebuilds them. With one column family, what survives kill -9 is every write up to some
point (the memtables flushed so far) plus the logged writes after it, so the rows and their
applied offset (KV_APPLIED, in the rows' last batch) survive together, or both fall back to an
earlier flush and the changelog past that offset is replayed onto them. Replaying full images
over rows a crash left newer gives the same rows. Only deleting changelog entries could break
this, so whatever deletes them calls `persist` first.
"""

from __future__ import annotations

import itertools
import os
import re
import struct
from typing import Iterator

from rocksdict import (BlockBasedOptions, Checkpoint, Options, Rdict, ReadOptions, WriteBatch,
                       WriteOptions)

from merge_engine.kv.memtables import MemtableCap
from tally.errors import DiskFullError, StorageError, StorageWriteError

ROW = b"k"
LOG = b"l"
META = b"m"
WRITER = b"w"
LOG_TIME = b"t"  # first offset of a changelog entry -> when it was written (ms since epoch)
# First offset of the last changelog entry of a write made by an idempotent writer -> that
# writer (sequence, id): followers and a new leader rebuild the writers' states from it.
LOG_WRITER = b"u"

END_OFFSET = META + b"end"
START_OFFSET = META + b"start"
KV_APPLIED = META + b"applied"  # the rows hold every changelog record below this offset
DESCRIPTOR = META + b"descriptor"
LEADER_EPOCHS = META + b"leader-epochs"  # (epoch, start offset) pairs, ascending
BASE_WIDTH = META + b"base-width"  # columns of the rows written before a column was added

_U64 = struct.Struct(">Q")
_WRITER_STATE = struct.Struct(">qq")
_SEQUENCE = struct.Struct(">q")
_EPOCH = struct.Struct(">qq")


def offset_key(offset: int) -> bytes:
    return LOG + _U64.pack(offset)


def offset_of(key: bytes) -> int:
    return _U64.unpack(key[len(LOG):])[0]


MULTI_GET_KEYS = 16384
_PATH = re.compile(r"(?<![\w.])/[^\s:;,'\"]+")


def without_paths(text: str) -> str:
    """`text` with every absolute path cut to its last part: a server's directory layout is
    no business of its clients (errors travel to them), and the bucket's name says which
    bucket it is."""
    return _PATH.sub(lambda m: os.path.basename(m.group(0).rstrip("/")), text)


def storage_failure(name: str, exc: BaseException, doing: str) -> StorageWriteError:
    """The typed error for RocksDB's untyped one, raised while `doing` something to bucket
    `name`: DiskFullError for ENOSPC, else StorageWriteError with RocksDB's reason."""
    reason = without_paths(str(exc))
    if "no space left on device" in reason.lower():
        return DiskFullError(f"{name}: no space left on device while {doing}")
    return StorageWriteError(f"{name}: I/O error while {doing}: {reason}")


def reopen_bytes(path: str) -> int:
    """About the disk space reopening the bucket at `path` needs: RocksDB writes what its
    write-ahead logs hold into a table file while it opens, before it deletes them."""
    directory = os.path.join(path, "rocksdb")
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return 0
    return sum(os.path.getsize(os.path.join(directory, n)) for n in names if n.endswith(".log"))


class TabletStore:
    """Thin, typed access to the bucket's RocksDB; `name` is what its errors call it."""

    def __init__(self, path: str, sync: bool = False, memtables: MemtableCap | None = None,
                 name: str | None = None):
        """`memtables`: a cap this bucket's RocksDB memtables share with other buckets'."""
        self.name = name or path
        self.failure: StorageWriteError | None = None  # the write RocksDB refused, if any
        try:
            os.makedirs(path, exist_ok=True)
        except OSError as exc:
            raise storage_failure(self.name, exc, "creating it") from None
        options = Options(raw_mode=True)
        options.create_if_missing(True)
        options.set_write_buffer_size(64 << 20)
        options.set_max_background_jobs(2)
        if memtables is not None:
            memtables.configure(options)
        table = BlockBasedOptions()
        table.set_bloom_filter(10, False)  # new keys miss without reading data blocks
        options.set_block_based_table_factory(table)
        # No bloom filter in the memtable: the bucket's own filter of stored keys (StoredKeys)
        # spares the multi-get nearly every new key, and the memtable's cost 0.15-0.25 s of
        # CPU per 1M rows written (ingest benchmark, case b) to save little after that.
        try:
            self.db = Rdict(os.path.join(path, "rocksdb"), options)
        except Exception as exc:  # rocksdict raises plain Exceptions for lock/corruption
            failure = storage_failure(self.name, exc, "opening it")
            if isinstance(failure, DiskFullError):
                raise failure from None
            raise StorageError(f"Cannot open {self.name}: {without_paths(str(exc))}") from None
        self.write_options = WriteOptions()
        self.write_options.sync = sync
        # Rows skip RocksDB's write-ahead log (see the module's docstring): 8-10% of the
        # time of 1M new keys' puts and flush (ingest benchmark, case b).
        self.rows_options = WriteOptions()
        self.rows_options.disable_wal = True
        self.unpersisted = False  # rows written since the memtables were last flushed

    @property
    def memtable_bytes(self) -> int:
        """What this bucket's RocksDB memtables hold now (for the server's metrics)."""
        return self.db.property_int_value("rocksdb.cur-size-all-mem-tables") or 0

    def close(self) -> None:
        """Close RocksDB. Its closing flush of the memtables may fail (a full disk, or the
        read-only state after a refused write) and rocksdict then raises after closing:
        nothing is lost, since the write-ahead log holds what the memtables held but rows,
        and the changelog rebuilds those."""
        try:
            self.db.close()
        except Exception:  # noqa: BLE001 - see the docstring
            pass

    # --- rows -------------------------------------------------------------------------------

    def get_rows(self, row_keys: list[bytes]) -> list[bytes | None]:
        """Stored row bytes per row key (ROW and the encoded key, as KeyArray.to_list(ROW)
        makes them; None for absent keys); keys in key order read fastest."""
        if not row_keys:
            return []
        if len(row_keys) <= MULTI_GET_KEYS:
            return self.db.get(row_keys)
        # In slices: one multi-get of a million keys holds every key and value in RocksDB's
        # and the binding's own copies at once (about 0.5 KB per key, measured), ten times
        # the write that asked; slices keep that transient small and cost nothing measurable.
        found: list[bytes | None] = []
        for start in range(0, len(row_keys), MULTI_GET_KEYS):
            found.extend(self.db.get(row_keys[start:start + MULTI_GET_KEYS]))
        return found

    @staticmethod
    def _whole_rows() -> ReadOptions:
        """Read options of a one-off pass over every stored row: RocksDB stops at the end of
        the row prefix, so no key is looked at in Python, and the block cache is kept for
        lookups."""
        bound = ReadOptions()
        bound.set_iterate_upper_bound(ROW[:-1] + bytes([ROW[-1] + 1]))
        bound.fill_cache(False)
        return bound

    def row_keys(self) -> Iterator[bytes]:
        """Every stored row key (ROW and the encoded key), in key order."""
        return self.db.keys(from_key=ROW, read_opt=self._whole_rows())

    def has_rows(self) -> bool:
        return next(iter(self.row_keys()), None) is not None

    @property
    def estimated_keys(self) -> int:
        """RocksDB's estimate of the keys it holds, all prefixes together (no I/O)."""
        return self.db.property_int_value("rocksdb.estimate-num-keys") or 0

    def scan_rows(self, chunk: int = 65536) -> Iterator[list[bytes]]:
        """Stored rows in key order, `chunk` at a time (the binding steps the iterator, not a
        Python loop per row)."""
        values = self.db.values(from_key=ROW, read_opt=self._whole_rows())
        while rows := list(itertools.islice(values, chunk)):
            yield rows

    def row_items(self):
        """(key, value) of every stored row in key order, then of the keys after them (the
        reader stops at the first key without the row prefix), read from the database as it is
        now whatever is written later (the iterator is made here): what a RowSnapshot reads
        its stored rows from. rocksdict steps it in Rust, twice as fast as stepping an
        iterator from Python (key, value, next and valid calls per row)."""
        return self.db.items(from_key=ROW)

    # --- changelog --------------------------------------------------------------------------

    def log_entries(self, start: int) -> Iterator[tuple[int, bytes]]:
        """(first offset, serialized batch) of every changelog entry that may hold `start` or
        a later offset, in offset order."""
        it = self.db.iter()
        it.seek_for_prev(offset_key(start))
        if not it.valid() or not it.key().startswith(LOG):
            it.seek(offset_key(start))
        while it.valid() and it.key().startswith(LOG):
            yield offset_of(it.key()), it.value()
            it.next()

    def log_entry_times(self) -> Iterator[tuple[int, int]]:
        """(first offset, written-at ms) of every changelog entry, oldest first."""
        it = self.db.iter()
        it.seek(LOG_TIME)
        while it.valid() and it.key().startswith(LOG_TIME):
            yield _U64.unpack(it.key()[1:])[0], _U64.unpack(it.value())[0]
            it.next()

    @staticmethod
    def put_log_entries(batch: WriteBatch, entries: list[tuple[int, bytes, int]]) -> None:
        """Put changelog entries, each (first offset, data, written ms), with their times.

        Callers put their other (small) records first, and this puts every entry's time before
        any entry's data: RocksDB's write batch is one growing string, and each record that
        does not fit doubles it and copies all it holds. A small record after a large entry
        copied that entry once more into memory never touched before, which on this kind of
        machine costs more than the copy itself."""
        for first_offset, _, written_ms in entries:
            batch.put(LOG_TIME + _U64.pack(first_offset), _U64.pack(written_ms))
        for first_offset, data, _ in entries:
            batch.put(offset_key(first_offset), data)

    @staticmethod
    def delete_log_entry(batch: WriteBatch, first_offset: int) -> None:
        """Delete the entry with its time and, if it has one, its writer record."""
        batch.delete(offset_key(first_offset))
        batch.delete(LOG_TIME + _U64.pack(first_offset))
        batch.delete(LOG_WRITER + _U64.pack(first_offset))

    def entry_end(self, first_offset: int, log_end: int) -> int:
        """The end offset of the entry at `first_offset`: the next entry's first offset, or
        the log end for the last one."""
        it = self.db.iter()
        it.seek(offset_key(first_offset + 1))
        return offset_of(it.key()) if it.valid() and it.key().startswith(LOG) else log_end

    def log_entry_time(self, first_offset: int) -> int:
        value = self.db.get(LOG_TIME + _U64.pack(first_offset))
        return 0 if value is None else _U64.unpack(value)[0]

    @staticmethod
    def put_entry_writer(batch: WriteBatch, first_offset: int, writer_id: str,
                         sequence: int) -> None:
        batch.put(LOG_WRITER + _U64.pack(first_offset),
                  _SEQUENCE.pack(sequence) + writer_id.encode())

    def entry_writer(self, first_offset: int) -> tuple[str, int] | None:
        """The (writer id, sequence) of the write whose last entry starts at `first_offset`."""
        value = self.db.get(LOG_WRITER + _U64.pack(first_offset))
        return None if value is None else _decode_entry_writer(value)

    def entry_writers_below(self, offset: int) -> Iterator[tuple[int, str, int]]:
        """(first offset, writer id, sequence) of the writer records of entries below
        `offset`, newest first."""
        it = self.db.iter()
        it.seek_for_prev(LOG_WRITER + _U64.pack(offset))
        while it.valid() and it.key().startswith(LOG_WRITER):
            first = _U64.unpack(it.key()[len(LOG_WRITER):])[0]
            if first < offset:
                writer_id, sequence = _decode_entry_writer(it.value())
                yield first, writer_id, sequence
            it.prev()

    # --- bookkeeping ------------------------------------------------------------------------

    def get_int(self, key: bytes, default: int = 0) -> int:
        value = self.db.get(key)
        return default if value is None else _U64.unpack(value)[0]

    def get_bytes(self, key: bytes) -> bytes | None:
        return self.db.get(key)

    def writer_state(self, writer_id: str) -> tuple[int, int] | None:
        value = self.db.get(WRITER + writer_id.encode())
        return None if value is None else _WRITER_STATE.unpack(value)

    def writer_states(self) -> dict[str, tuple[int, int]]:
        """Every writer id's (last sequence, end offset)."""
        states = {}
        it = self.db.iter()
        it.seek(WRITER)
        while it.valid() and it.key().startswith(WRITER):
            states[it.key()[len(WRITER):].decode()] = _WRITER_STATE.unpack(it.value())
            it.next()
        return states

    def leader_epochs(self) -> list[tuple[int, int]]:
        value = self.db.get(LEADER_EPOCHS) or b""
        return [_EPOCH.unpack_from(value, at) for at in range(0, len(value), _EPOCH.size)]

    def checkpoint(self, directory: str) -> None:
        """A consistent copy of the whole database in `directory` (which must not exist):
        hard links to its table files where the file system allows, so it is quick. Rows
        still only in the memtables go to table files first, so the copy holds them."""
        self.persist()
        try:
            Checkpoint(self.db).create_checkpoint(directory)
        except Exception as exc:  # noqa: BLE001 - rocksdict raises plain Exceptions
            raise storage_failure(self.name, exc, "making a checkpoint") from None

    # --- atomic writes ----------------------------------------------------------------------

    def new_batch(self) -> WriteBatch:
        return WriteBatch(raw_mode=True)

    @staticmethod
    def put_int(batch: WriteBatch, key: bytes, value: int) -> None:
        batch.put(key, _U64.pack(value))

    @staticmethod
    def put_writer(batch: WriteBatch, writer_id: str, sequence: int, end_offset: int) -> None:
        batch.put(WRITER + writer_id.encode(), _WRITER_STATE.pack(sequence, end_offset))

    @staticmethod
    def delete_writer(batch: WriteBatch, writer_id: str) -> None:
        batch.delete(WRITER + writer_id.encode())

    @staticmethod
    def put_leader_epochs(batch: WriteBatch, epochs: list[tuple[int, int]]) -> None:
        batch.put(LEADER_EPOCHS, b"".join(_EPOCH.pack(e, s) for e, s in epochs))

    def commit(self, batch: WriteBatch) -> None:
        """Write `batch` atomically, or raise a StorageWriteError (DiskFullError for a full
        disk) and apply none of it; after a refusal every later commit raises it too, since
        RocksDB refuses writes until it is reopened."""
        self._write(batch, self.write_options)

    def commit_rows(self, batch: WriteBatch) -> None:
        """Write `batch`, which holds only rows and KV_APPLIED (rows the changelog past the
        applied offset rebuilds), as `commit` does but without RocksDB's write-ahead log."""
        self._write(batch, self.rows_options)
        self.unpersisted = True

    def persist(self) -> None:
        """Flush the memtables to table files if rows were written since they last were:
        after it, deleting changelog entries cannot take rows with them."""
        if not self.unpersisted:
            return
        if self.failure is not None:
            raise type(self.failure)(str(self.failure))
        try:
            self.db.flush(True)
        except Exception as exc:  # noqa: BLE001 - rocksdict raises plain Exceptions
            self.failure = storage_failure(self.name, exc, "flushing its memtables")
            raise self.failure from None
        self.unpersisted = False

    def _write(self, batch: WriteBatch, options: WriteOptions) -> None:
        if self.failure is not None:
            raise type(self.failure)(str(self.failure))
        try:
            self.db.write(batch, options)
        except Exception as exc:  # noqa: BLE001 - rocksdict raises plain Exceptions
            self.failure = storage_failure(self.name, exc, "writing")
            raise self.failure from None


def _decode_entry_writer(value: bytes) -> tuple[str, int]:
    return value[_SEQUENCE.size:].decode(), _SEQUENCE.unpack_from(value)[0]

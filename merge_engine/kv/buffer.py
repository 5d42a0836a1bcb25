"""RowBuffer: the rows a bucket merged since its last flush, held in memory, newest per key.

Why it exists: reading and writing RocksDB one key at a time costs about as much as all the
merging put together, and a hot key set is read back by the very next put. So a put commits only
its changelog batch (which holds every changed row's full after-image) and keeps the merged rows
here; they reach RocksDB in key order, in write batches of a bounded size, when the buffer
outgrows `table.kv.buffer-size`, before the changelog is truncated, and at close. The changelog
is the write-ahead log: RocksDB records up to which offset its rows are applied (in a flush's
last batch), and a bucket reopened after a crash replays the changelog from there into a fresh
buffer. KV state and changelog therefore never disagree; on disk the rows may just lag the log.

Rows stay in Arrow form (StateBatch runs, one per put, the newest small ones merged as they
grow: `settled`) so the next put takes them without decoding. The index is the sorted keys as
a KeyArray (numpy values that compare like the encoded bytes) with each key's row id; ids are
global, each run covers the consecutive id range after the run before it, so a row's id is its
position in the runs taken one after the other. Lookups may run while a put adds to the
buffer: the index is replaced as a whole, never changed in place, and a run is appended before
the index points at it.
"""

from __future__ import annotations

import bisect
from typing import Iterator, NamedTuple

import numpy as np

from merge_engine.kv.key_search import search_sorted
from merge_engine.write.keys import KeyArray
from merge_engine.write.state import StateBatch

ABSENT = -2  # the key is not in the buffer: its row, if any, is in RocksDB
REMOVED = -1  # the key was deleted since the last flush

ENTRY_BYTES = 64  # what one index entry costs beyond its row (key, id, copies during rebuilds)
COMPACT_MIN_ROWS = 4096
MAX_RUNS = 256
# A put of fewer rows than this starts merging the newest runs (below)
SMALL_RUN_ROWS = 16384


class _Index(NamedTuple):
    keys: KeyArray | None  # sorted; None while the buffer has never held a key
    ids: np.ndarray  # row id per key, or REMOVED


def _comparable(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Both arrays in one dtype: variable-width keys of different longest lengths are widened
    (zero padding keeps their order, see KeyArray)."""
    if a.dtype == b.dtype:
        return a, b
    width = max(a.dtype.itemsize, b.dtype.itemsize)
    return a.astype(f"S{width}", copy=False), b.astype(f"S{width}", copy=False)


_EMPTY = _Index(None, np.empty(0, dtype=np.int64))


def _positions(index: np.ndarray, keys: np.ndarray) -> np.ndarray:
    """numpy.searchsorted(index, keys): compiled for keys of up to 8 bytes, which a put
    brings sorted (search_sorted starts each search where the one before ended)."""
    if index.dtype == np.uint64 and keys.dtype == np.uint64:
        return search_sorted(index, keys)
    return np.searchsorted(index, keys)


class RowBuffer:
    """Newest merged row per key since the last flush (or a removal mark)."""

    def __init__(self) -> None:
        self._index = _EMPTY
        self._bases: list[int] = []  # first row id of each run
        self._runs: list[StateBatch] = []
        self._next_id = 0
        self._run_bytes = 0

    def __len__(self) -> int:
        return len(self._index.ids)

    @property
    def size_bytes(self) -> int:
        """An estimate of the memory the buffer holds (rows, superseded ones included)."""
        return self._run_bytes + ENTRY_BYTES * len(self._index.ids)

    # --- reads ------------------------------------------------------------------------------

    @property
    def key_width(self) -> int | None:
        """The width of fixed-width keys (None: variable-width ones, or never a key)."""
        keys = self._index.keys
        return None if keys is None else keys.width

    def find(self, keys: KeyArray) -> np.ndarray:
        """Per key its row id, REMOVED, or ABSENT."""
        index = self._index
        found = np.full(len(keys), ABSENT, dtype=np.int64)
        if len(index.ids) and len(keys):
            search, wanted = _comparable(index.keys.search, keys.search)
            at = np.minimum(_positions(search, wanted), len(search) - 1)
            hit = search[at] == wanted
            found[hit] = index.ids[at[hit]]
        return found

    def find_one(self, key: KeyArray) -> int:
        """find() of a single key, with a handful of numpy calls instead of a dozen."""
        index = self._index
        if not len(index.ids):
            return ABSENT
        search, wanted = _comparable(index.keys.search, key.search)
        at = int(np.searchsorted(search, wanted[0]))
        if at < len(search) and search[at] == wanted[0]:
            return int(index.ids[at])
        return ABSENT

    def state(self, row_id: int) -> StateBatch:
        """The row with this id (>= 0) as a one-row slice of its run, not a copy: a point
        lookup's read (a `take` per column costs more than the rest of the lookup)."""
        run, at = self.place(row_id)
        return run.slice(at, at + 1)

    def place(self, row_id: int) -> tuple[StateBatch, int]:
        """(the run holding the row with this id (>= 0), the row's position in it)."""
        runs = self._runs[:]  # a run is appended before the index points at it
        run = bisect.bisect_right(self._bases, row_id, 0, len(runs)) - 1
        return runs[run], row_id - self._bases[run]

    def states(self, ids: np.ndarray) -> StateBatch:
        """The rows with these ids (all >= 0), in the given order."""
        return StateBatch.gather(self.runs(), ids)

    def runs(self) -> list[StateBatch]:
        """The runs, oldest first: a row's id is its position in them taken one after the
        other (gather)."""
        return self._runs[:]  # a run is appended before the index points at it

    # --- writes -----------------------------------------------------------------------------

    def add(self, keys: KeyArray, rows: StateBatch | None, removed: KeyArray) -> None:
        """Record a put's changed rows (`keys` aligned with `rows`) and removed keys."""
        if not len(keys) and not len(removed):
            return
        ids = np.concatenate([np.arange(self._next_id, self._next_id + len(keys)),
                              np.full(len(removed), REMOVED)]).astype(np.int64)
        if len(keys):
            # The run is in place before the index points at it: a concurrent lookup that
            # finds an id always finds its run.
            self._bases.append(self._next_id)
            self._runs.append(rows)
            self._next_id += len(keys)
            self._run_bytes += rows.nbytes
        self._index = self._merged(self._index, keys, removed, ids)

    @staticmethod
    def _merged(index: _Index, keys: KeyArray, removed: KeyArray, ids: np.ndarray) -> _Index:
        """`index` with `keys` and then `removed` set to `ids` (new keys inserted in order)."""
        search = np.concatenate(_comparable(keys.search, removed.search))
        lengths = None if keys.lengths is None else np.concatenate([keys.lengths, removed.lengths])
        if len(search) > 1 and not (search[1:] > search[:-1]).all():
            order = np.argsort(search, kind="stable")
            search, ids = search[order], ids[order]
            lengths = None if lengths is None else lengths[order]
        if index.keys is None:
            return _Index(KeyArray(search, keys.width, lengths), ids)
        old, search = _comparable(index.keys.search, search)
        at = _positions(old, search)
        hit = old[np.minimum(at, max(len(old) - 1, 0))] == search if len(old) else \
            np.zeros(len(search), dtype=bool)
        merged_ids = index.ids.copy()
        merged_ids[at[hit]] = ids[hit]
        new, where = ~hit, at[~hit]
        merged_lengths = None if lengths is None else \
            np.insert(index.keys.lengths, where, lengths[new])
        return _Index(KeyArray(np.insert(old, where, search[new]), keys.width, merged_lengths),
                      np.insert(merged_ids, where, ids[new]))

    def copy(self) -> "RowBuffer":
        """A buffer with the same rows that can change without changing this one."""
        other = RowBuffer()
        other._index = self._index
        other._bases = list(self._bases)
        other._runs = list(self._runs)
        other._next_id = self._next_id
        other._run_bytes = self._run_bytes
        return other

    def wants_compaction(self, limit: int) -> bool:
        """True when superseded rows outnumber live ones and hold a good part of the memory
        allowed (`limit` bytes), or when puts left many small runs."""
        superseded = self._next_id > max(2 * len(self._index.ids), COMPACT_MIN_ROWS)
        return (superseded and self.size_bytes > limit // 2) or len(self._runs) > MAX_RUNS

    def settled(self, limit: int) -> "RowBuffer":
        """The buffer to keep after a put: compacted (wants_compaction), with its newest runs
        merged (tail_to_merge), or this one. Every put's `current` takes from each run that
        holds one of its keys, so many small puts (a stream of small micro-batches) made every
        later put slower until a flush; merging the newest runs whenever they together outgrow
        the run before them (a binary counter) keeps their number logarithmic, each row copied
        a logarithmic number of times. Large puts make large runs and are left alone."""
        if self.wants_compaction(limit):
            return self.compacted()
        tail = self.tail_to_merge()
        return self if tail is None else self.merged_from(tail)

    def tail_to_merge(self) -> int | None:
        """The first of the newest runs to merge into one, or None."""
        runs = self._runs
        if len(runs) < 2 or len(runs[-1]) >= SMALL_RUN_ROWS:
            return None
        first, rows = len(runs) - 1, len(runs[-1])
        while first > 0 and rows >= len(runs[first - 1]):
            first -= 1
            rows += len(runs[first])
        return first if first < len(runs) - 1 else None

    def merged_from(self, first: int) -> "RowBuffer":
        """A new buffer whose runs from `first` on are one run of their live rows (in key
        order); older runs are shared. New, not changed in place: a reader holding this
        buffer's index keeps finding its ids here."""
        index, base = self._index, self._bases[first]
        in_tail = index.ids >= base  # ids grow with the runs: these rows live in the tail
        tail_ids = index.ids[in_tail]
        other = RowBuffer()
        other._bases, other._runs = self._bases[:first], self._runs[:first]
        ids = index.ids.copy()
        if len(tail_ids):
            rows = self.states(tail_ids)
            ids[in_tail] = np.arange(base, base + len(tail_ids))
            other._bases, other._runs = other._bases + [base], other._runs + [rows]
        other._next_id = base + len(tail_ids)
        other._run_bytes = sum(run.nbytes for run in other._runs)
        other._index = _Index(index.keys, ids)
        return other

    def compacted(self) -> "RowBuffer":
        """A new buffer holding only the live rows, in key order in one run."""
        index = self._index
        live = index.ids >= 0
        other = RowBuffer()
        ids = np.full(len(index.ids), REMOVED, dtype=np.int64)
        if live.any():
            rows = self.states(index.ids[live])
            ids[live] = np.arange(len(rows))
            other._bases, other._runs = [0], [rows]
            other._next_id, other._run_bytes = len(rows), rows.nbytes
        other._index = _Index(index.keys, ids)
        return other

    def drain(self) -> tuple[KeyArray | None, StateBatch | None, KeyArray | None]:
        """(live keys in key order, their rows, removed keys): what a flush writes (None
        for a buffer that never held a key)."""
        return next(self.chunks(max(len(self), 1)), (None, None, None))

    def live_runs(self) -> Iterator[StateBatch]:
        """Each run's live rows (those the index points at), run by run, in no key order: what
        a scan reads. A run whose every row is live comes as it is (no copy; the common case
        after a load of new keys or a compaction), any other as one take of its live rows,
        where drain() gathers every live row in key order across all runs at once."""
        index, runs, bases = self._index, self._runs[:], self._bases[:]
        if not runs:
            return
        live = np.zeros(bases[-1] + len(runs[-1]), dtype=bool)
        live[index.ids[index.ids >= 0]] = True  # ids past the copied runs: none (appended first)
        for base, run in zip(bases, runs):
            rows = live[base:base + len(run)]
            if rows.all():
                yield run
            elif rows.any():
                yield run.take(np.flatnonzero(rows))

    def chunks(self, size: int) -> Iterator[tuple[KeyArray, StateBatch | None, KeyArray]]:
        """drain() a slice of `size` keys at a time, in key order (nothing for a buffer that
        never held a key): a flush then holds one slice's rows and encoded bytes at once."""
        index = self._index
        if index.keys is None:
            return
        for start in range(0, len(index.ids), size):
            ids = index.ids[start:start + size]
            keys = index.keys.take(slice(start, start + len(ids)))
            live = ids >= 0
            rows = self.states(ids[live]) if live.any() else None
            yield keys.take(live), rows, keys.take(~live)

    def __repr__(self) -> str:
        return f"RowBuffer({len(self)} keys, {len(self._runs)} runs, ~{self.size_bytes} bytes)"

"""A large write merged a slice of its keys at a time (whole keys, about SLICE_ROWS rows), so
that its working set stays a small multiple of the write's own size.

Why: every step of a merge keeps per-key arrays beside the rows (before and after states,
their bookkeeping matrices, changelog images, encoded bytes), and a 58 MB write of the ingest
benchmark's rows peaked near 1.4 GB merged whole. All rows of a key fall into one slice, and
slices hold disjoint keys, so merging them one after the other reads the same stored rows and
produces the same states and changelog records, in the same key order, as merging the write
whole. Nothing is committed until every slice is merged: one failing slice applies nothing.
"""

from __future__ import annotations

from typing import Iterator

import numpy as np
import pyarrow as pa

from merge_engine.write.input import WriteInput
from merge_engine.write.keys import KeyArray

# Rows merged at a time (more only when one key has more). Above the rows of a client's 4 MiB
# request of narrow rows (about 100,000), which merges whole: two slices cost such a request a
# fifth of its speed on the ingest benchmark, for a working set it does not need.
SLICE_ROWS = 131072


def rows_of(write: WriteInput, rows: np.ndarray) -> WriteInput:
    """The write restricted to `rows` (ascending row indices)."""
    index = pa.array(rows, type=pa.int64())
    return WriteInput(
        {name: column.take(index) for name, column in write.columns.items()}, write.target,
        len(rows),
        None if write.unwritten is None else [write.unwritten[i] for i in rows.tolist()],
        None if write.signs is None else write.signs[rows],
        None if write.contributions is None else [write.contributions[i] for i in rows.tolist()],
        None if write.written_ms is None else [write.written_ms[i] for i in rows.tolist()])


def key_slices(write: WriteInput, keys: KeyArray, group_ids: np.ndarray, firsts: np.ndarray,
               size: int = SLICE_ROWS) -> Iterator[tuple[KeyArray, WriteInput, np.ndarray,
                                                         np.ndarray]]:
    """(keys, their rows, each row's group id, each key's first row) per slice of whole keys
    in key order, about `size` rows each; the write itself when it has no more rows."""
    if write.rows <= size:
        yield keys, write, group_ids, firsts
        return
    ends = np.cumsum(np.bincount(group_ids, minlength=len(keys)))
    cuts = np.searchsorted(ends, np.arange(size, write.rows, size)) + 1
    bounds = np.unique(np.concatenate([[0], cuts, [len(keys)]])).tolist()
    del ends
    for start, stop in zip(bounds[:-1], bounds[1:]):
        # A pass over the group ids per slice rather than one sort of them all: the sorted
        # copies were held for the whole write, a fifth of its working set beside the merge.
        rows = np.nonzero((group_ids >= start) & (group_ids < stop))[0]
        yield (keys.take(np.arange(start, stop)), rows_of(write, rows),
               group_ids[rows] - start, np.searchsorted(rows, firsts[start:stop]))

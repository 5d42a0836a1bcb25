"""Taking back one writer's own writes in a bucket: the images from before its changes.

A flush that is all or nothing refuses as a whole when one bucket refuses its part; the parts
other buckets had already applied are taken back here. The writer names the offset ranges its
requests were applied at; each key it changed there gets back its image from before its first
change in them (a key it inserted is deleted, or, for a partial writer, its columns reset).

That is exact only while nobody else changed the key's columns since: a record outside the
ranges that changes them after the writer's first change is a conflict, and then nothing is
taken back at all (the caller reports the bucket as applied). The same first-change rule serves
undo recovery, which takes back every change above a baseline instead of one writer's.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pyarrow as pa

from merge_engine.format.undo_images import FirstChanges, first_change, restore_rows
from merge_engine.table.change_types import UPDATE_AFTER, UPDATE_BEFORE
from merge_engine.table.hidden_columns import CHANGE_TYPE, EXPIRED, OFFSET, UNWRITTEN
from merge_engine.write.keys import encode_keys

MAX_CONFLICTS_SHOWN = 5


@dataclass
class WriteUndo:
    """What taking a writer's ranges back writes: restored images and deleted keys, or the
    conflicts that forbid it."""

    restore: pa.Table | None = None
    delete: pa.Table | None = None
    conflicts: list[dict] = field(default_factory=list)
    conflict_count: int = 0


def plan_write_undo(records: pa.Table, ranges: list[tuple[int, int]], schema,
                    target_columns: list[str] | None) -> WriteUndo:
    """The undo of the writer's records (those with offsets in `ranges`) among `records`
    (every record from the first range's start to the log end, in offset order)."""
    names = schema.names if target_columns is None else \
        [n for n in schema.names if n in target_columns]
    watched = [n for n in names if n not in schema.primary_key]
    keys = encode_keys([records.column(k).combine_chunks() for k in schema.primary_key])
    changes = records.column(CHANGE_TYPE).to_pylist()
    offsets = records.column(OFFSET).to_pylist()
    expired = records.column(EXPIRED).to_pylist() if EXPIRED in records.column_names \
        else [False] * records.num_rows
    found, touched, conflicts = FirstChanges(), set(), []
    for i, (key, change, offset) in enumerate(zip(keys, changes, offsets)):
        if any(start <= offset < end for start, end in ranges):
            if key not in touched and first_change(change, i, found):
                touched.add(key)
        elif key in touched and (expired[i] or _changes_columns(records, i, change, watched)):
            conflicts.append(i)
    undo = WriteUndo(conflict_count=len(conflicts))
    if conflicts:
        shown = records.take(pa.array(conflicts[:MAX_CONFLICTS_SHOWN], type=pa.int64()))
        undo.conflicts = shown.select(list(schema.primary_key)).to_pylist()
        return undo
    if found.restore:
        undo.restore = restore_rows(records.take(pa.array(found.restore, type=pa.int64())), names)
    if found.delete:
        undo.delete = records.take(pa.array(found.delete, type=pa.int64())) \
            .select(list(schema.primary_key))
    return undo


def _changes_columns(records: pa.Table, i: int, change: str, watched: list[str]) -> bool:
    """Whether another writer's record `i` changed the key's `watched` columns: an update
    pair (-U then +U) that leaves them equal does not (it wrote other columns)."""
    if change == UPDATE_AFTER:
        return False  # judged with its -U
    if change != UPDATE_BEFORE or i + 1 >= records.num_rows:
        return True  # a delete, or an insert after one
    pair = records.select(watched + [UNWRITTEN]).slice(i, 2).to_pylist()
    before, after = pair
    unwritten_before = {n for n in before.pop(UNWRITTEN) or [] if n in watched}
    unwritten_after = {n for n in after.pop(UNWRITTEN) or [] if n in watched}
    return before != after or unwritten_before != unwritten_after

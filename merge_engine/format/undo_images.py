"""What takes a key's changes back: the first change of each key in a run of changelog
records, and the OVERWRITE rows that put its image from before it back exactly.

Shared by undo recovery (every change above a baseline) and a writer's own undo (one writer's
offset ranges); both read the changelog's records, never the bucket's storage.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pyarrow as pa

from merge_engine.table.change_types import DELETE, INSERT, UPDATE_AFTER, UPDATE_BEFORE
from merge_engine.table.hidden_columns import (CONTRIBUTIONS, SEQUENCES, TOKENS, UNWRITTEN,
                                               WRITTEN_MS)
from tally.errors import RecoveryError


@dataclass
class FirstChanges:
    """Positions, in one batch of records, of the keys' first changes: images to write back
    and keys to delete."""

    restore: list[int] = field(default_factory=list)
    delete: list[int] = field(default_factory=list)


def first_change(change: str, position: int, found: FirstChanges) -> bool:
    """File the first change of a key (at `position`) under what takes it back; False for a
    +U, which never is one (its -U came first, or the key was first changed earlier)."""
    if change == UPDATE_AFTER:
        return False
    if change == INSERT:
        found.delete.append(position)
    elif change in (UPDATE_BEFORE, DELETE):
        found.restore.append(position)
    else:
        raise RecoveryError(f"Unknown change type {change!r} in the changelog")
    return True


def restore_rows(images: pa.Table, names: list[str]) -> pa.Table:
    """The OVERWRITE rows that put changelog `images` back exactly: their `names` columns
    (states, not only values), the columns they left unwritten, contributions and write time."""
    rows = with_states(images.select(names), images)
    unwritten = [[name for name in row if name in names]
                 for row in images.column(UNWRITTEN).to_pylist()]
    rows = rows.append_column(UNWRITTEN, pa.array(unwritten, type=pa.list_(pa.string())))
    rows = rows.append_column(CONTRIBUTIONS, images.column(CONTRIBUTIONS))
    if WRITTEN_MS in images.column_names:
        rows = rows.append_column(WRITTEN_MS, images.column(WRITTEN_MS))
    return rows


def with_states(rows: pa.Table, images: pa.Table) -> pa.Table:
    """`rows` (columns of changelog `images`) with each column whose state is more than its
    value replaced by that state (token lists, value-and-sequence structs), so that an
    OVERWRITE of them restores those states exactly (undo)."""
    for hidden in (TOKENS, SEQUENCES):
        if hidden not in images.column_names:
            continue
        states = images.column(hidden).combine_chunks()
        for field in states.type:
            if field.name in rows.column_names:
                rows = rows.set_column(rows.column_names.index(field.name), field.name,
                                       states.field(field.name))
    return rows

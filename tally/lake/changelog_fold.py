"""Folding a range of changelog records to what it did to each key, with Arrow kernels.

A range's net change per key is its last image: the row after a `+I` or `+U`, or the key's
absence after a `-D` (`-U` records are before-images, always followed by their `+U`). Applied
to the state at the range's start, the net changes give the state at its end, whatever came in
between: writes, deletes, undo writes, row expiry.

The state at a range's start is told by each key's first record in it, read backwards: a `+I`
means the key did not exist, a `-U` or `-D` carries the row as it was. That rewinds a copy
taken at the end of the range (a scan) to its start.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from tally.errors import LakeError

CHANGE_TYPE, OFFSET = "_change_type", "_offset"
DELETED = "_tally_deleted"  # the net change of the key is its removal
_INDEX = "_tally_index"


def net_changes(records: pa.Table, primary_key: list[str], columns: list[str]) -> pa.Table:
    """Per key, its last image in `records` (in offset order) as `columns` plus DELETED."""
    kept = records.filter(pc.not_equal(records.column(CHANGE_TYPE), "-U"))
    last = _pick(kept, primary_key, "max")
    return _shape(last, columns, pc.equal(last.column(CHANGE_TYPE), "-D"))


def start_images(records: pa.Table, primary_key: list[str], columns: list[str]) -> pa.Table:
    """Per key, its row as it was before `records` (DELETED when it did not exist)."""
    first = _pick(records, primary_key, "min")
    types = first.column(CHANGE_TYPE)
    if pc.any(pc.equal(types, "+U")).as_py():
        raise LakeError("a changelog range starts between a -U record and its +U: the rows "
                        "before it cannot be told")
    return _shape(first, columns, pc.equal(types, "+I"))


def _pick(records: pa.Table, primary_key: list[str], which: str) -> pa.Table:
    """The one record per key with the highest (`max`) or lowest (`min`) offset."""
    if records.num_rows == 0:
        return records
    indexed = records.append_column(_INDEX, pa.array(range(records.num_rows), pa.int64()))
    order = pc.sort_indices(indexed, sort_keys=[(OFFSET, "ascending"),
                                                (_INDEX, "ascending")])
    ordered = indexed.take(order).set_column(
        indexed.schema.get_field_index(_INDEX), _INDEX,
        pa.array(range(records.num_rows), pa.int64()))
    picked = ordered.select([*primary_key, _INDEX]).group_by(
        primary_key, use_threads=False).aggregate([(_INDEX, which)])
    return ordered.take(picked.column(f"{_INDEX}_{which}")).drop_columns([_INDEX])


def _shape(rows: pa.Table, columns: list[str], deleted) -> pa.Table:
    out = rows.select(columns)
    if rows.num_rows == 0:
        return out.append_column(DELETED, pa.array([], pa.bool_()))
    return out.append_column(DELETED, deleted)


def apply_changes(rows: pa.Table, changes: pa.Table, primary_key: list[str]) -> pa.Table:
    """`rows` (one per key) with the keys in `changes` replaced by their image there, or
    removed where DELETED: the state `changes` lead to from `rows`."""
    if changes.num_rows == 0:
        return rows
    # join the keys only: Arrow's joins carry no list or map columns
    keys = rows.select(primary_key).append_column(_INDEX, pa.array(range(rows.num_rows),
                                                                    pa.int64()))
    changed = changes.select(primary_key).append_column("_tally_changed",
                                                        pa.array([True] * changes.num_rows))
    joined = keys.join(changed, keys=primary_key, join_type="left outer", use_threads=False)
    untouched = joined.filter(pc.is_null(joined.column("_tally_changed"))).column(_INDEX)
    kept = changes.filter(pc.invert(changes.column(DELETED))).select(rows.column_names)
    return pa.concat_tables([rows.take(untouched.combine_chunks()), kept.cast(rows.schema)])

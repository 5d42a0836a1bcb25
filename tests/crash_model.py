"""Plain-Python recomputation for the kill -9 tests: the crash writer's table, and changelog replay.

The model follows docs/core-contract.md for the four functions the crash table uses (sum, max,
string_agg with ',', last_value_ignore_nulls) and for partial writes and `allow` deletes. A row
compares by its values, but also knows which columns a write has targeted (a written null is
data): a partial delete removes the row only when every other value column is unwritten and
empty (docs/tables.md), so the model must tell a written null from a cell never written.
"""

from __future__ import annotations

import copy

import pyarrow as pa

from tests.crash_writer import COLUMNS, VALUE_COLUMNS, Write

State = dict[int, dict]


class Row(dict):
    """A row's values; `written` holds the value columns some write has targeted. Equality is
    the values' (the engine's table shows values only)."""

    def __init__(self, values: dict, written=()) -> None:
        super().__init__(values)
        self.written = set(written)


def fold(column: str, stored, value):
    if value is None:
        return stored  # null with x gives x; last_value_ignore_nulls keeps the stored value
    if stored is None:
        return value
    if column == "qty":
        return stored + value
    if column == "price":
        return max(stored, value)  # no NaN or -0.0 in the crash data
    if column == "tag":
        return stored + "," + value
    return value  # status: last non-null


def apply(state: State, write: Write) -> State:
    """The state after `write` (a new dict; `state` is left alone)."""
    state = copy.deepcopy(state)
    targets = [c for c in (write.target_columns or COLUMNS) if c != "id"]
    for row in write.rows:
        key = row["id"]
        if write.is_delete:
            if key not in state:
                continue  # deleting an absent key is a no-op
            if write.target_columns is None:
                del state[key]
                continue
            stored = state[key]
            for column in targets:
                stored[column] = None
            stored.written -= set(targets)
            if all(stored[c] is None and c not in stored.written
                   for c in VALUE_COLUMNS if c not in targets):
                del state[key]
            continue
        stored = state.setdefault(key, Row({"id": key, **{c: None for c in VALUE_COLUMNS}}))
        stored.written |= set(targets)
        for column in targets:
            stored[column] = fold(column, stored[column], row[column])
    return state


def table_state(table: pa.Table) -> State:
    """A to_arrow() table as {id: row}."""
    return {row["id"]: {c: row[c] for c in COLUMNS} for row in table.select(list(COLUMNS)).to_pylist()}


def replay(changelog: pa.Table) -> State:
    """Rebuild the table from its changelog, checking each before-image against the state.

    +I needs an absent key, -U and -D must carry the stored image, +U needs a -U just before it.
    """
    state: State = {}
    previous = None
    for record in changelog.to_pylist():
        kind, offset = record["_change_type"], record["_offset"]
        row = {c: record[c] for c in COLUMNS}
        key = row["id"]
        if kind == "+I":
            assert key not in state, f"offset {offset}: +I for id {key}, which exists"
            state[key] = row
        elif kind in ("-U", "-D"):
            assert state.get(key) == row, (
                f"offset {offset}: {kind} image {row} differs from the replayed row {state.get(key)}"
            )
            if kind == "-D":
                del state[key]
        elif kind == "+U":
            assert previous == ("-U", key), f"offset {offset}: +U for id {key} without its -U"
            state[key] = row
        else:
            raise AssertionError(f"offset {offset}: unknown change type {kind!r}")
        previous = (kind, key)
    return state

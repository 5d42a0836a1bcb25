"""Turning what a caller writes (Arrow batches or dicts) into checked columns, or a clear error.

Everything here runs before a tablet touches storage, so a rejected write leaves no trace.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from merge_engine.table.hidden_columns import CHANGE_TYPE, CONTRIBUTIONS, UNWRITTEN, WRITTEN_MS
from merge_engine.table.schema import Schema
from tally.errors import InvalidInputError

_SIGNS = {"+I": 1, "+U": 1, "-U": -1, "-D": -1}


@dataclass
class WriteInput:
    """A validated write: one array per target column (schema order), the target mask, and for
    OVERWRITE writes optionally the per-row set of columns to leave unwritten."""

    columns: dict[str, pa.Array]
    target: np.ndarray
    rows: int
    unwritten: list | None = None
    signs: np.ndarray | None = None  # +1 contributes, -1 retracts (a `_change_type` of -U/-D)
    contributions: list | None = None  # per row, counts of the counted columns (or None)
    written_ms: list | None = None  # per row, a restored image's last-write time (row TTL)

    def key_columns(self, schema: Schema) -> list[pa.Array]:
        return [self.columns[k] for k in schema.primary_key]


def _to_table(rows) -> pa.Table | list[dict]:
    if isinstance(rows, pa.RecordBatch):
        return pa.Table.from_batches([rows])
    if isinstance(rows, pa.Table):
        return rows
    if isinstance(rows, dict):
        rows = [rows]
    if isinstance(rows, (list, tuple)) and all(isinstance(r, dict) for r in rows):
        return list(rows)
    raise InvalidInputError(
        f"Rows must be a pyarrow RecordBatch or Table, or a list of dicts; got {type(rows).__name__}"
    )


def _target_names(schema: Schema, target_columns) -> list[str]:
    if target_columns is None:
        return schema.names
    targets = list(target_columns)
    for name in targets:
        if not schema.has_column(name):
            raise InvalidInputError(
                f"Unknown target column '{name}'; the table's columns are {schema.names}"
            )
    missing = [k for k in schema.primary_key if k not in targets]
    if missing:
        raise InvalidInputError(
            f"The target write columns {targets} must contain the primary key columns "
            f"{list(schema.primary_key)} (missing {missing})"
        )
    return [n for n in schema.names if n in targets]


def _from_python(values: list, column, aggregator) -> pa.Array:
    """An Arrow array of the column's inputs from Python values, built by the function's rules
    (`Aggregator.python_inputs`: e.g. single elements, ids or raw values for list, bitmap or
    sketch columns), or an error naming the first value that does not fit."""
    values, arrow_type = aggregator.python_inputs(values)
    try:
        return pa.array(values, type=arrow_type)
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError, OverflowError) as exc:
        fallback = aggregator.fallback_inputs(values)
        if fallback is not None:
            return fallback
        bad = _first_bad(values, arrow_type)
        raise InvalidInputError(
            f"Column '{column.name}' (type {column.type}) cannot take the value {bad!r}: {exc}"
        ) from None


def _first_bad(values: list, arrow_type: pa.DataType):
    for v in values:
        try:
            pa.array([v], type=arrow_type)
        except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError, OverflowError):
            return v
    return None


def prepare_write(rows, schema: Schema, aggregators, target_columns=None,
                  allow_unwritten: bool = False, keys_only: bool = False,
                  allow_retractions: bool = False) -> WriteInput:
    """Validate a write against the schema and return its columns, or raise InvalidInputError.

    `keys_only` is for deletes: only the primary key is read and other schema columns are
    ignored. Hidden input columns: `_unwritten` and `_contributions` restore an image's
    bookkeeping (OVERWRITE; `_contributions` also carries partial counts in MERGE_STATE);
    `_change_type` marks retractions (-U, -D) in AGGREGATE and MERGE_STATE writes;
    `_written_ms` (OVERWRITE, tables with a row TTL) restores an image's last-write time.
    """
    data = _to_table(rows)
    targets = _target_names(schema, target_columns)
    wanted = list(schema.primary_key) if keys_only else targets
    by_name = {a.column: a for a in aggregators}
    columns: dict[str, pa.Array] = {}
    hidden = {UNWRITTEN: allow_unwritten, CONTRIBUTIONS: allow_unwritten or allow_retractions,
              CHANGE_TYPE: allow_retractions, WRITTEN_MS: allow_unwritten}
    allowed = set(schema.names if keys_only else targets) | {h for h, ok in hidden.items() if ok}
    if isinstance(data, list):
        names = set().union(*(r.keys() for r in data)) if data else set()
        _reject_unknown(names - allowed, schema, targets, keys_only)
        for name in wanted:
            columns[name] = _from_python([r.get(name) for r in data], schema.column(name),
                                         by_name[name])
        extra = {h: [r.get(h) for r in data] for h in hidden if h in names}
        n = len(data)
    else:
        names = set(data.column_names)
        _reject_unknown(names - allowed, schema, targets, keys_only)
        missing = [c for c in wanted if c not in names]
        if missing:
            hint = "" if target_columns is not None else \
                "; pass target_columns=[...] (with the primary key) for a partial write"
            raise InvalidInputError(f"The written rows lack columns {missing}{hint}")
        for name in wanted:
            column = data.column(name)
            # combine_chunks copies even a single chunk: a large write's columns twice over
            columns[name] = column.chunk(0) if column.num_chunks == 1 else column.combine_chunks()
        extra = {h: data.column(h).to_pylist() for h in hidden if h in names}
        n = data.num_rows
    for key in schema.primary_key:
        columns[key] = _key_column(columns[key], schema.column(key), by_name[key])
    target = np.array([name in targets for name in schema.names], dtype=bool)
    unwritten = [v or () for v in extra[UNWRITTEN]] if UNWRITTEN in extra else None
    signs = _signs(extra[CHANGE_TYPE]) if CHANGE_TYPE in extra else None
    return WriteInput(columns, target, n, unwritten, signs, extra.get(CONTRIBUTIONS),
                      extra.get(WRITTEN_MS))


def checked_states(states: pa.Table, schema: Schema, target_columns=None) -> WriteInput:
    """The WriteInput of partial states this process folded itself from a write it validated
    (a Spark task combining its first stage's parts): taken as they are, not checked again,
    so a micro-batch's values are validated once on the executor."""
    targets = _target_names(schema, target_columns)
    columns = {}
    for name in targets:
        column = states.column(name)
        columns[name] = column.chunk(0) if column.num_chunks == 1 else column.combine_chunks()
    target = np.array([name in targets for name in schema.names], dtype=bool)
    names = states.column_names
    signs = _signs(states.column(CHANGE_TYPE).to_pylist()) if CHANGE_TYPE in names else None
    contributions = states.column(CONTRIBUTIONS).to_pylist() if CONTRIBUTIONS in names else None
    return WriteInput(columns, target, states.num_rows, None, signs, contributions)


def _signs(change_types: list) -> np.ndarray | None:
    """+1 per contributing row, -1 per retraction; None when nothing is retracted."""
    try:
        signs = np.array([_SIGNS[c] if c is not None else 1 for c in change_types], dtype=np.int8)
    except KeyError as missing:
        raise InvalidInputError(
            f"Unknown _change_type {missing.args[0]!r}: use +I or +U to add a row's "
            "contribution, -U or -D to take it back") from None
    return signs if (signs < 0).any() else None


def _reject_unknown(unknown: set, schema: Schema, targets: list[str], keys_only: bool) -> None:
    if not unknown:
        return
    name = sorted(unknown)[0]
    if schema.has_column(name):
        raise InvalidInputError(
            f"Column '{name}' is written but is not among the target columns {targets}"
        )
    raise InvalidInputError(
        f"Unknown column '{name}' in the written rows; the table's columns are {schema.names}"
    )


def _key_column(values: pa.Array, column, aggregator) -> pa.Array:
    values = aggregator.cast_input(values)
    if values.null_count:
        row = int(np.nonzero(values.is_null().to_numpy(zero_copy_only=False))[0][0])
        raise InvalidInputError(
            f"Primary key column '{column.name}' is null in row {row} of the write; "
            "nothing was applied"
        )
    return values

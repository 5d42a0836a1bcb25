"""Key prefixes: the leading primary-key columns a prefix lookup fixes, checked and encoded.

A bucket stores each row under its encoded primary key (merge_engine.write.keys): every column
encoded in order, fixed-width columns as order-preserving big-endian bytes, text and binary
escaped with a terminator. Each column's encoding delimits itself, so the encoding of the first
m key columns is a byte prefix of the encoding of every key that starts with those values, and
of no other key: the rows of a prefix are one contiguous range of a bucket's sorted keys.

Only leading columns make such a range (the rows of `day` alone in a `(user, day)` key are
spread over every user): a prefix must name the first m key columns, no others, none null.
Clients, tablet servers and the engine all check prefixes here, with the same errors.
"""

from __future__ import annotations

import pyarrow as pa

from merge_engine.write.keys import encode_keys
from tally.errors import InvalidInputError


def prefix_table(primary_key, arrow_schema: pa.Schema, given, where: str) -> pa.Table:
    """`given` (a dict of column -> value, a list of such dicts, or an Arrow table) as a table
    of the leading primary-key columns it names, typed like the table's columns. `where` names
    the table in errors. InvalidInputError when a column is unknown, not a key column, not
    leading (a column before it is missing), null, or a value does not fit its column."""
    pk = list(primary_key)
    if isinstance(given, dict):
        rows = [given]
    elif isinstance(given, (list, tuple)):
        rows = list(given)
        if not all(isinstance(r, dict) for r in rows):
            raise InvalidInputError(f"key prefixes are dicts of leading primary-key columns "
                                    f"-> value, not {given!r}")
    elif isinstance(given, (pa.Table, pa.RecordBatch)):
        rows = None
    else:
        raise InvalidInputError(f"a key prefix is a dict of leading primary-key columns -> "
                                f"value, not {type(given).__name__}")
    if rows is not None:
        if not rows:
            raise InvalidInputError(f"no key prefix given for {where}")
        names = list(rows[0])
        if any(set(r) != set(names) for r in rows):
            raise InvalidInputError(f"the key prefixes for {where} name different columns: "
                                    f"give every prefix the same columns")
    else:
        names = list(given.schema.names)
    columns = prefix_columns(pk, arrow_schema, names, where)
    if rows is not None:
        arrays = [_typed([r[c] for r in rows], c, arrow_schema.field(c).type, where)
                  for c in columns]
    else:
        arrays = [_cast(given.column(c), c, arrow_schema.field(c).type, where) for c in columns]
    table = pa.Table.from_arrays(arrays, schema=pa.schema(
        [arrow_schema.field(c).with_nullable(False) for c in columns]))
    nulls = [c for c in columns if table.column(c).null_count]
    if nulls:
        raise InvalidInputError(f"key prefix column(s) {nulls} of {where} are null: a prefix "
                                f"matches values, and null equals nothing")
    return table


def prefix_columns(primary_key, arrow_schema: pa.Schema, names, where: str) -> list[str]:
    """`names` as the leading primary-key columns they must be, in key order; the
    InvalidInputError of prefix_table otherwise."""
    pk = list(primary_key)
    names = list(names)
    unknown = [c for c in names if c not in arrow_schema.names]
    if unknown:
        raise InvalidInputError(f"the key prefix names unknown column(s) {unknown} of {where} "
                                f"(its primary key is {pk})")
    other = [c for c in names if c not in pk]
    if other:
        raise InvalidInputError(f"the key prefix names column(s) {other} of {where}, which are "
                                f"not primary-key columns: a prefix fixes leading primary-key "
                                f"columns {pk}")
    if not names:
        raise InvalidInputError(f"a key prefix of {where} names at least its first primary-key "
                                f"column {pk[0]!r}")
    if len(set(names)) != len(names):
        raise InvalidInputError(f"the key prefix of {where} names a column twice: {names}")
    leading = pk[:len(names)]
    if set(names) != set(leading):
        missing = [c for c in leading if c not in names]
        raise InvalidInputError(
            f"the key prefix {names} of {where} is not a leading part of its primary key "
            f"{pk}: the leading key columns are required (it lacks {missing})")
    return leading


def encoded_prefixes(prefixes: pa.Table) -> list[bytes]:
    """Each prefix's bytes as the bucket stores them: what every key starting with it starts
    with (a table from prefix_table)."""
    columns = [c.combine_chunks() if isinstance(c, pa.ChunkedArray) else c
               for c in prefixes.columns]
    return encode_keys(columns)


def _typed(values: list, column: str, data_type: pa.DataType, where: str) -> pa.Array:
    if pa.types.is_integer(data_type) and any(isinstance(v, (float, bool)) for v in values):
        # Arrow would truncate 1.5 to 1 and take True for 1: a prefix matches exactly
        raise InvalidInputError(f"key prefix column {column!r} of {where} is {data_type}: "
                                f"{values!r} are not all integers")
    try:
        return pa.array(values, type=data_type)
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, OverflowError) as e:
        raise InvalidInputError(f"key prefix column {column!r} of {where} is {data_type}: "
                                f"{_short(values)} does not fit ({e})") from None


def _cast(values, column: str, data_type: pa.DataType, where: str) -> pa.Array:
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks()
    if values.type == data_type:
        return values
    if pa.types.is_integer(data_type) and (pa.types.is_floating(values.type)
                                           or pa.types.is_boolean(values.type)):
        raise InvalidInputError(f"key prefix column {column!r} of {where} is {data_type}, not "
                                f"{values.type}")
    try:
        return values.cast(data_type, safe=True)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as e:
        raise InvalidInputError(f"key prefix column {column!r} of {where} is {data_type}, not "
                                f"{values.type}: {e}") from None


def _short(values) -> str:
    text = repr(values)
    return text if len(text) <= 80 else text[:77] + "..."

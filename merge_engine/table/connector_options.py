"""Connector options (`fields.<col>.agg`, `fields.<col>.<fn>.<param>`, `fields.<col>.<param>`)
translated into a schema.

Spark and other connectors cannot declare functions in DDL, so they pass options; these become
schema columns and are not kept as table properties: the schema stays the single truth.
"""

from __future__ import annotations

import pyarrow as pa

from aggfuncs import DEFAULT_FUNCTION, AggFunction
from merge_engine.table.schema import Schema
from merge_engine.table.sequence_groups import is_group_option
from tally.errors import InvalidOptionError

# Parameters named without their function (`fields.<col>.max-cell-bytes`): those of more than
# one function, so a connector need not repeat the column's function name.
COLUMN_PARAMETERS = frozenset({"ignore-retract", "max-cell-bytes", "max-elements", "by"})


def _split_field_options(options: dict, columns: set[str]):
    """{column: function name} and {column: {(fn, param): value}} from `fields.*` options."""
    functions: dict[str, str] = {}
    params: dict[str, dict[tuple[str, str], object]] = {}
    rest = {}
    for key, value in options.items():
        if not key.startswith("fields.") or is_group_option(key):
            rest[key] = value  # a sequence group is a table property (it may name several columns)
            continue
        body = key[len("fields."):]
        # Column names may contain dots: match the longest known column name as the prefix.
        column = next((c for c in sorted(columns, key=len, reverse=True)
                       if body.startswith(c + ".")), None)
        if column is None:
            raise InvalidOptionError(f"Option '{key}' names no column of the table {sorted(columns)}")
        tail = body[len(column) + 1:]
        if tail == "agg":
            functions[column] = value
        elif "." in tail:
            fn, param = tail.split(".", 1)
            params.setdefault(column, {})[(fn, param)] = value
        elif tail in COLUMN_PARAMETERS:  # a parameter of whichever function the column has
            params.setdefault(column, {})[(None, tail)] = value
        else:
            raise InvalidOptionError(
                f"Option '{key}' is not understood: use 'fields.{column}.agg', "
                f"'fields.{column}.<function>.<parameter>' or 'fields.{column}.<parameter>' "
                f"for {sorted(COLUMN_PARAMETERS)}"
            )
    return functions, params, rest


def descriptor_from_options(cls, arrow_schema, primary_key, partition_key, options):
    options = dict(options or {})
    if not isinstance(arrow_schema, pa.Schema):
        arrow_schema = pa.schema(arrow_schema)
    functions, params, properties = _split_field_options(options, set(arrow_schema.names))
    for column in params:
        if column not in functions:
            raise InvalidOptionError(
                f"Parameters are given for column '{column}' but it has no 'fields.{column}.agg'"
            )
    builder = Schema.builder()
    for f in arrow_schema:
        if f.name not in functions:
            builder.column(f.name, f.type, f.nullable)
            continue
        fn = AggFunction.parse(functions[f.name], f.name)
        given = {}
        for (fn_name, param), value in params.get(f.name, {}).items():
            if fn_name is not None and AggFunction.parse(fn_name, f.name) is not fn:
                raise InvalidOptionError(
                    f"Option 'fields.{f.name}.{fn_name}.{param}' names function '{fn_name}' but "
                    f"column '{f.name}' uses '{functions[f.name]}'"
                )
            given[param] = value
        builder.agg_column(f.name, f.type, fn, f.nullable, **given)
    builder.primary_key(*primary_key).partition_key(*partition_key)
    return cls(builder.build(), properties=properties)


def check_against_table(schema: Schema, options: dict, table: str) -> None:
    """Refuse `fields.*` options that contradict an existing table: a `fields.<col>.agg` (or a
    `fields.<col>.<fn>.<param>`) naming another function than the column has, or a column the
    table lacks. Such options only take effect when a table is created, so without this check a
    writer that asked for max on a sum column would silently keep summing. Keys and column
    names are matched case-insensitively (Spark lower-cases option keys)."""
    names = [c.name for c in schema.columns]
    by_length = sorted(names, key=len, reverse=True)
    for key, value in options.items():
        if not str(key).lower().startswith("fields.") or is_group_option(str(key).lower()):
            continue
        body = str(key)[len("fields."):]
        column = next((n for n in by_length if body.lower().startswith(n.lower() + ".")), None)
        if column is None:
            raise InvalidOptionError(
                f"Option '{key}' names no column of the existing table '{table}' (its columns: "
                f"{names})")
        tail = body[len(column) + 1:].lower()
        if tail == "agg":
            asked = AggFunction.parse(str(value), column)
        elif "." in tail:
            asked = AggFunction.parse(tail.split(".", 1)[0], column)
        else:
            continue  # a parameter of whichever function the column has
        if column in schema.primary_key:
            raise InvalidOptionError(
                f"Option '{key}' gives the primary-key column '{column}' of the existing table "
                f"'{table}' the function {asked.value}; key columns have no function")
        has = schema.column(column).agg or DEFAULT_FUNCTION
        if asked is not has:
            raise InvalidOptionError(
                f"Option '{key}' asks for {asked.value}, but column '{column}' of the existing "
                f"table '{table}' aggregates with {has.value}; a table's functions are fixed "
                "when it is created: drop the option, or write to a table created with it")

"""A table's lake options, and which of its columns a Delta Lake table can hold, and as what.

Checked when the table is defined or its options change, so that a table whose columns the
lake cannot hold exactly is refused then (naming the column), not in a tiering round later.
Delta has no unsigned integers, half floats, times of day, nanosecond timestamps or decimals
wider than 38 digits; the lossless ones are widened, the others refused.
"""

from __future__ import annotations

import dataclasses

import pyarrow as pa

from merge_engine.table.option_values import parse_bool_option
from tally.durations import parse_duration_ms
from tally.errors import InvalidOptionError

DATALAKE_ENABLED = "table.datalake.enabled"
DATALAKE_FORMAT = "table.datalake.format"
DATALAKE_FRESHNESS = "table.datalake.freshness"
# Let retention drop changelog the lake has not copied yet (an operator's explicit choice).
RETENTION_IGNORE_LAKE = "table.log.retention.ignore-lake"

LAKE_OPTIONS = {DATALAKE_ENABLED, DATALAKE_FORMAT, DATALAKE_FRESHNESS, RETENTION_IGNORE_LAKE}
LAKE_FORMATS = ("delta",)
DEFAULT_FRESHNESS_MS = 30_000


@dataclasses.dataclass(frozen=True)
class LakeSettings:
    enabled: bool
    format: str
    freshness_ms: int
    retention_ignores_lake: bool


def lake_settings(properties: dict, arrow_schema: pa.Schema) -> LakeSettings:
    """The lake options of a table, validated (with its columns when the lake is enabled)."""
    enabled = parse_bool_option(DATALAKE_ENABLED, properties.get(DATALAKE_ENABLED, False))
    fmt = str(properties.get(DATALAKE_FORMAT, "delta")).strip().lower()
    if fmt not in LAKE_FORMATS:
        hint = " (Iceberg is not supported yet)" if fmt == "iceberg" else ""
        raise InvalidOptionError(f"Invalid value for option '{DATALAKE_FORMAT}': "
                                 f"{properties[DATALAKE_FORMAT]!r}{hint}; supported: "
                                 f"{', '.join(LAKE_FORMATS)}")
    freshness = parse_duration_ms(DATALAKE_FRESHNESS,
                                  properties.get(DATALAKE_FRESHNESS, DEFAULT_FRESHNESS_MS))
    if freshness <= 0:
        raise InvalidOptionError(f"Invalid value for option '{DATALAKE_FRESHNESS}': "
                                 f"{properties[DATALAKE_FRESHNESS]!r} (expected a positive "
                                 "duration such as '30s')")
    ignore = parse_bool_option(RETENTION_IGNORE_LAKE, properties.get(RETENTION_IGNORE_LAKE, False))
    if enabled:
        for f in arrow_schema:
            lake_type(f.name, f.type)
    return LakeSettings(enabled, fmt, freshness, ignore)


def lake_type(column: str, t: pa.DataType) -> pa.DataType:
    """The type column `column` has in the lake table: `t` itself, or a type that holds every
    value of `t` exactly; InvalidOptionError naming the column when there is none."""
    def refuse(why: str):
        raise InvalidOptionError(f"'{DATALAKE_ENABLED}': column '{column}' has type {t}, which "
                                 f"a Delta Lake table cannot hold exactly ({why})")

    if pa.types.is_unsigned_integer(t):
        widened = {8: pa.int16(), 16: pa.int32(), 32: pa.int64()}
        return widened.get(t.bit_width, pa.decimal128(20, 0))
    if pa.types.is_float16(t):
        return pa.float32()
    if pa.types.is_date64(t):
        return pa.date32()  # whole days in milliseconds: the same dates
    if pa.types.is_time(t):
        return refuse("Delta has no time-of-day type; store it as an integer")
    if pa.types.is_timestamp(t):
        if t.unit == "ns":
            return refuse("Delta stores microseconds; use timestamp('us')")
        return pa.timestamp("us", tz="UTC" if t.tz else None)
    if pa.types.is_decimal(t):
        if t.precision > 38:
            return refuse("Delta decimals hold at most 38 digits")
        return pa.decimal128(t.precision, t.scale)
    if pa.types.is_fixed_size_binary(t):
        return pa.binary()
    if pa.types.is_large_string(t):
        return pa.string()
    if pa.types.is_large_binary(t):
        return pa.binary()
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return pa.list_(lake_type(column, t.value_type))
    if pa.types.is_map(t):
        return pa.map_(lake_type(column, t.key_type), lake_type(column, t.item_type))
    return t


def lake_schema(arrow_schema: pa.Schema) -> pa.Schema:
    """The lake table's schema for a Tally table's row schema (hidden columns excluded by the
    caller)."""
    return pa.schema([pa.field(f.name, lake_type(f.name, f.type), nullable=f.nullable)
                      for f in arrow_schema])

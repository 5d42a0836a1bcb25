"""Column types and values as a command line gives them: `NAME:TYPE` for `tally create`,
`COLUMN=VALUE` for `tally lookup`.

Types are Arrow's names as `tally describe` prints them (`int64`, `string`, `decimal128(18, 2)`,
`timestamp[us, tz=UTC]`, `list<item: string>`, `map<string, int64>`), so a described table can be created again
from its output, plus the SQL names Spark users know (`bigint`, `int`, `double`, `boolean`,
`date`, `timestamp`, `decimal(18,2)`, `array<string>`, `map<string, bigint>`).
"""

from __future__ import annotations

import re
import struct

import pyarrow as pa

from tally.errors import InvalidInputError, InvalidOptionError

_NAMED = {
    "bool": pa.bool_(), "boolean": pa.bool_(),
    "int8": pa.int8(), "tinyint": pa.int8(), "byte": pa.int8(),
    "int16": pa.int16(), "smallint": pa.int16(), "short": pa.int16(),
    "int32": pa.int32(), "int": pa.int32(), "integer": pa.int32(),
    "int64": pa.int64(), "bigint": pa.int64(), "long": pa.int64(),
    "uint8": pa.uint8(), "uint16": pa.uint16(), "uint32": pa.uint32(), "uint64": pa.uint64(),
    "float16": pa.float16(), "halffloat": pa.float16(),
    "float32": pa.float32(), "float": pa.float32(), "real": pa.float32(),
    "float64": pa.float64(), "double": pa.float64(),
    "string": pa.string(), "utf8": pa.string(), "varchar": pa.string(),
    "large_string": pa.large_string(), "large_utf8": pa.large_string(),
    "binary": pa.binary(), "large_binary": pa.large_binary(),
    "date32": pa.date32(), "date": pa.date32(), "date32[day]": pa.date32(),
    "date64": pa.date64(), "date64[ms]": pa.date64(),
    "timestamp": pa.timestamp("us"),
}

_DECIMAL = re.compile(r"(decimal|decimal128|decimal256)\s*[(\[]\s*(\d+)\s*,\s*(\d+)\s*[)\]]$")
_TIMESTAMP = re.compile(r"timestamp\s*\[\s*(s|ms|us|ns)\s*(?:,\s*tz\s*=\s*([^\]]+?))?\s*\]$")
_TIME = re.compile(r"(time32|time64)\s*\[\s*(s|ms|us|ns)\s*\]$")
_LIST = re.compile(r"(list|large_list|array)\s*<\s*(?:item\s*:\s*)?(.+?)\s*>$")
_MAP = re.compile(r"map\s*<(.+)>$")
_FIXED = re.compile(r"fixed_size_binary\s*\[\s*(\d+)\s*\]$")


def parse_type(text: str) -> pa.DataType:
    """The Arrow type `text` names; InvalidOptionError naming it when it names none."""
    spec = text.strip()
    lowered = spec.lower()
    if lowered in _NAMED:
        return _NAMED[lowered]
    try:
        if m := _DECIMAL.match(lowered):
            make = pa.decimal256 if m.group(1) == "decimal256" else pa.decimal128
            return make(int(m.group(2)), int(m.group(3)))
        if m := _TIMESTAMP.match(spec.replace("TIMESTAMP", "timestamp")):
            return pa.timestamp(m.group(1), tz=m.group(2))
        if m := _TIME.match(lowered):
            return (pa.time32 if m.group(1) == "time32" else pa.time64)(m.group(2))
        if m := _LIST.match(spec) or _LIST.match(lowered):
            item = parse_type(m.group(2))
            return pa.large_list(item) if m.group(1).lower() == "large_list" else pa.list_(item)
        if m := _MAP.match(spec) or _MAP.match(lowered):
            key, value = _split_pair(m.group(1), text)
            return pa.map_(parse_type(key), parse_type(value))
        if m := _FIXED.match(lowered):
            return pa.binary(int(m.group(1)))
    except (ValueError, pa.ArrowException) as e:
        raise InvalidOptionError(f"column type {text!r} is not valid: {e}") from None
    raise InvalidOptionError(
        f"unknown column type {text!r}; use an Arrow type name (int64, string, "
        "decimal128(18, 2), timestamp[us, tz=UTC], list<string>, ...) or a SQL one (bigint, "
        "int, double, boolean, date, timestamp, decimal(18,2), array<string>)")


def _split_pair(inner: str, text: str) -> tuple[str, str]:
    """`K, V` of a map type, cut at the comma outside any nested <>, [] or ()."""
    depth = 0
    for i, ch in enumerate(inner):
        depth += ch in "<[("
        depth -= ch in ">])"
        if ch == "," and depth == 0:
            return inner[:i], inner[i + 1:]
    raise InvalidOptionError(f"column type {text!r} is not valid: a map type is map<K, V>")


def parse_columns(specs: list[str]) -> pa.Schema:
    """An Arrow schema from `NAME:TYPE` arguments, in order."""
    fields = []
    for spec in specs:
        name, sep, type_text = spec.partition(":")
        name = name.strip()
        if not sep or not name or not type_text.strip():
            raise InvalidOptionError(f"a column is given as NAME:TYPE (e.g. revenue:int64), "
                                     f"got {spec!r}")
        if name in (f.name for f in fields):
            raise InvalidOptionError(f"column '{name}' is given twice")
        fields.append(pa.field(name, parse_type(type_text)))
    if not fields:
        raise InvalidOptionError("give the table's columns as NAME:TYPE arguments")
    return pa.schema(fields)


def parse_key(table_name: str, schema: pa.Schema, primary_key, pairs: list[str]) -> dict:
    """The primary key `COLUMN=VALUE` arguments name, each value read as its column's type."""
    key = {}
    for pair in pairs:
        column, sep, value = pair.partition("=")
        column = column.strip()
        if not sep or not column:
            raise InvalidInputError(f"a key is given as COLUMN=VALUE, got {pair!r}")
        if column not in primary_key:
            raise InvalidInputError(f"column '{column}' is not in the primary key of "
                                    f"{table_name} {list(primary_key)}")
        if column in key:
            raise InvalidInputError(f"key column '{column}' is given twice")
        key[column] = typed_value(column, schema.field(column).type, value)
    missing = [c for c in primary_key if c not in key]
    if missing:
        raise InvalidInputError(f"the key of {table_name} is {list(primary_key)}: give "
                                f"{', '.join(c + '=...' for c in missing)} too")
    return key


def parse_filter(table_name: str, schema: pa.Schema, pairs: list[str]) -> dict:
    """A scan filter from `COLUMN=VALUE` arguments: each value read as its column's type, a
    column given more than once matching any of its values."""
    filter: dict = {}
    for pair in pairs:
        column, sep, value = pair.partition("=")
        column = column.strip()
        if not sep or not column:
            raise InvalidInputError(f"a filter is given as COLUMN=VALUE, got {pair!r}")
        if column not in schema.names:
            raise InvalidInputError(f"{table_name} has no column '{column}' to filter on; its "
                                    f"columns are {schema.names}")
        filter.setdefault(column, []).append(typed_value(column, schema.field(column).type,
                                                         value))
    return filter


def typed_value(column: str, arrow_type: pa.DataType, text: str):
    """`text` read as a value of `arrow_type` (Arrow's own cast from a string)."""
    # The one-string array is built from its buffers: pa.array of a list imports pandas, which
    # would triple the start-up time of `tally lookup`.
    data = text.encode()
    strings = pa.Array.from_buffers(pa.string(), 1, [
        None, pa.py_buffer(struct.pack("<ii", 0, len(data))), pa.py_buffer(data)])
    try:
        return strings.cast(arrow_type)[0].as_py()
    except (pa.ArrowException, ValueError) as e:
        raise InvalidInputError(f"column '{column}' is {arrow_type}: cannot read {text!r} as "
                                f"one ({str(e).splitlines()[0]})") from None

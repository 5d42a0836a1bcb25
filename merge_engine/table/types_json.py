"""Arrow types to and from JSON, so a schema survives being stored and sent over the wire."""

from __future__ import annotations

import pyarrow as pa

from tally.errors import SchemaError

_SIMPLE = {
    str(t): t
    for t in (
        pa.bool_(), pa.int8(), pa.int16(), pa.int32(), pa.int64(), pa.uint8(), pa.uint16(),
        pa.uint32(), pa.uint64(), pa.float16(), pa.float32(), pa.float64(), pa.string(),
        pa.large_string(), pa.binary(), pa.large_binary(), pa.date32(), pa.date64(),
    )
}


def type_to_json(t: pa.DataType) -> dict:
    if str(t) in _SIMPLE and _SIMPLE[str(t)] == t:
        return {"type": str(t)}
    if pa.types.is_decimal(t):
        return {"type": "decimal", "precision": t.precision, "scale": t.scale, "width": t.bit_width}
    if pa.types.is_timestamp(t):
        return {"type": "timestamp", "unit": t.unit, "tz": t.tz}
    if pa.types.is_time(t):
        return {"type": "time", "unit": t.unit, "width": t.bit_width}
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        kind = "large_list" if pa.types.is_large_list(t) else "list"
        return {"type": kind, "item": type_to_json(t.value_type)}
    if pa.types.is_fixed_size_binary(t):
        return {"type": "fixed_size_binary", "width": t.byte_width}
    if pa.types.is_map(t):
        return {"type": "map", "key": type_to_json(t.key_type), "item": type_to_json(t.item_type)}
    if pa.types.is_struct(t):  # the elements of nested_update columns
        return {"type": "struct", "fields": [
            {"name": f.name, "item": type_to_json(f.type), "nullable": f.nullable} for f in t]}
    raise SchemaError(f"Column type {t} is not supported by Tally")


def type_from_json(d: dict) -> pa.DataType:
    try:
        kind = d["type"]
        if kind in _SIMPLE:
            return _SIMPLE[kind]
        if kind == "decimal":
            make = pa.decimal128 if d.get("width", 128) == 128 else pa.decimal256
            return make(d["precision"], d["scale"])
        if kind == "timestamp":
            return pa.timestamp(d["unit"], tz=d.get("tz"))
        if kind == "time":
            return pa.time32(d["unit"]) if d["width"] == 32 else pa.time64(d["unit"])
        if kind == "list":
            return pa.list_(type_from_json(d["item"]))
        if kind == "large_list":
            return pa.large_list(type_from_json(d["item"]))
        if kind == "map":
            return pa.map_(type_from_json(d["key"]), type_from_json(d["item"]))
        if kind == "struct":
            return pa.struct([pa.field(f["name"], type_from_json(f["item"]), f.get("nullable", True))
                              for f in d["fields"]])
        if kind == "fixed_size_binary":
            return pa.binary(d["width"])
    except (KeyError, TypeError, ValueError) as exc:
        raise SchemaError(f"Malformed column type {d!r}: {exc}") from None
    raise SchemaError(f"Unknown column type {d!r}")

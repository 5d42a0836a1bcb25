"""A point lookup's key as the bucket function's own bytes: what the client hashes, it sends.

The bucket function (tally.wire.bucket_hash) is defined on a canonical encoding of the key's
values: per column a u32 little-endian length, then the value (integers and temporals as 8
bytes of int64, decimals as their unscaled 16 or 32 bytes, strings as UTF-8, binary as is).
The client already makes these bytes to find the key's bucket, so a lookup sends them as its
key: the server reads them without an Arrow IPC reader, hashes the very bytes it was sent to
check the bucket, and turns them straight into the storage key (merge_engine.write.keys) without
building Arrow arrays.

The server trusts nothing in them: each value must be well formed for its column's type (the
length; an integer within its type's range; a decimal within its precision; a string valid
UTF-8), or the lookup is refused with an InvalidInputError naming the column; the key must
belong to the addressed partition and bucket. Tables whose key has a boolean or floating
column keep the Arrow IPC key (their canonical bytes lose the column's own width).
"""

from __future__ import annotations

import pyarrow as pa

from merge_engine.write.keys import (KeyArray, decimal_value, escaped_value, integer_value,
                                     key_of_parts)
from tally.errors import InvalidInputError
from tally.wire.bucket_hash import fnv_fmix, one_value_bytes
from tally.wire.routing import TableRouting, partition_names

_M64 = (1 << 64) - 1
_EIGHT = (8).to_bytes(4, "little")


def _fits(t: pa.DataType) -> bool:
    """Whether a key column of type `t` travels as canonical bytes."""
    return (pa.types.is_integer(t) or pa.types.is_decimal(t)
            or (pa.types.is_temporal(t) and t.bit_width in (32, 64))
            or pa.types.is_string(t) or pa.types.is_large_string(t)
            or pa.types.is_binary(t) or pa.types.is_large_binary(t))


def canonical_keys(routing: TableRouting) -> bool:
    """Whether every primary-key column of the table travels as canonical bytes."""
    return all(_fits(routing.arrow_schema.field(c).type) for c in routing.primary_key)


def encode(batch: pa.RecordBatch) -> list[bytes]:
    """Each column's length-prefixed canonical bytes of a one-row key batch."""
    return [one_value_bytes(column, name)
            for name, column in zip(batch.schema.names, batch.columns)]


class PlainValues:
    """The canonical bytes of a key straight from plain Python values, without Arrow: for a
    table whose key columns are all integers, strings or binary, and a key whose values are
    exactly `int`, `str` or `bytes` within their column's type. Any other key is left to
    Arrow (`parts` answers None), which converts it or names what does not fit."""

    def __init__(self, routing: TableRouting) -> None:
        self.columns = []
        for name in routing.primary_key:
            t = routing.arrow_schema.field(name).type
            if pa.types.is_integer(t):
                bits = t.bit_width
                low = -(1 << (bits - 1)) if pa.types.is_signed_integer(t) else 0
                self.columns.append((name, int, low, low + (1 << bits)))
            elif pa.types.is_string(t) or pa.types.is_large_string(t):
                self.columns.append((name, str, 0, 0))
            elif pa.types.is_binary(t) or pa.types.is_large_binary(t):
                self.columns.append((name, bytes, 0, 0))
            else:
                self.columns = None
                break

    def parts(self, key: dict) -> list[bytes] | None:
        """Each key column's length-prefixed canonical bytes, or None (see the class)."""
        if self.columns is None:
            return None
        parts = []
        for name, kind, low, high in self.columns:
            value = key.get(name)
            if type(value) is not kind:  # bool is an int, numpy integers are not: Arrow's
                return None
            if kind is int:
                if not low <= value < high:
                    return None
                parts.append(_EIGHT + (value & _M64).to_bytes(8, "little"))
                continue
            if kind is str:
                try:
                    value = value.encode()
                except UnicodeEncodeError:
                    return None
            parts.append(len(value).to_bytes(4, "little") + value)
        return parts


def bucket_of(parts: dict[str, bytes], routing: TableRouting) -> int:
    """The bucket of a key given as each column's length-prefixed canonical bytes."""
    return fnv_fmix(b"".join(parts[c] for c in routing.bucket_key)) % routing.bucket_count


def split(data: bytes, names, where: object) -> dict[str, bytes]:
    """Each column's length-prefixed canonical bytes, by name; InvalidInputError when `data`
    is not exactly one value per column."""
    parts, at = {}, 0
    for name in names:
        if at + 4 > len(data):
            raise InvalidInputError(f"a lookup key of {where} ends before column {name!r}")
        end = at + 4 + int.from_bytes(data[at:at + 4], "little")
        if end > len(data):
            raise InvalidInputError(f"a lookup key of {where} ends inside column {name!r}")
        parts[name] = data[at:end]
        at = end
    if at != len(data):
        raise InvalidInputError(f"a lookup key of {where} has {len(data) - at} bytes beyond "
                                f"its primary-key columns {list(names)}")
    return parts


class KeyDecoder:
    """The server's reader of one table's canonical keys (one routing)."""

    def __init__(self, routing: TableRouting) -> None:
        self.routing = routing
        self.names = list(routing.primary_key)
        self._columns = [(c, routing.arrow_schema.field(c).type) for c in self.names]

    def storage_key(self, data: bytes, bucket: int, partition: str | None,
                    where: object) -> KeyArray:
        """The storage key of canonical key bytes sent to (`partition`, `bucket`), checked;
        InvalidInputError naming the column or the bucket otherwise (`where`, made text only
        for a refusal)."""
        parts = split(data, self.names, where)
        encoded, fixed = [], True
        for name, t in self._columns:
            value, is_fixed = _stored(parts[name][4:], t, name, where)
            encoded.append(value)
            fixed = fixed and is_fixed
        routing = self.routing
        if routing.partitioned:
            named = partition_names(self._batch(parts, routing.partition_key),
                                    routing.partition_key)[0]
            if named != partition:
                raise InvalidInputError(f"the key belongs to partition '{named}', not to "
                                        f"{where}")
        found = bucket_of(parts, routing)
        if found != bucket:
            batch = self._batch(parts, routing.bucket_key)
            key_text = {c: batch.column(c)[0].as_py() for c in routing.bucket_key}
            raise InvalidInputError(f"the key {key_text} belongs to bucket {found}, not to "
                                    f"{where}")
        return key_of_parts(encoded, fixed)

    def _batch(self, parts: dict[str, bytes], names) -> pa.RecordBatch:
        """A one-row batch of columns `names` of a checked key (for partition names and
        messages)."""
        schema = self.routing.arrow_schema
        return pa.RecordBatch.from_arrays(
            [_array(parts[c][4:], schema.field(c).type) for c in names], names=list(names))


def _stored(value: bytes, t: pa.DataType, name: str, where: object) -> tuple[bytes, bool]:
    """(the storage encoding of one canonical value of type `t`, whether fixed-width);
    InvalidInputError when the value does not fit `t`."""
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        try:
            value.decode()
        except UnicodeDecodeError:
            raise InvalidInputError(f"key column {name!r} of {where} is {t}: its value is "
                                    f"not valid UTF-8") from None
        return escaped_value(value), False
    if pa.types.is_binary(t) or pa.types.is_large_binary(t):
        return escaped_value(value), False
    if pa.types.is_decimal(t):
        if len(value) != t.byte_width:
            raise _width(name, where, t, len(value))
        unscaled = int.from_bytes(value, "little", signed=True)
        if abs(unscaled) >= 10 ** t.precision:
            raise InvalidInputError(f"key column {name!r} of {where} is {t}: the unscaled "
                                    f"value {unscaled} has more than {t.precision} digits")
        return decimal_value(value), True
    # integers and temporals: 8 bytes of int64 (of the value's bits, for uint64)
    if len(value) != 8:
        raise _width(name, where, t, len(value))
    width = t.bit_width // 8
    signed = not pa.types.is_unsigned_integer(t)
    number = int.from_bytes(value, "little", signed=signed)
    low = -(1 << (8 * width - 1)) if signed else 0
    if not low <= number < low + (1 << (8 * width)):
        raise InvalidInputError(f"key column {name!r} of {where} is {t}: {number} does not "
                                f"fit")
    return integer_value(number, width, signed), True


def _array(value: bytes, t: pa.DataType) -> pa.Array:
    """A one-value array of type `t` of a checked canonical value."""
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return pa.array([value.decode()], t)
    if pa.types.is_binary(t) or pa.types.is_large_binary(t):
        return pa.array([value], t)
    width = t.byte_width if pa.types.is_decimal(t) else t.bit_width // 8
    data = value if pa.types.is_decimal(t) else value[:width]  # little-endian: the low bytes
    return pa.Array.from_buffers(t, 1, [None, pa.py_buffer(data)])


def _width(name: str, where: object, t: pa.DataType, size: int) -> InvalidInputError:
    return InvalidInputError(f"key column {name!r} of {where} is {t}: a value of {size} bytes "
                             f"is not one of its values")

"""Cell values of the reference model: input checks per Arrow type, exact arithmetic helpers,
the total order max/min use, and the bitwise equality the changelog rule needs.

Values are the Python objects `pa.Table.to_pylist()` gives (int, float, Decimal, str, bytes,
bool, date, datetime, list). Everything here is deliberately slow and literal: the model is the
second, obviously-correct implementation the engine is checked against.
"""

from __future__ import annotations

import datetime
import decimal
import math
import struct
from typing import Any

import pyarrow as pa

from tally.errors import AggregateOverflowError, InvalidInputError

# Exact decimal arithmetic: enough digits that no decimal128 operation ever rounds implicitly
# (38 digits times a few hundred factors), and HALF_UP for the one rounding the contract asks for.
EXACT = decimal.Context(prec=100_000, rounding=decimal.ROUND_HALF_UP, Emax=10**9, Emin=-(10**9))

_INT_BITS = {
    pa.int8(): 8,
    pa.int16(): 16,
    pa.int32(): 32,
    pa.int64(): 64,
}


def int_range(arrow_type: pa.DataType) -> tuple[int, int]:
    """The inclusive range of a signed integer type."""
    bits = _INT_BITS[arrow_type]
    return -(1 << (bits - 1)), (1 << (bits - 1)) - 1


def is_int(arrow_type: pa.DataType) -> bool:
    return arrow_type in _INT_BITS


def is_float(arrow_type: pa.DataType) -> bool:
    return pa.types.is_floating(arrow_type)


def is_decimal(arrow_type: pa.DataType) -> bool:
    return pa.types.is_decimal(arrow_type)


def round_float32(x: float) -> float:
    """x rounded to the nearest float32 (as a Python float).

    Python does arithmetic in double; rounding the exact-in-double result of one + or * of two
    float32 values to float32 gives the correctly rounded float32 result, so this matches a
    native float32 loop bit for bit.
    """
    try:
        return struct.unpack("<f", struct.pack("<f", x))[0]
    except OverflowError:
        # struct refuses finite values that round past the largest float32: IEEE gives infinity.
        return math.copysign(math.inf, x)


def decimal_unscaled(value: decimal.Decimal, scale: int) -> int:
    """The unscaled integer of `value` at `scale` (the caller ensures it is exact)."""
    return int(value.scaleb(scale, context=EXACT))


def make_decimal(unscaled: int, scale: int) -> decimal.Decimal:
    """The Decimal Arrow returns for an unscaled integer at `scale` (no negative zero)."""
    return decimal.Decimal(unscaled).scaleb(-scale, context=EXACT)


def check_range(column: str, arrow_type: pa.DataType, value: Any) -> Any:
    """Raise AggregateOverflowError when an aggregate result left the column's type."""
    if value is None:
        return None
    if is_int(arrow_type):
        low, high = int_range(arrow_type)
        if not low <= value <= high:
            raise AggregateOverflowError(
                f"Aggregate of column '{column}' overflows {arrow_type}: {value}"
            )
    elif is_decimal(arrow_type):
        unscaled = decimal_unscaled(value, arrow_type.scale)
        if abs(unscaled) >= 10**arrow_type.precision:
            raise AggregateOverflowError(
                f"Aggregate of column '{column}' exceeds the precision of {arrow_type}: {value}"
            )
        return make_decimal(unscaled, arrow_type.scale)
    return value


def coerce_input(column: str, arrow_type: pa.DataType, value: Any) -> Any:
    """An input value checked against the column type, in the form to_pylist() gives.

    Raises InvalidInputError when the value cannot be stored in the type without loss.
    """
    if value is None:
        return None

    def bad(reason: str = "") -> InvalidInputError:
        return InvalidInputError(
            f"Column '{column}' ({arrow_type}) cannot take {value!r}{': ' + reason if reason else ''}"
        )

    if is_int(arrow_type):
        if isinstance(value, bool) or not isinstance(value, int):
            raise bad()
        low, high = int_range(arrow_type)
        if not low <= value <= high:
            raise bad("out of range")
        return value
    if is_float(arrow_type):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise bad()
        value = float(value)
        return round_float32(value) if arrow_type == pa.float32() else value
    if is_decimal(arrow_type):
        if isinstance(value, bool) or not isinstance(value, (int, decimal.Decimal)):
            raise bad()
        value = decimal.Decimal(value)
        if not value.is_finite():
            raise bad("not finite")
        scaled = value.scaleb(arrow_type.scale, context=EXACT)
        if scaled != scaled.to_integral_value(context=EXACT):
            raise bad("more fractional digits than the scale")
        unscaled = int(scaled)
        if abs(unscaled) >= 10**arrow_type.precision:
            raise bad("exceeds the precision")
        return make_decimal(unscaled, arrow_type.scale)
    if pa.types.is_boolean(arrow_type):
        if not isinstance(value, bool):
            raise bad()
        return value
    if pa.types.is_string(arrow_type) or pa.types.is_large_string(arrow_type):
        if not isinstance(value, str):
            raise bad()
        return value
    if pa.types.is_binary(arrow_type) or pa.types.is_large_binary(arrow_type):
        if not isinstance(value, (bytes, bytearray)):
            raise bad()
        return bytes(value)
    if pa.types.is_date32(arrow_type):
        if isinstance(value, datetime.datetime) or not isinstance(value, datetime.date):
            raise bad()
        return value
    if pa.types.is_timestamp(arrow_type):
        if not isinstance(value, datetime.datetime) or value.tzinfo is not None:
            raise bad("expected a naive datetime")
        if arrow_type.unit in ("s", "ms") and value.microsecond % (1000 if arrow_type.unit == "ms" else 10**6):
            raise bad("finer than the unit")
        return value
    if pa.types.is_list(arrow_type) or pa.types.is_large_list(arrow_type):
        if not isinstance(value, (list, tuple)):
            raise bad()
        return [coerce_input(column, arrow_type.value_type, v) for v in value]
    if pa.types.is_map(arrow_type):
        # A dict or (key, value) pairs, as to_pylist gives maps; keys must not be null.
        pairs = value.items() if isinstance(value, dict) else value
        if not isinstance(pairs, (list, tuple, type({}.items()))):
            raise bad()
        entries = []
        for pair in pairs:
            if not isinstance(pair, (list, tuple)) or len(pair) != 2 or pair[0] is None:
                raise bad("expected (key, value) pairs with non-null keys")
            entries.append((coerce_input(column, arrow_type.key_type, pair[0]),
                            coerce_input(column, arrow_type.item_type, pair[1])))
        return entries
    # Any other type: trust what Arrow would store (the model compares it with ==).
    return value


# --- ordering and equality ------------------------------------------------------------------


def order_key(value: Any) -> Any:
    """The sort key of max/min: the total order of the contract.

    Floats: NaN above everything, -0.0 below 0.0. Strings by code point (Python's own str order),
    binary by bytes, numbers, decimals, dates and timestamps by value.
    """
    if isinstance(value, float):
        if math.isnan(value):
            return (2, 0.0, 0)
        # Equal numbers share the middle element; the sign bit then puts -0.0 below 0.0.
        return (1, value, 0 if math.copysign(1.0, value) < 0 else 1)
    return value


def float_bits(x: float) -> bytes:
    return struct.pack("<d", x)


def same_value(a: Any, b: Any) -> bool:
    """Bitwise equality of two cell values: -0.0 differs from 0.0.

    Any NaN equals any NaN: which NaN operand's payload and sign an operation propagates is up
    to the hardware and the order of operands inside numpy or C (IEEE 754 leaves it open), so
    it is not part of the contract.
    """
    if a is None or b is None:
        return a is None and b is None
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if isinstance(a, float) or isinstance(b, float):
        if not (isinstance(a, float) and isinstance(b, float)):
            return False
        if math.isnan(a) or math.isnan(b):
            return math.isnan(a) and math.isnan(b)
        return float_bits(a) == float_bits(b)
    if isinstance(a, (list, tuple)) or isinstance(b, (list, tuple)):
        return (
            isinstance(a, (list, tuple))
            and isinstance(b, (list, tuple))
            and len(a) == len(b)
            and all(same_value(x, y) for x, y in zip(a, b))
        )
    if isinstance(a, datetime.datetime) != isinstance(b, datetime.datetime):
        return False
    return a == b


def same_row(a: dict | None, b: dict | None) -> bool:
    """Bitwise equality of two rows (dicts of cell values)."""
    if a is None or b is None:
        return a is None and b is None
    return a.keys() == b.keys() and all(same_value(a[k], b[k]) for k in a)

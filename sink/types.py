"""Which Spark column types may feed which Tally column types, decided before any write.

Tally's engine casts inputs with Arrow's safe casts, which accept e.g. strings into integer
columns and fail only on the first bad value, possibly after other buckets were written. The
sink refuses such pairs up front: a DataFrame column is accepted only when its Arrow type equals
the column's input type or widens to it without loss.
"""

from __future__ import annotations

import pyarrow as pa

from aggfuncs import DEFAULT_FUNCTION, make_aggregator
from merge_engine import MergeMode


def spark_to_arrow(data_type) -> pa.DataType:
    """The Arrow type Spark uses for a Spark SQL type in Arrow batches (mapInArrow)."""
    from pyspark.sql.pandas.types import to_arrow_type

    return to_arrow_type(data_type, timezone="UTC", prefers_large_types=False)


_SIGNED = [pa.int8(), pa.int16(), pa.int32(), pa.int64()]
_UNSIGNED = [pa.uint8(), pa.uint16(), pa.uint32(), pa.uint64()]


def _rank(t: pa.DataType, family: list[pa.DataType]) -> int:
    return family.index(t) if t in family else -1


def widens(src: pa.DataType, dst: pa.DataType) -> bool:
    """True when every value of `src` is exactly a value of `dst`."""
    if src == dst:
        return True
    if pa.types.is_null(src):
        return True
    if pa.types.is_signed_integer(src) and pa.types.is_signed_integer(dst):
        return _rank(src, _SIGNED) <= _rank(dst, _SIGNED)
    if pa.types.is_unsigned_integer(src):
        if pa.types.is_unsigned_integer(dst):
            return _rank(src, _UNSIGNED) <= _rank(dst, _UNSIGNED)
        if pa.types.is_signed_integer(dst):
            return _rank(src, _UNSIGNED) < _rank(dst, _SIGNED)
    if pa.types.is_integer(src) and pa.types.is_floating(dst):
        mantissa = {16: 11, 32: 24, 64: 53}[dst.bit_width]
        return src.bit_width < mantissa
    if pa.types.is_floating(src) and pa.types.is_floating(dst):
        return src.bit_width <= dst.bit_width
    if pa.types.is_integer(src) and pa.types.is_decimal(dst):
        digits = {8: 3, 16: 5, 32: 10, 64: 19}[src.bit_width]
        return dst.precision - dst.scale >= digits
    if pa.types.is_decimal(src) and pa.types.is_decimal(dst):
        return dst.scale >= src.scale and dst.precision - dst.scale >= src.precision - src.scale
    text = (pa.types.is_string, pa.types.is_large_string, pa.types.is_string_view)
    if any(f(src) for f in text) and any(f(dst) for f in text):
        return True
    blob = (pa.types.is_binary, pa.types.is_large_binary, pa.types.is_binary_view)
    if any(f(src) for f in blob) and any(f(dst) for f in blob):
        return True
    if pa.types.is_timestamp(src) and pa.types.is_timestamp(dst):
        units = ["s", "ms", "us", "ns"]
        return units.index(src.unit) <= units.index(dst.unit)
    if pa.types.is_date(src) and pa.types.is_date(dst):
        return True
    if _is_list(src) and _is_list(dst):
        return widens(src.value_type, dst.value_type)
    if pa.types.is_map(src) and pa.types.is_map(dst):
        return widens(src.key_type, dst.key_type) and widens(src.item_type, dst.item_type)
    if pa.types.is_struct(src) and pa.types.is_struct(dst):  # nested_update elements
        return [f.name for f in src] == [f.name for f in dst] and \
            all(widens(a.type, b.type) for a, b in zip(src, dst))
    return False


def _is_list(t: pa.DataType) -> bool:
    return pa.types.is_list(t) or pa.types.is_large_list(t)


def accepts(column, is_key: bool, src: pa.DataType, mode: MergeMode, aggregation: bool) -> bool:
    """Whether a DataFrame column of Arrow type `src` may feed the table `column`."""
    dst = column.type
    if is_key or not aggregation:
        return widens(src, dst)
    # The function says what else it takes (counts anything, single elements, raw values).
    aggregator = make_aggregator(column.agg or DEFAULT_FUNCTION, column.name, dst, column.params)
    return aggregator.takes_type(src, widens, states=mode is MergeMode.MERGE_STATE,
                                 replaces=mode is MergeMode.OVERWRITE)


def arrow_to_spark(data_type: pa.DataType):
    """The Spark SQL type a Tally column of Arrow type `data_type` reads as (batch reads);
    batches are cast to `spark_to_arrow` of it before Spark sees them. Spark has no unsigned
    integers: each reads as the narrowest signed type that holds all its values."""
    from pyspark.sql import types as T
    from pyspark.sql.pandas.types import from_arrow_type

    if pa.types.is_unsigned_integer(data_type):
        return {8: T.ShortType(), 16: T.IntegerType(), 32: T.LongType(),
                64: T.DecimalType(20, 0)}[data_type.bit_width]
    if _is_list(data_type) and pa.types.is_unsigned_integer(data_type.value_type):
        return T.ArrayType(arrow_to_spark(data_type.value_type), True)
    if pa.types.is_map(data_type):
        return T.MapType(arrow_to_spark(data_type.key_type), arrow_to_spark(data_type.item_type),
                         True)
    return from_arrow_type(data_type)

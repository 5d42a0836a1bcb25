"""Exact arithmetic folds shared by sum, product and count.

Integers: numpy int64 on the fast path, with a float64 shadow of the same fold to spot the groups
that might leave the range; only those are recomputed with Python integers, so overflow is always
detected and never wraps. Floats: a strict left fold in the column's own precision (IEEE, so
infinities and NaN are values). Decimals: Python's decimal module, exact, HALF_UP for products.
"""

from __future__ import annotations

import decimal
from typing import Callable

import numpy as np
import pyarrow as pa

from aggfuncs.base import numeric_values, with_nulls
from aggfuncs.segments import Segments
from tally.errors import AggregateOverflowError

_SAFE = float(2**62)
_NUMERIC_NAMES = "int8, int16, int32, int64, uint8, uint16, uint32, uint64, float32, float64, decimal"


def is_numeric(arrow_type: pa.DataType) -> bool:
    return (
        pa.types.is_integer(arrow_type)
        or pa.types.is_floating(arrow_type)
        or pa.types.is_decimal(arrow_type)
    )


NUMERIC_TYPE_NAMES = _NUMERIC_NAMES


def integer_bounds(arrow_type: pa.DataType) -> tuple[int, int]:
    info = np.iinfo(arrow_type.to_pandas_dtype())
    return int(info.min), int(info.max)


def check_result(value, arrow_type: pa.DataType, what: str) -> None:
    """Raise AggregateOverflowError when an exact result does not fit the column's type."""
    if pa.types.is_integer(arrow_type):
        low, high = integer_bounds(arrow_type)
        if not low <= value <= high:
            raise AggregateOverflowError(
                f"{what} overflows {arrow_type}: the result {value} is outside [{low}, {high}]. "
                "The whole write was rejected.")
    elif pa.types.is_decimal(arrow_type):
        if abs(value) >= decimal.Decimal(10) ** (arrow_type.precision - arrow_type.scale):
            raise AggregateOverflowError(
                f"{what} overflows {arrow_type}: the result {value} needs more than "
                f"{arrow_type.precision} digits. The whole write was rejected.")


def fold_numeric(
    values: pa.Array,
    segments: Segments,
    ufunc: np.ufunc,
    python_op: Callable[[object, object], object],
    what: str,
    decimal_op: Callable[[decimal.Decimal, decimal.Decimal], decimal.Decimal] | None = None,
) -> pa.Array:
    """Fold the (all non-null) `values` per group; null where a group has no values.

    `what` names the function and column for error messages, e.g. "sum column 'qty'".
    """
    arrow_type = values.type
    if pa.types.is_floating(arrow_type):
        data = numeric_values(values)
        result, has = segments.fold(ufunc, data)
        return with_nulls(result, has, arrow_type)
    if pa.types.is_decimal(arrow_type):
        return _fold_decimal(values, segments, decimal_op or python_op, what)
    return _fold_integer(values, segments, ufunc, python_op, what)


def _fold_integer(values, segments, ufunc, python_op, what) -> pa.Array:
    arrow_type = values.type
    low, high = integer_bounds(arrow_type)
    data = numeric_values(values)
    shadow, has = segments.reduce(ufunc, data.astype(np.float64))
    if arrow_type == pa.uint64():
        risky = has.copy()  # int64 cannot hold every uint64: always exact
    else:
        risky = has & ~(np.abs(shadow) < _SAFE)  # also catches inf and NaN
    fast = data.astype(np.int64)
    result, _ = segments.reduce(ufunc, fast)
    exact: dict[int, int] = {}
    if risky.any():
        exact = _python_fold(data, segments, np.nonzero(risky)[0], python_op)
        for group, value in exact.items():
            if not low <= value <= high:
                raise AggregateOverflowError(
                    f"{what} overflows {arrow_type}: the result {value} is outside "
                    f"[{low}, {high}]. The whole write was rejected."
                )
    out = result.astype(object) if exact and arrow_type == pa.uint64() else result
    for group, value in exact.items():
        out[group] = value
    in_range = (out[has] >= low) & (out[has] <= high) if len(out) else np.ones(0, dtype=bool)
    if not np.all(in_range):
        bad = out[has][~in_range][0]
        raise AggregateOverflowError(
            f"{what} overflows {arrow_type}: the result {bad} is outside [{low}, {high}]. "
            "The whole write was rejected."
        )
    return with_nulls(np.asarray(out).astype(arrow_type.to_pandas_dtype()), has, arrow_type)


def _python_fold(data: np.ndarray, segments: Segments, groups, python_op) -> dict[int, int]:
    ordered = data[segments.order]
    exact = {}
    for g in groups:
        start, n = segments.starts[g], segments.lengths[g]
        acc = int(ordered[start])
        for v in ordered[start + 1 : start + n]:
            acc = python_op(acc, int(v))
        exact[int(g)] = acc
    return exact


def _fold_decimal(values: pa.Array, segments: Segments, op, what: str) -> pa.Array:
    arrow_type = values.type
    items = values.to_pylist()
    ordered = [items[i] for i in segments.order]
    limit = decimal.Decimal(10) ** (arrow_type.precision - arrow_type.scale)
    out: list[decimal.Decimal | None] = [None] * segments.count
    with decimal.localcontext() as ctx:
        for g in np.nonzero(segments.lengths)[0]:
            start, n = segments.starts[g], segments.lengths[g]
            # Exact intermediates: a product of n values needs n times the digits.
            ctx.prec = (int(n) + 2) * (arrow_type.precision + 2)
            acc = ordered[start]
            for v in ordered[start + 1 : start + n]:
                acc = op(acc, v)
            if abs(acc) >= limit:
                raise AggregateOverflowError(
                    f"{what} overflows {arrow_type}: the result {acc} needs more than "
                    f"{arrow_type.precision} digits. The whole write was rejected."
                )
            out[g] = acc
    return pa.array(out, type=arrow_type)

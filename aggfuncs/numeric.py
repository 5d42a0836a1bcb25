"""Exact arithmetic folds shared by sum, product and count, and the range rule they follow.

Range rule: an integer or decimal aggregate never leaves its column's type, not even for one
step: every running value, in write order, must fit. Judged step by step, the same rows are
accepted or rejected however they fall into writes (a rule on each write's folded result would
accept 127 + 1 - 1 in one int8 write and reject it row by row).

Integers: numpy int64 when a cheap per-group bound (the sum of |x|, or the product of
max(|x|, 1)) shows that no running value can leave the range; the other groups fold with Python
integers, checked at every step. Floats: a strict left fold in the column's own precision (IEEE,
so infinities and NaN are values). Decimals: Python's decimal module, exact, HALF_UP for
products, checked at every step.
"""

from __future__ import annotations

import decimal
from typing import Callable

import numpy as np
import pyarrow as pa

from aggfuncs.base import contributions, numeric_values, valid_mask, with_nulls
from aggfuncs.segments import Segments
from tally.errors import AggregateOverflowError

NUMERIC_TYPE_NAMES = "int8, int16, int32, int64, uint8, uint16, uint32, uint64, float32, float64, decimal"


def is_numeric(arrow_type: pa.DataType) -> bool:
    return (
        pa.types.is_integer(arrow_type)
        or pa.types.is_floating(arrow_type)
        or pa.types.is_decimal(arrow_type)
    )


def integer_bounds(arrow_type: pa.DataType) -> tuple[int, int]:
    info = np.iinfo(arrow_type.to_pandas_dtype())
    return int(info.min), int(info.max)


def decimal_limit(arrow_type: pa.DataType) -> decimal.Decimal:
    """The smallest magnitude a decimal column cannot hold."""
    return decimal.Decimal(10) ** (arrow_type.precision - arrow_type.scale)


def fits(value, arrow_type: pa.DataType) -> bool:
    """Whether an exact (integer or decimal) value fits the column's type."""
    if pa.types.is_integer(arrow_type):
        low, high = integer_bounds(arrow_type)
        return low <= value <= high
    if pa.types.is_decimal(arrow_type):
        return abs(value) < decimal_limit(arrow_type)
    return True


def overflow(what: str, arrow_type: pa.DataType, value) -> AggregateOverflowError:
    if pa.types.is_decimal(arrow_type):
        reason = f"needs more than {arrow_type.precision} digits"
    else:
        low, high = integer_bounds(arrow_type)
        reason = f"is outside [{low}, {high}]"
    return AggregateOverflowError(
        f"{what} overflows {arrow_type}: the running result {value} {reason}. "
        "Nothing of the write was applied to the bucket.")


def check_result(value, arrow_type: pa.DataType, what: str) -> None:
    """Raise AggregateOverflowError when an exact result does not fit the column's type."""
    if not fits(value, arrow_type):
        raise overflow(what, arrow_type, value)


def fold_numeric(
    states: pa.Array,
    written: np.ndarray,
    segments: Segments,
    ufunc: np.ufunc,
    python_op: Callable[[object, object], object],
    what: str,
    decimal_op: Callable[[decimal.Decimal, decimal.Decimal], decimal.Decimal] | None = None,
    result_type: pa.DataType | None = None,
) -> pa.Array:
    """Fold the written, non-null `states` per group (the null rule); null where a group has
    none.

    `what` names the function and column for error messages, e.g. "sum column 'qty'".
    `result_type` is the column's type when `states` are wider (retractions negated in int64).
    """
    values, segments = contributions(states, written, segments)
    arrow_type = result_type or values.type
    if pa.types.is_floating(arrow_type):
        data = numeric_values(values)
        result, has = segments.fold(ufunc, data)
        return with_nulls(result, has, arrow_type)
    if pa.types.is_decimal(arrow_type):
        return _fold_decimal(values, segments, decimal_op or python_op, what, arrow_type)
    return _fold_integer(values, segments, ufunc, python_op, what, arrow_type)


def _fold_integer(values, segments, ufunc, python_op, what, arrow_type) -> pa.Array:
    data = numeric_values(values)
    has = segments.lengths > 0
    if data.dtype == np.uint64:
        risky, out = has.copy(), np.zeros(segments.count, dtype=object)  # beyond int64: exact
    else:
        wide = data.astype(np.int64)
        low, high = integer_bounds(arrow_type)
        # A bound on every running value; float64 is exact below 2**53, and 2**62 leaves room
        # for its rounding on 64-bit columns.
        limit = float(high) if high < 2**53 else 2.0**62
        risky = has & ~(_running_bound(ufunc, wide, segments) <= limit)
        if low == 0 and len(wide):  # unsigned: retractions (negated) may go below zero
            lowest, _ = segments.reduce(np.minimum, wide)
            risky |= has & (lowest < 0)
        out, _ = segments.reduce(ufunc, wide)
        if risky.any():
            out = out.astype(object)
    for group, value in _python_fold(data, segments, np.nonzero(risky)[0], python_op, what,
                                     arrow_type).items():
        out[group] = value
    return with_nulls(np.asarray(out).astype(arrow_type.to_pandas_dtype()), has, arrow_type)


def _running_bound(ufunc, wide: np.ndarray, segments: Segments) -> np.ndarray:
    """Per group, a float64 bound on |running value|: sum of |x|, or product of max(|x|, 1)."""
    magnitude = np.abs(wide.astype(np.float64))
    with np.errstate(all="ignore"):
        if ufunc is np.multiply:
            logs, _ = segments.reduce(np.add, np.log2(np.maximum(magnitude, 1.0)))
            return np.exp2(logs)
        bound, _ = segments.reduce(np.add, magnitude)
        return bound


def _python_fold(data: np.ndarray, segments: Segments, groups, python_op, what,
                 arrow_type) -> dict[int, int]:
    ordered = data[segments.order]
    exact = {}
    for g in groups:
        start, n = segments.starts[g], segments.lengths[g]
        acc = int(ordered[start])
        check_result(acc, arrow_type, what)
        for v in ordered[start + 1 : start + n]:
            acc = python_op(acc, int(v))
            check_result(acc, arrow_type, what)
        exact[int(g)] = acc
    return exact


def _fold_decimal(values: pa.Array, segments: Segments, op, what: str, arrow_type) -> pa.Array:
    items = values.to_pylist()
    ordered = [items[i] for i in segments.order]
    limit = decimal_limit(arrow_type)
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
                    raise overflow(what, arrow_type, acc)
            out[g] = acc
    return pa.array(out, type=arrow_type)


def sum_run_breaks(values: pa.Array, runs: Segments, arrow_type: pa.DataType) -> np.ndarray:
    """Rows (input order) that must start a new run so that pre-folding each run of an exact
    sum, and then merging the run totals, is judged by the range rule exactly as the rows.

    A run folds exactly when its running sum stays between 0 and its total and the total fits
    the type: on top of any stored s, each of its steps then lies between s and s + total, the
    two values the tablet checks. Runs where that fails are cut greedily: rank by rank across
    all such runs at once in int64 (exact, as |running sums| stay below 2**62 there), long
    runs and the rest (decimals, uint64, huge values) one row at a time with Python numbers.
    """
    breaks = np.zeros(len(values), dtype=bool)
    has = runs.lengths > 0
    if pa.types.is_decimal(arrow_type) or arrow_type == pa.uint64():
        _cut_exactly(values.to_pylist(), runs, np.nonzero(has)[0], arrow_type, breaks)
        return breaks
    wide = numeric_values(values).astype(np.int64)
    low, high, total = runs.extremes(runs.running(wide))
    floor, ceiling = integer_bounds(arrow_type)
    ok = (high <= np.maximum(total, 0)) & (low >= np.minimum(total, 0))
    ok &= (total >= floor) & (total <= ceiling)
    bound, _ = runs.reduce(np.add, np.abs(wide.astype(np.float64)))
    small = bound < 2.0**62  # else the int64 running sums above may have wrapped
    suspects = has & ~(ok & small)
    ranked = np.nonzero(suspects & small & (runs.lengths <= _RANKED_RUN))[0]
    _cut_ranked(wide, runs, ranked, floor, ceiling, breaks)
    rest = np.nonzero(suspects & ~(small & (runs.lengths <= _RANKED_RUN)))[0]
    _cut_exactly(wide.tolist(), runs, rest, arrow_type, breaks)
    return breaks


# Runs up to this long are cut rank by rank with numpy; longer ones row by row in Python (a
# few very long runs would otherwise cost one numpy step per row).
_RANKED_RUN = 64


def _cut_ranked(wide: np.ndarray, runs: Segments, groups: np.ndarray, floor: int,
                ceiling: int, breaks: np.ndarray) -> None:
    """The greedy cut of `_cut_exactly`, for runs whose |running sums| stay below 2**62, on
    every run at once: step r handles the r-th row of each run still that long."""
    if not len(groups):
        return
    ordered = wide[runs.order]
    starts, lengths = runs.starts[groups], runs.lengths[groups]
    total = ordered[starts].copy()
    low, high = np.minimum(total, 0), np.maximum(total, 0)
    rank = 1
    live = lengths > rank
    while live.any():
        groups_at, where = np.nonzero(live)[0], starts[live] + rank
        x = ordered[where]
        t = total[groups_at] + x
        cut = (high[groups_at] > np.maximum(t, 0)) | (low[groups_at] < np.minimum(t, 0)) | \
            (t < floor) | (t > ceiling)
        breaks[runs.order[where[cut]]] = True
        t = np.where(cut, x, t)
        total[groups_at] = t
        low[groups_at] = np.minimum(np.where(cut, 0, low[groups_at]), t)
        high[groups_at] = np.maximum(np.where(cut, 0, high[groups_at]), t)
        rank += 1
        live = lengths > rank


def _cut_exactly(items: list, runs: Segments, groups, arrow_type: pa.DataType,
                 breaks: np.ndarray) -> None:
    """Cut each run of `groups` where its running sum, from the run's last cut, leaves the
    range between 0 and itself or does not fit the type (Python numbers: exact for decimals,
    uint64 and sums beyond int64)."""
    if pa.types.is_decimal(arrow_type):
        limit = decimal_limit(arrow_type)
        fits_type = lambda t: -limit < t < limit  # noqa: E731
        zero = decimal.Decimal(0)
    else:
        floor, ceiling = integer_bounds(arrow_type)
        fits_type = lambda t: floor <= t <= ceiling  # noqa: E731
        zero = 0
    with decimal.localcontext() as ctx:
        ctx.prec = 2 * 38 + 10  # decimal128 sums of a run, never rounded
        for g in groups:
            rows = runs.order[runs.starts[g]:runs.starts[g] + runs.lengths[g]].tolist()
            total = low = high = 0
            first = True
            for i in rows:
                x = items[i]
                if x is None:
                    x = zero
                t = total + x
                if not first and (high > max(t, 0) or low < min(t, 0) or not fits_type(t)):
                    breaks[i] = True
                    t, low, high = x, 0, 0
                first = False
                total, low, high = t, min(low, t), max(high, t)


def each_contribution_breaks(values: pa.Array) -> np.ndarray:
    """Every non-null row starts a run: for folds that round (floats, decimal products) or
    whose steps the range rule cannot bound from a partial product, no two contributions are
    pre-folded together."""
    return valid_mask(values)

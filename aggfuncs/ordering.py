"""Total orders for max and min: per group, which input wins.

Floats use a total order (NaN above +inf, -0.0 below 0.0), so the answer never depends on
which side of a comparison a NaN falls; strings compare by code point (UTF-8 bytes), binary by
bytes. Ties keep the earliest input, so an unchanged extreme leaves the stored state untouched.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

import pyarrow.compute as pc

from aggfuncs import stored_folds
from aggfuncs.base import stored_contributions, take_clamped, valid_mask
from aggfuncs.fixed_width import (array_of, numpy_dtype, stored_cells, validity_of,
                                  values_of)
from aggfuncs.segments import Segments


def is_orderable(arrow_type: pa.DataType) -> bool:
    t = pa.types
    return (
        t.is_integer(arrow_type)
        or t.is_floating(arrow_type)
        or t.is_decimal(arrow_type)
        or t.is_string(arrow_type)
        or t.is_large_string(arrow_type)
        or t.is_binary(arrow_type)
        or t.is_large_binary(arrow_type)
        or t.is_date(arrow_type)
        or t.is_time(arrow_type)
        or t.is_timestamp(arrow_type)
    )


ORDERABLE_TYPE_NAMES = (
    "integers, float32, float64, decimal, string, binary, date, time, timestamp"
)


def float_sort_key(values: pa.Array) -> pa.Array:
    """int64 keys whose order is the IEEE total order of the floats (NaN made positive)."""
    data = values.to_numpy(zero_copy_only=False).astype(np.float64)
    data = np.where(np.isnan(data), np.nan, data)
    bits = data.view(np.int64)
    return pa.array(bits ^ ((bits >> 63) & np.int64(0x7FFFFFFFFFFFFFFF)))


def _numeric_key(values: pa.Array) -> np.ndarray | None:
    """int64 keys in the values' order, for numbers numpy can compare exactly; else None."""
    t = values.type
    if pa.types.is_floating(t):
        return float_sort_key(values).to_numpy()
    if pa.types.is_date(t) or pa.types.is_time(t) or pa.types.is_timestamp(t):
        values = values.view(pa.int32() if t.bit_width == 32 else pa.int64())  # same buffers
    elif not pa.types.is_integer(values.type) or t == pa.uint64():
        return None
    if values.null_count:
        values = values.fill_null(pa.scalar(0, values.type))
    return values.to_numpy(zero_copy_only=False).astype(np.int64)


def pick_extreme(
    states: pa.Array, written: np.ndarray, segments: Segments, largest: bool,
    keys: np.ndarray | None = None
) -> np.ndarray:
    """Per group, the input index of its largest (or smallest) written non-null value, or -1.
    Ties go to the earliest input. `keys`: the states' numeric keys, when the caller has them
    (a float column's cost a pass over the values)."""
    keep = written & valid_mask(states)
    if keys is None:
        keys = _numeric_key(states)
    if keys is not None:
        # numpy: the extreme key per group, then the first eligible row holding it.
        bound = np.iinfo(np.int64).min if largest else np.iinfo(np.int64).max
        masked = np.where(keep, keys, bound)
        best, _ = segments.reduce(np.maximum if largest else np.minimum, masked)
        winners = keep & (masked == best[segments.group_ids])
        return segments.pick(winners, last=False)
    index = np.nonzero(keep)[0]
    sub = segments.filtered(keep)
    values = states.take(pa.array(index, type=pa.int64()))
    if pa.types.is_floating(values.type):
        values = float_sort_key(values)
    table = pa.table({"g": pa.array(sub.group_ids), "v": values, "i": pa.array(index)})
    ordered = table.sort_by([("g", "ascending"), ("v", "descending" if largest else "ascending")])
    winners = ordered.column("i").to_numpy()
    picked = np.full(segments.count, -1, dtype=np.int64)
    nonempty = sub.lengths > 0
    picked[nonempty] = winners[sub.starts[nonempty]]
    return picked


def extreme_onto(stored: pa.Array, stored_written: np.ndarray, states: pa.Array,
                 segments: Segments, largest: bool) -> pa.Array | None:
    """Aggregator.fold_onto for max and min: the inputs' extreme per group against the stored
    cell, which wins ties (it came first). Fixed-width numbers in one compiled pass
    (aggfuncs.stored_folds); other numbers, dates and times with numpy keys; None for other
    types."""
    dtype = numpy_dtype(states.type)
    if dtype is not None and stored.type == states.type:
        best, held = stored_cells(stored, stored_written, dtype)
        stored_folds.extreme_onto(best, held, values_of(states, dtype), validity_of(states),
                                  np.ascontiguousarray(segments.group_ids), largest)
        return array_of(best, held, stored.type)
    keys = _numeric_key(states)
    if keys is None:
        return None
    base = stored_contributions(stored, stored_written)
    picked = pick_extreme(states, np.ones(len(states), dtype=bool), segments, largest, keys)
    found = picked >= 0
    candidate = keys[np.maximum(picked, 0)]
    held = _numeric_key(base)
    better = candidate > held if largest else candidate < held
    use_input = found & (~valid_mask(base) | better)
    return pc.if_else(pa.array(use_input), take_clamped(states, picked), base)

"""Total orders for max and min: per group, which input wins.

Floats use a total order (NaN above +inf, -0.0 below 0.0), so the answer never depends on
which side of a comparison a NaN falls; strings compare by code point (UTF-8 bytes), binary by
bytes. Ties keep the earliest input, so an unchanged extreme leaves the stored state untouched.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from aggfuncs.base import valid_mask
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


def pick_extreme(
    states: pa.Array, written: np.ndarray, segments: Segments, largest: bool
) -> np.ndarray:
    """Per group, the input index of its largest (or smallest) written non-null value, or -1."""
    keep = written & valid_mask(states)
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

"""Arrow arrays of fixed-width values as numpy views, and numpy values back as Arrow arrays.

The compiled folds onto stored cells (aggfuncs.stored_folds) read a column's values in place
and write a new array of them: integers, floats, dates, times and timestamps are all numbers
of one width in one buffer, so one numpy view serves each. Other types (decimals, booleans,
strings, float16) have no such view and keep the Arrow path.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from aggfuncs.base import valid_mask


def numpy_dtype(arrow_type: pa.DataType) -> np.dtype | None:
    """The numpy type of one value of `arrow_type` as stored, or None without one."""
    t = pa.types
    if t.is_floating(arrow_type):
        return None if arrow_type.bit_width == 16 else np.dtype(f"float{arrow_type.bit_width}")
    if t.is_unsigned_integer(arrow_type):
        return np.dtype(f"uint{arrow_type.bit_width}")
    if t.is_integer(arrow_type) or t.is_date(arrow_type) or t.is_time(arrow_type) \
            or t.is_timestamp(arrow_type) or t.is_duration(arrow_type):
        return np.dtype(f"int{arrow_type.bit_width}")
    return None


def values_of(array: pa.Array, dtype: np.dtype) -> np.ndarray:
    """The array's values as a read-only numpy view (a null's slot holds anything)."""
    data = array.buffers()[1]
    if data is None:  # an array of nulls only may have no values at all
        return np.zeros(len(array), dtype=dtype)
    return np.frombuffer(data, dtype=dtype)[array.offset:array.offset + len(array)]


def validity_of(array: pa.Array, written: np.ndarray | None = None) -> np.ndarray:
    """Which entries a fold reads, as uint8: valid ones (and, given `written`, written ones:
    an unwritten stored cell holds nothing)."""
    valid = valid_mask(array)
    if written is not None:
        valid = valid & written
    return np.ascontiguousarray(valid).view(np.uint8)


def stored_cells(stored: pa.Array, written: np.ndarray, dtype: np.dtype
                 ) -> tuple[np.ndarray, np.ndarray]:
    """The stored cells a fold starts from, as new arrays it may change in place: their values
    and whether each holds one (valid and written), as uint8."""
    return values_of(stored, dtype).copy(), validity_of(stored, written).copy()


def array_of(values: np.ndarray, valid: np.ndarray, arrow_type: pa.DataType) -> pa.Array:
    """`values` (numpy, of numpy_dtype(arrow_type)) as an Arrow array, null where `valid`
    (uint8 or bool) is false."""
    valid = valid.view(bool)
    bitmap = None if valid.all() else pa.py_buffer(np.packbits(valid, bitorder="little"))
    return pa.Array.from_buffers(arrow_type, len(values), [bitmap, pa.py_buffer(values)])

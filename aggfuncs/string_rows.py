"""Strings taken from several Arrow arrays into one array, each string's bytes copied once
(the native loop of aggfuncs.string_gather): the row buffer, the changelog's images and the
folds onto stored cells all pick strings from more than one array."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from aggfuncs.string_gather import gather_strings


def is_string(arrow_type: pa.DataType) -> bool:
    """Whether take_rows gathers arrays of this type (strings; Arrow takes the rest)."""
    return pa.types.is_string(arrow_type) or pa.types.is_large_string(arrow_type)


def take_rows(arrays: list[pa.Array], source: np.ndarray | None, rows: np.ndarray,
              arrow_type: pa.DataType) -> pa.Array:
    """The strings at row `rows[i]` of array `source[i]` (all of the first array when None),
    one array of `arrow_type`: each string's bytes copied once (aggfuncs.string_gather),
    where Arrow's take of long strings cost twice as much and a take from two arrays needed
    them joined first."""
    large = pa.types.is_large_string(arrow_type)
    width = np.int64 if large else np.int32
    offsets, data, valid = [], [], []
    for array in arrays:
        bitmap, given, bytes_ = array.buffers()
        offsets.append(np.zeros(len(array) + 1, dtype=width) if given is None else
                       np.frombuffer(given, dtype=width)[array.offset:array.offset + len(array) + 1])
        data.append(np.zeros(1, dtype=np.uint8) if bytes_ is None or not bytes_.size else
                    np.frombuffer(bytes_, dtype=np.uint8))
        valid.append(np.frombuffer(bitmap, dtype=np.uint8)
                     if bitmap is not None and array.null_count else None)
    if source is None:
        source = np.zeros(len(rows), dtype=np.int64)
    at, joined, found = gather_strings(
        offsets, data, valid, [array.offset for array in arrays],
        [len(array) for array in arrays], source, rows)
    validity = None if found.all() else \
        pa.py_buffer(np.packbits(found, bitorder="little"))
    if not large and at[-1] > np.iinfo(np.int32).max:  # Arrow refuses it, as its take did
        return pa.Array.from_buffers(pa.large_string(), len(rows),
                                     [validity, pa.py_buffer(at), pa.py_buffer(joined)]
                                     ).cast(arrow_type)
    return pa.Array.from_buffers(pa.large_string() if large else pa.string(), len(rows),
                                 [validity, pa.py_buffer(at if large else at.astype(np.int32)),
                                  pa.py_buffer(joined)])

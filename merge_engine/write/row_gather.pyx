# cython: language_level=3, boundscheck=False, wraparound=False, initializedcheck=False
"""Fixed-width rows gathered from several matrices into one, each row copied once.

Why native code: a row's bookkeeping (its written bits, its contribution counts) is a row of
a small matrix, and a put of repeated keys gathers those rows from the row buffer's runs for
its current rows, the buffer's compaction and the changelog's images. numpy moves a row either
element by element (fancy assignment) or as an opaque item of a generic copy loop, and with
rows from several matrices it needs them joined or sorted by matrix first; this loop reads
each row where it is.
"""

import numpy as np

from libc.stdint cimport int64_t, uint8_t
from libc.string cimport memcpy


cdef int _copy_rows(const uint8_t** data, const int64_t* lengths, Py_ssize_t count,
                    Py_ssize_t width, const int64_t[::1] source, const int64_t[::1] row,
                    uint8_t* out) noexcept nogil:
    """Every (source, row) checked first, then the rows copied: -1, and nothing written, if
    one is outside its matrix."""
    cdef Py_ssize_t i, n = source.shape[0]
    cdef int64_t s, r
    for i in range(n):
        s = source[i]
        r = row[i]
        if s < 0 or s >= count or r < 0 or r >= lengths[s]:
            return -1
    for i in range(n):
        memcpy(out + i * width, data[source[i]] + row[i] * width, width)
    return 0


def gather_rows(list matrices, source, row):
    """The rows (`source`[i], `row`[i]) of the given 2-D matrices, as one matrix of their
    dtype and width (all alike); IndexError, before anything is copied, for a row outside its
    matrix."""
    cdef Py_ssize_t count = len(matrices), s
    if count == 0:
        raise ValueError("gather_rows: no matrices")
    first = matrices[0]
    dtype, columns = first.dtype, first.shape[1]
    held = []  # C-contiguous byte views, kept alive while the loop reads them
    addresses = np.zeros(count, dtype=np.uintp)
    sizes = np.zeros(count, dtype=np.int64)
    for s in range(count):
        matrix = matrices[s]
        if matrix.ndim != 2 or matrix.dtype != dtype or matrix.shape[1] != columns:
            raise ValueError("gather_rows: the matrices differ in dtype or width")
        matrix = np.ascontiguousarray(matrix)
        held.append(matrix)
        addresses[s] = matrix.ctypes.data
        sizes[s] = matrix.shape[0]
    source_array = np.ascontiguousarray(source, dtype=np.int64)
    row_array = np.ascontiguousarray(row, dtype=np.int64)
    if source_array.shape != row_array.shape or source_array.ndim != 1:
        raise ValueError("gather_rows: source and row differ in length")
    cdef const int64_t[::1] sources = source_array
    cdef const int64_t[::1] rows = row_array
    cdef Py_ssize_t n = rows.shape[0], width = columns * dtype.itemsize
    out = np.empty((n, columns), dtype=dtype)
    if n == 0:
        return out
    if width == 0:  # nothing to copy, but the rows must still exist
        inside = (source_array >= 0) & (source_array < count)
        if not inside.all() or ((row_array < 0) | (row_array >= sizes[source_array])).any():
            raise IndexError("gather_rows: a row outside its matrix")
        return out
    cdef const uint8_t** data = <const uint8_t**> <size_t> addresses.ctypes.data
    cdef const int64_t[::1] lengths = sizes
    cdef uint8_t[:, ::1] target = out.view(np.uint8).reshape(n, width)
    cdef int outside
    with nogil:
        outside = _copy_rows(data, &lengths[0], count, width, sources, rows, &target[0, 0])
    if outside:
        raise IndexError("gather_rows: a row outside its matrix")
    return out

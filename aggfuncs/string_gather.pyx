# cython: language_level=3, boundscheck=False, wraparound=False, initializedcheck=False
"""Strings gathered from several Arrow arrays into one, each string's bytes copied once.

Why native code: a put of repeated keys gathers the same growing strings (string_agg's joined
cells) again and again: its current rows out of the row buffer's runs, the changelog's before
and after images, the buffer's compaction. Arrow's take of a string array (and of a chunked
one) cost twice this loop on such strings, and the images joined the two sides first.
"""

import numpy as np

from libc.stdint cimport int32_t, int64_t, uint8_t
from libc.string cimport memcpy

ctypedef fused offset_t:
    int32_t
    int64_t


cdef int _sizes(const offset_t** offsets, const uint8_t** valid, const int64_t* bit,
                const int64_t* length, Py_ssize_t count, const int64_t[::1] source,
                const int64_t[::1] row, int64_t* start, int64_t* at,
                uint8_t* valid_out) noexcept nogil:
    """Each string's start in its array's bytes and its place in the output, and whether it
    is valid; -1 for a row outside its array or an array that is not there (nothing is read
    there)."""
    cdef Py_ssize_t i
    cdef int64_t s, r, b
    cdef const offset_t* o
    at[0] = 0
    for i in range(source.shape[0]):
        s = source[i]
        r = row[i]
        if s < 0 or s >= count or r < 0 or r >= length[s]:
            return -1
        o = offsets[s]
        start[i] = o[r]
        at[i + 1] = at[i] + o[r + 1] - o[r]
        if valid[s] != NULL:
            b = bit[s] + r
            valid_out[i] = (valid[s][b >> 3] >> (b & 7)) & 1
        else:
            valid_out[i] = 1
    return 0


cdef void _copy(const uint8_t** data, const int64_t[::1] source, const int64_t* start,
                const int64_t* at, uint8_t* out) noexcept nogil:
    cdef Py_ssize_t i, k, n
    cdef const uint8_t* begin
    cdef uint8_t* to
    for i in range(source.shape[0]):
        n = at[i + 1] - at[i]
        begin = data[source[i]] + start[i]
        to = out + at[i]
        if n > 16:
            memcpy(to, begin, n)
        else:  # most strings are short: a byte loop beats a call
            for k in range(n):
                to[k] = begin[k]


cdef _gather(list offsets, list data, list valid, const int64_t[::1] bits,
             const int64_t[::1] lengths, const int64_t[::1] source, const int64_t[::1] row,
             offset_t kind):  # `kind` only picks the offsets' width
    cdef Py_ssize_t count = len(offsets), s, n = source.shape[0]
    # the arrays' addresses, read by the loops without the GIL (the lists keep the arrays)
    offset_held = np.zeros(count, dtype=np.uintp)
    data_held = np.zeros(count, dtype=np.uintp)
    valid_held = np.zeros(count, dtype=np.uintp)
    for s in range(count):
        if len(offsets[s]) != lengths[s] + 1 or \
                (lengths[s] and offsets[s][lengths[s]] > len(data[s])):
            raise ValueError("gather_strings: an array's offsets disagree with its rows or bytes")
        offset_held[s] = offsets[s].ctypes.data
        data_held[s] = data[s].ctypes.data
        if valid[s] is not None:
            valid_held[s] = valid[s].ctypes.data
    cdef const offset_t** offset_at = <const offset_t**> <size_t> offset_held.ctypes.data
    cdef const uint8_t** data_at = <const uint8_t**> <size_t> data_held.ctypes.data
    cdef const uint8_t** valid_at = <const uint8_t**> <size_t> valid_held.ctypes.data
    start = np.empty(max(n, 1), dtype=np.int64)
    at = np.empty(n + 1, dtype=np.int64)
    is_valid = np.empty(max(n, 1), dtype=np.uint8)
    cdef int64_t[::1] start_view = start
    cdef int64_t[::1] at_view = at
    cdef uint8_t[::1] valid_view = is_valid
    cdef int outside
    with nogil:
        outside = _sizes(offset_at, valid_at, &bits[0], &lengths[0], count, source, row,
                         &start_view[0], &at_view[0], &valid_view[0])
    if outside:
        raise IndexError("gather_strings: a row outside its array")
    out = np.empty(max(int(at[n]), 1), dtype=np.uint8)
    cdef uint8_t[::1] out_view = out
    with nogil:
        _copy(data_at, source, &start_view[0], &at_view[0], &out_view[0])
    return at, out[:int(at[n])], is_valid[:n].view(bool)


def gather_strings(list offsets, list data, list valid, bits, lengths, source, row):
    """The strings at (`source`[i], `row`[i]) of the given arrays: (int64 offsets, their
    bytes, whether each is valid).

    Per array: its offsets from the first of its slice (all int32 or all int64), its bytes
    (uint8, at least one byte long), its validity bitmap as uint8 (None: no nulls) with the
    bit of its slice's first row (`bits`), and its length (`lengths`). `source` and `row` are
    int64; a row outside its array raises IndexError."""
    cdef int32_t narrow = 0
    cdef int64_t wide = 0
    cdef const int64_t[::1] sources = np.ascontiguousarray(source, dtype=np.int64)
    cdef const int64_t[::1] rows = np.ascontiguousarray(row, dtype=np.int64)
    cdef const int64_t[::1] first_bits = np.ascontiguousarray(bits, dtype=np.int64)
    cdef const int64_t[::1] sizes = np.ascontiguousarray(lengths, dtype=np.int64)
    if offsets[0].dtype == np.int32:
        return _gather(offsets, data, valid, first_bits, sizes, sources, rows, narrow)
    return _gather(offsets, data, valid, first_bits, sizes, sources, rows, wide)

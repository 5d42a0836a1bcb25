# cython: language_level=3, boundscheck=False, wraparound=False, initializedcheck=False
"""Per group, the strings of its rows joined with a delimiter, in one pass over the bytes.

Why native code: string_agg's fold through Arrow kernels (take the rows in grouped order, a list
array, binary_join, then joining that onto the stored string and a coalesce) copied every
string three or four times and was most of what a put of repeated keys spent merging. Here the
joined length of each group is summed first, then every contributing string is copied once
into its group's place, rows visited in their order (a group's rows keep their input order,
so no sort is needed).
"""

import numpy as np

from libc.stdint cimport int32_t, int64_t, uint8_t
from libc.string cimport memcpy

ctypedef fused offset_t:
    int32_t
    int64_t


cdef int _sizes(const offset_t[::1] offsets, const uint8_t[::1] keep,
                const int64_t[::1] groups, Py_ssize_t count, int64_t[::1] size,
                int64_t[::1] members) noexcept nogil:
    """Each group's bytes and strings; -1 for a group outside 0..count-1 (nothing is
    written there)."""
    cdef Py_ssize_t i
    for i in range(groups.shape[0]):
        if groups[i] < 0 or groups[i] >= count:
            return -1
        if keep[i]:
            size[groups[i]] += offsets[i + 1] - offsets[i]
            members[groups[i]] += 1
    return 0


cdef void _copy(const offset_t[::1] offsets, const uint8_t* data, const uint8_t[::1] keep,
                const int64_t[::1] groups, uint8_t[::1] begun, int64_t[::1] cursor,
                const uint8_t* delimiter, Py_ssize_t width, uint8_t* out) noexcept nogil:
    cdef Py_ssize_t i, g, n, k, at
    for i in range(groups.shape[0]):
        if not keep[i]:
            continue
        g = groups[i]
        at = cursor[g]
        if begun[g]:  # not the group's first string: a delimiter before it
            for k in range(width):
                out[at + k] = delimiter[k]
            at += width
        begun[g] = 1
        n = offsets[i + 1] - offsets[i]
        if n > 16:
            memcpy(out + at, data + offsets[i], n)
        else:  # most strings are short: a byte loop beats a call
            for k in range(n):
                out[at + k] = data[offsets[i] + k]
        cursor[g] = at + n


def join_groups(list sources, Py_ssize_t count, bytes delimiter):
    """Per group 0..count-1, its strings joined with `delimiter`.

    `sources`: (offsets, data, keep, groups) per source of strings, each an Arrow string
    array's offsets (int32 or int64, already shifted to the array's slice) and data bytes, a
    uint8 flag per string (0: it does not contribute) and its group (int64). Sources are
    visited in the given order and each source's strings in theirs.
    Returns (int64 offsets of the joined strings, their bytes, whether each group has any).
    """
    cdef int64_t[::1] size = np.zeros(count, dtype=np.int64)
    cdef int64_t[::1] members = np.zeros(count, dtype=np.int64)
    cdef int outside
    for offsets, data, keep, groups in sources:
        if not len(offsets) == len(keep) + 1 == len(groups) + 1:
            raise ValueError("join_groups: a source's offsets, flags and groups disagree")
        if len(offsets) and (offsets[0] < 0 or offsets[len(offsets) - 1] > len(data)):
            raise ValueError("join_groups: a source's offsets point past its bytes")
        if offsets.dtype == np.int32:
            outside = _sizes[int32_t](offsets, keep, groups, count, size, members)
        else:
            outside = _sizes[int64_t](offsets, keep, groups, count, size, members)
        if outside:
            raise IndexError("join_groups: a group outside 0..count-1")
    found = np.asarray(members)
    total = np.asarray(size) + np.maximum(found - 1, 0) * len(delimiter)
    joined = np.zeros(count + 1, dtype=np.int64)
    np.cumsum(total, out=joined[1:])
    out = np.empty(max(int(joined[count]), 1), dtype=np.uint8)
    cdef int64_t[::1] cursor = joined[:-1].copy()
    cdef uint8_t[::1] begun = np.zeros(count, dtype=np.uint8)
    cdef uint8_t[::1] out_view = out
    cdef const uint8_t[::1] delimiter_view = delimiter
    cdef const uint8_t[::1] data_view
    for offsets, data, keep, groups in sources:
        data_view = data if len(data) else b"\0"
        if offsets.dtype == np.int32:
            _copy[int32_t](offsets, &data_view[0], keep, groups, begun, cursor,
                           &delimiter_view[0], len(delimiter), &out_view[0])
        else:
            _copy[int64_t](offsets, &data_view[0], keep, groups, begun, cursor,
                           &delimiter_view[0], len(delimiter), &out_view[0])
    return joined, out[:int(joined[count])], found > 0

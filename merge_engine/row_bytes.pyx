# cython: language_level=3, boundscheck=False, wraparound=False, initializedcheck=False
"""Stored rows as bytes objects: each row's fixed-width head, then its variable-width values.

Why native code: a flush hands RocksDB a bytes object per row. Arrow joined the heads and the
values into one binary array (`binary_join_element_wise`) and numpy then made a bytes object
per row from it (`to_numpy`): 36 ms per 262,144 rows of the ingest benchmark, a tenth of a
flush. This loop sizes each row, makes its bytes object and copies its parts into it once.
"""

import numpy as np

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize
from libc.stdint cimport int64_t, uint8_t
from libc.string cimport memcpy


def join_rows(heads, parts):
    """A list of bytes: row i is heads[i] (a uint8 matrix row) followed by the i-th value of
    each part (large_binary Arrow arrays of len(heads) values; a null is empty)."""
    heads = np.ascontiguousarray(heads, dtype=np.uint8)
    n = heads.shape[0]
    offsets = np.zeros((len(parts), n + 1), dtype=np.int64)
    datas = []
    base = 0
    for j, part in enumerate(parts):
        if len(part) != n:
            raise ValueError(f"part {j} has {len(part)} values for {n} rows")
        buffers = part.buffers()
        part_offsets = np.frombuffer(buffers[1], dtype=np.int64)[part.offset:part.offset + n + 1]
        data = np.frombuffer(buffers[2], dtype=np.uint8) if buffers[2] is not None \
            else np.zeros(0, dtype=np.uint8)
        if len(part_offsets) != n + 1 or (n and (part_offsets[0] < 0 or part_offsets[n] > len(data)
                                                  or (np.diff(part_offsets) < 0).any())):
            raise ValueError(f"part {j} has offsets outside its data")
        offsets[j] = part_offsets - part_offsets[0] + base
        data = data[part_offsets[0]:part_offsets[n]] if n else data[:0]
        datas.append(data)
        base += len(data)  # (no datas[-1]: this module does not wrap negative indices)
    joined = np.concatenate(datas) if datas else np.zeros(0, dtype=np.uint8)
    return _join(heads, offsets, joined)


cdef list _join(const uint8_t[:, ::1] heads, const int64_t[:, ::1] offsets,
                const uint8_t[::1] data):
    cdef Py_ssize_t n = heads.shape[0], width = heads.shape[1], count = offsets.shape[0]
    cdef Py_ssize_t i, j, size, at, length
    cdef list rows = [None] * n
    cdef bytes row
    cdef char* out
    for i in range(n):
        size = width
        for j in range(count):
            size += offsets[j, i + 1] - offsets[j, i]
        row = PyBytes_FromStringAndSize(NULL, size)
        out = PyBytes_AS_STRING(row)
        if width:
            memcpy(out, &heads[i, 0], width)
        at = width
        for j in range(count):
            length = offsets[j, i + 1] - offsets[j, i]
            if length:
                memcpy(out + at, &data[offsets[j, i]], length)
            at += length
        rows[i] = row
    return rows

# cython: language_level=3, boundscheck=False, wraparound=False, initializedcheck=False
"""Stored rows (and RocksDB keys) as bytes objects: each row's fixed-width blocks, then its
variable-width values.

Why native code: a flush hands RocksDB a bytes object per row. Arrow joined the heads and the
values into one binary array (`binary_join_element_wise`) and numpy then made a bytes object
per row from it (`to_numpy`): 36 ms per 262,144 rows of the ingest benchmark, a tenth of a
flush. This loop sizes each row, makes its bytes object and copies its parts into it once.
The head comes as its blocks (the format's header, bitmaps, fixed-width values, lengths):
numpy's hstack of them into one matrix first cost a quarter of the loop again, copying a few
bytes at a time.
"""

import numpy as np

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize
from libc.stdint cimport int64_t, uint8_t
from libc.string cimport memcpy


def join_rows(blocks, parts, rows=None):
    """A list of `rows` bytes (by default as many as the first block has rows): row i is row i
    of each block (uint8 matrices of a row per row, or of one row that every row repeats, such
    as a key prefix), then the i-th value of each part (large_binary Arrow arrays of a value
    per row; a null is empty). A block or part of another length is refused before any row
    is made."""
    if isinstance(blocks, np.ndarray):
        blocks = [blocks]
    blocks = [np.ascontiguousarray(b, dtype=np.uint8) for b in blocks]
    n = int(rows) if rows is not None else len(blocks[0]) if blocks else 0
    for k, b in enumerate(blocks):
        if b.ndim != 2 or (len(b) != n and len(b) != 1):
            raise ValueError(f"block {k} has {len(b)} rows for {n} rows")
    count = len(parts)
    offsets = np.zeros((count, n + 1), dtype=np.int64)
    data_at = np.zeros(max(count, 1), dtype=np.uintp)
    datas = []
    for j, part in enumerate(parts):
        if len(part) != n:
            raise ValueError(f"part {j} has {len(part)} values for {n} rows")
        buffers = part.buffers()
        part_offsets = np.frombuffer(buffers[1], dtype=np.int64)[part.offset:part.offset + n + 1]
        data = np.frombuffer(buffers[2], dtype=np.uint8) if buffers[2] is not None \
            else np.zeros(1, dtype=np.uint8)
        if len(part_offsets) != n + 1 or (n and (part_offsets[0] < 0 or part_offsets[n] > len(data)
                                                  or (np.diff(part_offsets) < 0).any())):
            raise ValueError(f"part {j} has offsets outside its data")
        if not len(data):
            data = np.zeros(1, dtype=np.uint8)
        offsets[j] = part_offsets
        datas.append(data)  # held while the loop reads it
        data_at[j] = data.ctypes.data
    block_at = np.array([b.ctypes.data for b in blocks] or [0], dtype=np.uintp)
    widths = np.array([b.shape[1] for b in blocks] or [0], dtype=np.int64)
    strides = np.array([0 if len(b) == 1 and n != 1 else b.shape[1] for b in blocks] or [0],
                       dtype=np.int64)
    return _join(n, len(blocks), block_at, widths, strides, count, data_at, offsets)


cdef list _join(Py_ssize_t n, Py_ssize_t nblocks, const size_t[::1] block_at,
                const int64_t[::1] widths, const int64_t[::1] strides, Py_ssize_t count,
                const size_t[::1] data_at, const int64_t[:, ::1] offsets):
    cdef Py_ssize_t i, j, k, size, at, length, head = 0
    cdef list rows = [None] * n
    cdef bytes row
    cdef char* out
    cdef const uint8_t* src
    for k in range(nblocks):
        head += widths[k]
    for i in range(n):
        size = head
        for j in range(count):
            size += offsets[j, i + 1] - offsets[j, i]
        row = PyBytes_FromStringAndSize(NULL, size)
        out = PyBytes_AS_STRING(row)
        at = 0
        for k in range(nblocks):
            length = widths[k]
            src = (<const uint8_t*> block_at[k]) + i * strides[k]
            if length > 8:
                memcpy(out + at, src, length)
            else:  # the bitmaps and most values are a few bytes: a byte loop beats a call
                for j in range(length):
                    out[at + j] = src[j]
            at += length
        for j in range(count):
            length = offsets[j, i + 1] - offsets[j, i]
            if length:
                memcpy(out + at, (<const uint8_t*> data_at[j]) + offsets[j, i], length)
            at += length
        rows[i] = row
    return rows

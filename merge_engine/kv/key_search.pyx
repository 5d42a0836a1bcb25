# cython: language_level=3, boundscheck=False, wraparound=False, initializedcheck=False
"""Where keys of up to 8 bytes (as uint64) fall in a bucket's sorted index of them.

Why native code: a put looks its keys up in the row buffer's sorted index, then merges the
changed ones into it, and numpy's searchsorted runs a full binary search per key: about
20 cache-missing steps each over an index of 100,000 keys, a twentieth of a put of repeated
keys. A put's keys come sorted, so each search here starts where the one before ended and
gallops forward (steps of 1, 2, 4, ...), which costs a few steps per key; keys out of order
still get a whole binary search each, so any order gives numpy's answer.
"""

import numpy as np

from libc.stdint cimport int64_t, uint64_t


cdef inline Py_ssize_t _first_not_below(const uint64_t[::1] index, Py_ssize_t lo,
                                        Py_ssize_t hi, uint64_t key) noexcept nogil:
    """The first position in [lo, hi) whose key is >= `key`, or hi."""
    cdef Py_ssize_t middle
    while lo < hi:
        middle = lo + (hi - lo) // 2
        if index[middle] < key:
            lo = middle + 1
        else:
            hi = middle
    return lo


cdef void _search(const uint64_t[::1] index, const uint64_t[::1] keys,
                  int64_t[::1] out) noexcept nogil:
    cdef Py_ssize_t i, n = index.shape[0], lo, hi, step, at = 0
    cdef uint64_t key, previous = 0
    for i in range(keys.shape[0]):
        key = keys[i]
        if i == 0 or key < previous:
            at = _first_not_below(index, 0, n, key)
        else:  # at or after the previous key's position: gallop there first
            lo = at
            hi = at
            step = 1
            while hi < n and index[hi] < key:
                lo = hi + 1
                hi = lo + step
                step <<= 1
            at = _first_not_below(index, lo, hi if hi < n else n, key)
        out[i] = at
        previous = key


def search_sorted(index, keys):
    """numpy.searchsorted(index, keys) (side "left") for a sorted uint64 `index` and uint64
    `keys` in any order, fastest when they are sorted too."""
    if np.asarray(index).dtype != np.uint64 or np.asarray(keys).dtype != np.uint64:
        raise TypeError("search_sorted: index and keys must be uint64")
    index_array = np.ascontiguousarray(index)
    key_array = np.ascontiguousarray(keys)
    if index_array.ndim != 1 or key_array.ndim != 1:
        raise ValueError("search_sorted: index and keys must be 1-D")
    out = np.empty(len(key_array), dtype=np.int64)
    cdef const uint64_t[::1] sorted_index = index_array
    cdef const uint64_t[::1] wanted = key_array
    cdef int64_t[::1] positions = out
    with nogil:
        _search(sorted_index, wanted, positions)
    return out

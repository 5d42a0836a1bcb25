# cython: language_level=3, boundscheck=False, wraparound=False, initializedcheck=False
"""A write's keys of up to 8 bytes grouped: one stable radix sort of the uint64 keys.

Why native code: grouping a 100,000-row put's keys took numpy's argsort (it has no radix sort
for 64-bit values, and its argsort is several times slower than its sort), then a gather, a
cumsum and a reduceat for each group's first row: a tenth of the put. A least-significant-
digit radix sort is stable, so each group's first position in sorted order already holds its
least row number, and one more pass numbers the groups.
"""

import numpy as np

from libc.stdint cimport int64_t, uint64_t
from libc.string cimport memset

cdef enum:
    DIGIT_BITS = 11
    BUCKETS = 2048  # 1 << DIGIT_BITS: a histogram of them stays in the L1 cache
    DIGITS = 6  # ceil(64 / DIGIT_BITS)


cdef void _count(const uint64_t[::1] keys, int64_t* counts) noexcept nogil:
    """Every digit's histogram, in one pass over the keys."""
    cdef Py_ssize_t i
    cdef int d
    cdef uint64_t k
    memset(counts, 0, DIGITS * BUCKETS * sizeof(int64_t))
    for i in range(keys.shape[0]):
        k = keys[i]
        for d in range(DIGITS):
            counts[d * BUCKETS + ((k >> (d * DIGIT_BITS)) & (BUCKETS - 1))] += 1


cdef void _scatter(const uint64_t* keys, const int64_t* rows, uint64_t* to_keys,
                   int64_t* to_rows, Py_ssize_t n, int shift, int64_t* at) noexcept nogil:
    """One stable pass: each key (and its row) to the next place of its digit's bucket."""
    cdef Py_ssize_t i
    cdef uint64_t b
    for i in range(n):
        b = (keys[i] >> shift) & (BUCKETS - 1)
        to_keys[at[b]] = keys[i]
        to_rows[at[b]] = rows[i]
        at[b] += 1


def group_sorted(keys_in):
    """(the distinct keys in ascending order, each row's group (its key's position among
    them), each group's first row): what grouping a write's keys needs."""
    sorted_keys = np.array(keys_in, dtype=np.uint64, copy=True)
    cdef const uint64_t[::1] keys = sorted_keys
    cdef Py_ssize_t n = keys.shape[0], i, g
    counts = np.empty(DIGITS * BUCKETS, dtype=np.int64)
    cdef int64_t[::1] count = counts
    rows = np.arange(n, dtype=np.int64)
    spare_keys = np.empty(n, dtype=np.uint64)
    spare_rows = np.empty(n, dtype=np.int64)
    cdef uint64_t[::1] k_from = sorted_keys, k_to = spare_keys
    cdef int64_t[::1] r_from = rows, r_to = spare_rows
    cdef int64_t at[BUCKETS]
    cdef int64_t total, c
    cdef int d, b
    cdef bint single, swapped = False
    if n == 0:
        return sorted_keys, rows, rows.copy()
    with nogil:
        _count(keys, &count[0])
    for d in range(DIGITS):
        single = False
        total = 0
        with nogil:
            for b in range(BUCKETS):
                c = count[d * BUCKETS + b]
                if c == n:
                    single = True  # every key has this digit: the pass would move nothing
                at[b] = total
                total += c
            if not single:
                _scatter(&k_from[0], &r_from[0], &k_to[0], &r_to[0], n, d * DIGIT_BITS, at)
        if not single:
            k_from, k_to = k_to, k_from
            r_from, r_to = r_to, r_from
            swapped = not swapped
    # The distinct keys and each group's first row are written over the sorted keys and rows
    # they are read from: group g is written at g <= i, after position i was read.
    group_ids = np.empty(n, dtype=np.int64)
    cdef int64_t[::1] group = group_ids
    cdef int64_t row
    with nogil:
        g = 0
        group[r_from[0]] = 0
        for i in range(1, n):
            row = r_from[i]
            if k_from[i] != k_from[g]:
                g += 1
                k_from[g] = k_from[i]
                r_from[g] = row  # stable: the group's least row comes first
            group[row] = g
    distinct = spare_keys if swapped else sorted_keys
    firsts = spare_rows if swapped else rows
    return distinct[:g + 1], group_ids, firsts[:g + 1]

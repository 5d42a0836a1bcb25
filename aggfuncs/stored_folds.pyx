# cython: language_level=3, boundscheck=False, wraparound=False, initializedcheck=False
"""Folds of a put's inputs onto the stored cells of fixed-width columns, one pass each.

Why native code: on a put of repeated keys the folds of max, min and sum onto stored rows were
a dozen numpy passes each (keys for the float order, a scatter-reduce, the winners, the picks,
the comparison with the stored cell, the bounds of a sum), a third of the put's merge. Each
loop below goes through the input rows once, in input order, so every tie and every running
value is the one a left fold from the stored cell gives.

Values come as numpy views of Arrow buffers (a null's slot holds anything: validity says which
are read); groups are each input row's group, 0..m-1, one group per stored cell.
"""

import numpy as np

from libc.stdint cimport int8_t, int16_t, int32_t, int64_t, uint8_t, uint16_t, uint32_t, \
    uint64_t
from libc.math cimport NAN
from libc.string cimport memcpy

ctypedef fused number:
    int8_t
    int16_t
    int32_t
    int64_t
    uint8_t
    uint16_t
    uint32_t
    uint64_t
    float
    double

cdef int64_t _MAGNITUDE = 0x7FFFFFFFFFFFFFFF  # every bit but the sign


cdef inline int64_t _float_order(double x) noexcept nogil:
    """An int64 whose order is IEEE's total order of the float, every NaN made the positive
    NaN (the largest value); -0.0 sorts below 0.0."""
    cdef int64_t bits
    if x != x:
        x = NAN
    memcpy(&bits, &x, 8)
    return bits ^ ((bits >> 63) & _MAGNITUDE)


cdef inline bint _beats(number a, number b, bint largest) noexcept nogil:
    """Whether `a` replaces the held `b`: strictly larger (smaller), so a tie keeps what came
    first."""
    if number is float or number is double:
        if largest:
            return _float_order(a) > _float_order(b)
        return _float_order(a) < _float_order(b)
    if largest:
        return a > b
    return a < b


cdef int _check_groups(const int64_t[::1] groups, Py_ssize_t m) noexcept nogil:
    cdef Py_ssize_t i
    for i in range(groups.shape[0]):
        if groups[i] < 0 or groups[i] >= m:
            return -1
    return 0


def _groups_within(const int64_t[::1] groups, Py_ssize_t m, Py_ssize_t rows):
    if groups.shape[0] != rows:
        raise ValueError("stored_folds: one group per input row is needed")
    cdef int outside
    with nogil:
        outside = _check_groups(groups, m)
    if outside:
        raise IndexError("stored_folds: a group outside the stored cells")


def extreme_onto(number[::1] best, uint8_t[::1] held, const number[::1] values,
                 const uint8_t[::1] valid, const int64_t[::1] groups, bint largest):
    """Fold the valid inputs into `best` (each group's stored cell, or anything where `held`
    says it has none), in place: per group the largest (or smallest), the earliest on a tie,
    the stored cell first; `held` becomes whether the group has a value."""
    cdef Py_ssize_t m = best.shape[0], n = values.shape[0], i
    if held.shape[0] != m or valid.shape[0] != n:
        raise ValueError("stored_folds: validity and values differ in length")
    _groups_within(groups, m, n)
    cdef int64_t g
    with nogil:
        for i in range(n):
            if not valid[i]:
                continue
            g = groups[i]
            if not held[g] or _beats(values[i], best[g], largest):
                best[g] = values[i]
                held[g] = 1


def sum_onto(int64_t[::1] total, uint8_t[::1] held, const number[::1] values,
             const uint8_t[::1] valid, const int64_t[::1] groups, int64_t low, int64_t high):
    """Add the valid inputs to `total` (each group's stored value, 0 where `held` says it has
    none), in place and in order, every running value within [low, high]; `held` becomes
    whether the group has a value. False (and `total` part way) when a running value leaves
    the range: the caller's exact fold then says what that means. Integers that int64 holds
    only (not uint64, not floats)."""
    if number is uint64_t or number is float or number is double:
        raise TypeError("stored_folds.sum_onto: integers that int64 holds only")
    cdef Py_ssize_t m = total.shape[0], n = values.shape[0], i
    if held.shape[0] != m or valid.shape[0] != n:
        raise ValueError("stored_folds: validity and values differ in length")
    _groups_within(groups, m, n)
    cdef int64_t g, v, t
    cdef bint outside = False
    with nogil:
        for i in range(n):
            if not valid[i]:
                continue
            g = groups[i]
            v = <int64_t> values[i]
            t = total[g]
            # both bounds checked before adding, so int64 itself never wraps
            if (v > 0 and t > high - v) or (v < 0 and t < low - v):
                outside = True
                break
            total[g] = t + v
            held[g] = 1
    return not outside


def last_valid(const uint8_t[::1] valid, const int64_t[::1] groups, Py_ssize_t m):
    """Per group 0..m-1, its last valid input row, or -1 when it has none."""
    _groups_within(groups, m, valid.shape[0])
    picked = np.full(m, -1, dtype=np.int64)
    cdef int64_t[::1] pick = picked
    cdef Py_ssize_t i
    with nogil:
        for i in range(valid.shape[0]):
            if valid[i]:
                pick[groups[i]] = i
    return picked

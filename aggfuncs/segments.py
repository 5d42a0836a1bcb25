"""Rows grouped by key, in write order: the shape every aggregator folds over.

A write folds, per key, the stored state first and then the batch's rows in batch order. Rather
than loop over keys in Python, aggregators see the whole batch at once: `Segments` sorts row
indices by group (stably, so each group's rows keep their order) and aggregators reduce each
contiguous run with numpy or Arrow.
"""

from __future__ import annotations

import functools

import numpy as np

# Groups longer than this are reduced one by one with a sequential accumulate; shorter ones are
# reduced rank by rank across all groups at once. Either way the fold is strictly left to right.
_LONG_GROUP = 48


def stable_order(ids: np.ndarray) -> np.ndarray:
    """np.argsort(ids, kind="stable") for non-negative ids, as 16-bit radix passes: numpy sorts
    uint16 with a radix sort, several times faster than its merge sort of int64."""
    if len(ids) == 0:
        return np.zeros(0, dtype=np.int64)
    low = (ids & 0xFFFF).astype(np.uint16)
    order = np.argsort(low, kind="stable")
    high = ids >> 16
    if high.any():
        order = order[np.argsort(high[order].astype(np.uint16), kind="stable")]
        if (high >> 16).any():  # beyond 2**32 groups: never in practice, but stay correct
            return np.argsort(ids, kind="stable")
    return order


class Segments:
    """Row indices grouped by group id; within a group, rows keep their input order.

    The grouped order (`order`, `sorted_ids`) is sorted only when a fold asks for it: `pick`
    and `reduce` go through the rows in input order without it, which on a put of repeated
    keys saved most of what the folds of sum, max, min and the last values cost."""

    def __init__(self, group_ids: np.ndarray, group_count: int, order: np.ndarray | None = None):
        group_ids = np.asarray(group_ids, dtype=np.int64)
        self.group_ids = group_ids
        self.count = int(group_count)
        if order is not None:
            self.order = order
        self.lengths = np.bincount(group_ids, minlength=self.count).astype(np.int64)
        self.starts = np.cumsum(self.lengths) - self.lengths

    @functools.cached_property
    def order(self) -> np.ndarray:
        """Row indices sorted by group, stably."""
        return stable_order(self.group_ids)

    @functools.cached_property
    def sorted_ids(self) -> np.ndarray:
        return self.group_ids[self.order]

    @classmethod
    def after_stored(cls, input_groups: "Segments") -> "Segments":
        """Segments over [one stored row per group (row g of group g), then the input rows]:
        each group's stored row first, then its input rows in order. Built from the input's
        order without sorting again."""
        m, n = input_groups.count, len(input_groups)
        ids = np.concatenate([np.arange(m, dtype=np.int64), input_groups.group_ids])
        order = np.empty(m + n, dtype=np.int64)
        # group g occupies [starts[g] + g, starts[g] + g + lengths[g] + 1) of the sorted order
        order[input_groups.starts + np.arange(m)] = np.arange(m)
        order[input_groups.sorted_ids + 1 + np.arange(n)] = m + input_groups.order
        return cls(ids, m, order)

    def __len__(self) -> int:
        return len(self.group_ids)

    def filtered(self, keep: np.ndarray) -> "Segments":
        """The segments of the rows where `keep` (in input order) is true; groups may go empty."""
        if keep.all():
            return self
        # The kept rows in the parent's order, renumbered: no second sort.
        kept = self.order[keep[self.order]]
        renumbered = np.cumsum(keep) - 1
        return Segments(self.group_ids[keep], self.count, renumbered[kept])

    def any(self, mask: np.ndarray) -> np.ndarray:
        """Per group: whether `mask` (in input order) is true for any of its rows."""
        hits = np.bincount(self.group_ids[mask], minlength=self.count)
        return hits > 0

    def count_where(self, mask: np.ndarray) -> np.ndarray:
        """Per group: how many of its rows `mask` (in input order) holds."""
        return np.bincount(self.group_ids[mask], minlength=self.count).astype(np.int64)

    def pick(self, eligible: np.ndarray, last: bool) -> np.ndarray:
        """Per group, the input index of its first (or last) eligible row, or -1 if none."""
        picked = np.full(self.count, -1, dtype=np.int64)
        rows = np.flatnonzero(eligible)
        if not last:
            rows = rows[::-1]
        # numpy applies repeated fancy-index assignments in order: each group keeps the last
        picked[self.group_ids[rows]] = rows
        return picked

    def fold(self, ufunc: np.ufunc, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Left fold of `ufunc` over each group's values (input order, all rows eligible).

        Returns (result per group, has_rows per group). Strictly sequential, so floating point
        results equal a plain Python loop's, bit for bit.
        """
        with np.errstate(all="ignore"):  # IEEE: inf and NaN are values, not errors
            return self._fold(ufunc, values)

    def _fold(self, ufunc: np.ufunc, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        ordered = values[self.order]
        result = np.zeros(self.count, dtype=values.dtype)
        has = self.lengths > 0
        result[has] = ordered[self.starts[has]]
        long_groups = np.nonzero(self.lengths > _LONG_GROUP)[0]
        for g in long_groups:
            s, n = self.starts[g], self.lengths[g]
            result[g] = ufunc.accumulate(ordered[s : s + n])[-1]
        short = np.nonzero((self.lengths > 1) & (self.lengths <= _LONG_GROUP))[0]
        rank = 1
        while len(short):
            result[short] = ufunc(result[short], ordered[self.starts[short] + rank])
            rank += 1
            short = short[self.lengths[short] > rank]
        return result, has

    def reduce(self, ufunc: np.ufunc, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Like `fold` for an associative ufunc on exact types (integers, booleans) or for
        bounds: faster, the rows in input order through `ufunc.at` (0 for a group of none)."""
        result = np.zeros(self.count, dtype=values.dtype)
        has = self.lengths > 0
        if ufunc.identity is None:  # maximum, minimum: from each group's first row
            result[self.group_ids[::-1]] = values[::-1]
        elif ufunc.identity != 0:
            result[has] = ufunc.identity
        with np.errstate(all="ignore"):  # integer wrap is detected by the caller
            ufunc.at(result, self.group_ids, values)
        return result, has

    def running(self, values: np.ndarray) -> np.ndarray:
        """Per row in sorted order, the sum of its group's values up to and including it, in
        int64: exact whenever every true running sum fits, as wrapped partial sums cancel."""
        ordered = values[self.order].astype(np.int64)
        with np.errstate(over="ignore"):
            total = np.cumsum(ordered)
            before = np.zeros(self.count, dtype=np.int64)
            has = self.lengths > 0
            before[has] = (total - ordered)[self.starts[has]]
            return total - np.repeat(before, self.lengths)

    def extremes(self, running: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per group: the lowest and highest of `running` (sorted order) and 0, the value
        before its first row; and its last value (0 for an empty group)."""
        low = np.zeros(self.count, dtype=running.dtype)
        high = np.zeros(self.count, dtype=running.dtype)
        last = np.zeros(self.count, dtype=running.dtype)
        has = self.lengths > 0
        if has.any():
            low[has] = np.minimum.reduceat(running, self.starts[has])
            high[has] = np.maximum.reduceat(running, self.starts[has])
            last[has] = running[self.starts[has] + self.lengths[has] - 1]
        return np.minimum(low, 0), np.maximum(high, 0), last

    def offsets(self) -> np.ndarray:
        """List offsets (length count + 1) for the rows in sorted order."""
        return np.concatenate([[0], np.cumsum(self.lengths)]).astype(np.int32)

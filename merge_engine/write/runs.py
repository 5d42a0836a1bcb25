"""Runs: which of a key's rows pre-aggregation may fold into one state without changing the result.

A run is a stretch of consecutive contributing rows of one key. Each retraction is a run of its
own, so `+x` then `-x` changes nothing and no retraction is lost. Each column may cut runs
further (`Aggregator.run_breaks`): a float sum or a product never pre-folds two contributions
(the tablet folds them left to right from the stored value, rounding or range-checking every
step), and an exact sum is cut where its partial total could hide a running total the tablet
would reject. Merging the runs' states then equals merging the rows, accepted or rejected alike.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from aggfuncs import Aggregator, Segments


def exact_runs(key_groups: np.ndarray, signs: np.ndarray,
               columns: list[tuple[Aggregator, pa.Array]]) -> Segments:
    """The rows (input order) grouped into runs, numbered in key order then row order.

    `columns` are the target value columns' aggregators and states. A cut can make another
    column's run unsafe (a sum run split in two is not always two safe runs), so cuts are
    collected until none adds another.
    """
    order = np.argsort(key_groups, kind="stable")
    key, sign = key_groups[order], signs[order]
    starts = np.ones(len(order), dtype=bool)  # per row in key order: does a run start here?
    starts[1:] = (key[1:] != key[:-1]) | (sign[1:] < 0) | (sign[:-1] < 0)
    while True:
        run_ids = np.empty(len(order), dtype=np.int64)
        run_ids[order] = np.cumsum(starts) - 1
        runs = Segments(run_ids, int(starts.sum()), order)
        cuts = np.zeros(len(order), dtype=bool)
        for agg, states in columns:
            breaks = agg.run_breaks(states, runs)
            if breaks is not None:
                cuts |= breaks[order]
        if not (cuts & ~starts).any():
            return runs
        starts |= cuts

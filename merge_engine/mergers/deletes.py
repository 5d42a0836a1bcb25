"""DeleteMerger: what a delete leaves of a stored row.

A full-row delete removes the row. A partial delete (target columns) resets the target columns
to their empty state and removes the row only when every other value column is empty too, so a
job deleting its own columns never erases another job's data.
"""

from __future__ import annotations

import numpy as np

from aggfuncs import Aggregator
from merge_engine.state import StateBatch


class DeleteMerger:
    def __init__(self, aggregators: list[Aggregator], key_positions: set[int]):
        self.aggregators = aggregators
        self.key_positions = key_positions

    def delete(self, stored: StateBatch, target: np.ndarray) -> tuple[StateBatch, np.ndarray]:
        """(rows after the delete, removed mask) for the stored rows of the deleted keys."""
        m = len(stored)
        columns = list(stored.columns)
        written = stored.written.copy()
        counts = stored.counts().copy()
        others_empty = np.ones(m, dtype=bool)
        for i, agg in enumerate(self.aggregators):
            if i in self.key_positions:
                continue
            if target[i]:
                columns[i] = agg.empty(m)
                written[:, i] = False
                counts[:, i] = 0
            else:
                others_empty &= agg.is_empty(stored.columns[i])
        return StateBatch(columns, written, counts), others_empty

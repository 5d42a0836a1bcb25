"""DeleteMerger: what a delete leaves of a stored row.

A full-row delete removes the row. A partial delete (target columns) resets the target columns
to their empty state and removes the row only when no other value column was ever written (its
written bit) and none holds a value: then the row left is exactly a key no write has touched,
and removing it loses nothing. Judging by values alone would remove a row whose other column was
written as null, which first_value keeps as its first value; the next write there would wrongly
become "first". This serves undo (a partial owner taking back its `+I`) and user deletes alike.
"""

from __future__ import annotations

import numpy as np

from aggfuncs import Aggregator
from merge_engine.write.state import StateBatch


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
        untouched = np.ones(m, dtype=bool)  # every non-target value column as on a new key
        for i, agg in enumerate(self.aggregators):
            if i in self.key_positions:
                continue
            if target[i]:
                columns[i] = agg.empty(m)
                written[:, i] = False
                counts[:, i] = 0
            else:
                untouched &= ~stored.written[:, i] & agg.is_empty(stored.columns[i])
        return StateBatch(columns, written, counts), untouched

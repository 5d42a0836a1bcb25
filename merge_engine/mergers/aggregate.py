"""AggregateRowMerger: per key, fold the stored state and the put's rows with each function."""

from __future__ import annotations

import numpy as np

from aggfuncs import Aggregator, Segments
from merge_engine.input import WriteInput
from merge_engine.modes import MergeMode
from merge_engine.state import StateBatch


class AggregateRowMerger:
    """AGGREGATE folds raw inputs (after each function's to_state); MERGE_STATE folds inputs
    that already are partial states. Either way the stored state comes first in each group."""

    def __init__(self, aggregators: list[Aggregator], key_positions: set[int]):
        self.aggregators = aggregators
        self.key_positions = key_positions

    def merge(self, stored: StateBatch, write: WriteInput, group_ids: np.ndarray,
              mode: MergeMode) -> StateBatch:
        m = len(stored)
        segments = Segments(np.concatenate([np.arange(m), group_ids]), m)
        columns = list(stored.columns)
        written = stored.written.copy()
        for i, agg in enumerate(self.aggregators):
            if i in self.key_positions or not write.target[i]:
                continue
            values = agg.cast_input(write.columns[agg.column])
            states = agg.to_state(values) if mode is MergeMode.AGGREGATE \
                else agg.from_merge_state(values)
            both = StateBatch.concat(
                StateBatch([stored.columns[i]], stored.written[:, i:i + 1]),
                StateBatch([states], np.ones((write.rows, 1), dtype=bool)),
            )
            columns[i] = agg.fold(both.columns[0], both.written[:, 0], segments)
            written[:, i] = True  # every key of the put has at least one row targeting i
        return StateBatch(columns, written)

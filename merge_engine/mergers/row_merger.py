"""RowMerger: what the mergers of a put share, their table's columns and the columns a write
changes."""

from __future__ import annotations

from typing import Iterator

import numpy as np

from aggfuncs import Aggregator
from merge_engine.input import WriteInput
from merge_engine.modes import MergeMode
from merge_engine.state import StateBatch


class RowMerger:
    """Merges a put's rows into the stored rows of their keys, one merge engine's way.

    `aggregators` are in schema order, `key_positions` the primary key's columns (never merged),
    `counted` the columns that count their contributions (sum and product, for retraction)."""

    def __init__(self, aggregators: list[Aggregator], key_positions: set[int], counted: list[int]):
        self.aggregators = aggregators
        self.key_positions = key_positions
        self.counted = counted

    def merge(self, stored: StateBatch, write: WriteInput, group_ids: np.ndarray,
              mode: MergeMode) -> StateBatch:
        """The rows after the write: `stored` holds each key's current row (an empty one for a
        new key), `group_ids` the position of each input row's key among them."""
        raise NotImplementedError

    def targets(self, write: WriteInput) -> Iterator[tuple[int, Aggregator]]:
        """(position, aggregator) of each value column the write targets, in schema order."""
        for i, agg in enumerate(self.aggregators):
            if i not in self.key_positions and write.target[i]:
                yield i, agg

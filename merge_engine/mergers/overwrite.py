"""OverwriteRowMerger: the last row of each key replaces its target columns, no aggregation.

This is OVERWRITE mode (how undo restores before-images) and the engine of tables without
`table.merge-engine`. An `_unwritten` input column restores a cell's written bit exactly.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from aggfuncs import Segments
from aggfuncs.arg_select import check_orderings, with_ordering
from merge_engine.mergers.row_merger import RowMerger
from merge_engine.table.modes import MergeMode
from merge_engine.write.input import WriteInput
from merge_engine.write.state import StateBatch
from tally.errors import RetractionError


class OverwriteRowMerger(RowMerger):
    def merge(self, stored: StateBatch, write: WriteInput, group_ids: np.ndarray,
              mode: MergeMode) -> StateBatch:
        m = len(stored)
        last = Segments(group_ids, m).pick(np.ones(len(group_ids), dtype=bool), last=True)
        take = pa.array(last, type=pa.int64())
        if write.signs is not None:
            raise RetractionError(
                "An OVERWRITE write cannot carry retractions (-U/-D rows): it replaces values. "
                "Nothing was applied.")
        self.check_sequences(write)
        check_orderings([agg for _, agg in self.targets(write)], write.columns)
        columns = list(stored.columns)
        written = stored.written.copy()
        counts = stored.counts().copy()
        unwritten = self._unwritten_names(write, last)
        for i, agg in self.targets(write):
            values = self.with_sequence(agg, agg.cast_input(write.columns[agg.column]), write)
            values = with_ordering(agg, values, write.columns, self.aggregators)
            values = agg.overwrite(values)
            columns[i] = values.take(take).cast(stored.columns[i].type)
            agg.check_cells(columns[i])
            if unwritten is None:
                written[:, i] = True
            else:
                written[:, i] = [agg.column not in names for names in unwritten]
            if i in self.counted:
                counts[:, i] = self._counts(i, columns[i], write, last)
        return StateBatch(columns, written, counts)

    def _counts(self, i: int, values: pa.Array, write: WriteInput, last: np.ndarray) -> np.ndarray:
        """An overwritten value counts as one contribution, unless the image says otherwise."""
        default = values.is_valid().to_numpy(zero_copy_only=False).astype(np.int64)
        if write.contributions is None:
            return default
        slot = self.counted.index(i)
        given = [write.contributions[r] for r in last]
        return np.array([d if c is None else int(c[slot]) for d, c in zip(default, given)])

    @staticmethod
    def _unwritten_names(write: WriteInput, last: np.ndarray) -> list[set] | None:
        if write.unwritten is None:
            return None
        return [set(write.unwritten[i]) for i in last]

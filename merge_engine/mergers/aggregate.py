"""AggregateRowMerger: per key, fold the stored state and the put's rows with each function."""

from __future__ import annotations

from functools import partial

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from aggfuncs import Aggregator, Segments
from aggfuncs.arg_select import check_orderings, with_ordering
from aggfuncs.base import IGNORE_RETRACT, valid_mask
from merge_engine.mergers.row_merger import RowMerger
from merge_engine.table.modes import MergeMode
from merge_engine.write.folds import column_states, fold_states, row_contributions
from merge_engine.write.input import WriteInput
from merge_engine.write.state import StateBatch
from tally.errors import RetractionError


class AggregateRowMerger(RowMerger):
    """AGGREGATE folds raw inputs (after each function's to_state); MERGE_STATE folds inputs
    that already are partial states. Either way the stored state comes first in each group.
    Rows marked as retractions take their contribution back (see Aggregator.fold_signed)."""

    def merge(self, stored: StateBatch, write: WriteInput, group_ids: np.ndarray,
              mode: MergeMode) -> StateBatch:
        self.check_sequences(write)
        check_orderings([agg for _, agg in self.targets(write)], write.columns)
        m, n = len(stored), write.rows
        input_groups = Segments(group_ids, m)
        segments = None  # stored rows and input rows together: made when a fold needs them
        columns = list(stored.columns)
        written = stored.written.copy()
        counts = stored.counts().copy()
        signs = write.signs
        placed = self._one_row_each(group_ids, m, n) if signs is None else None
        attach = partial(self._attached, write=write)
        for i, agg, states in column_states(self.targets(write), write.columns, mode, attach):
            takes = self._taking_rows(agg, signs, n)
            if placed is not None and agg.folds_one_as_state and not agg.sequenced \
                    and not stored.written[:, i].any():
                # One state per key onto cells no write has filled: each fold is its state.
                columns[i] = states.cast(stored.columns[i].type)
                if placed is not True:
                    columns[i] = columns[i].take(placed)
                self._settle(agg, i, columns, counts, states, takes, write, input_groups)
                written[:, i] = True
                continue
            if signs is None and not agg.sequenced:
                # Fold the inputs alone, then combine with the stored cells once.
                onto = agg.fold_onto(stored.columns[i], stored.written[:, i],
                                     states.cast(stored.columns[i].type), input_groups)
                if onto is not None:
                    columns[i] = onto
                    self._settle(agg, i, columns, counts, states, takes, write, input_groups)
                    written[:, i] = True  # every key has an input row, and all rows take
                    continue
            if segments is None:
                segments = Segments.after_stored(input_groups)
            all_states = pa.concat_arrays([stored.columns[i], states.cast(stored.columns[i].type)])
            all_written = np.concatenate([stored.written[:, i], takes])
            all_signs = None if signs is None else \
                np.concatenate([np.ones(m, dtype=np.int8), signs])
            columns[i] = fold_states(agg, all_states, all_written, segments, all_signs)
            self._settle(agg, i, columns, counts, states, takes, write, input_groups)
            written[:, i] |= input_groups.any(takes)
        return StateBatch(columns, written, counts)

    def _attached(self, agg: Aggregator, values: pa.Array, write: WriteInput) -> pa.Array:
        """A column's input with what its states carry besides the values: each row's
        sequence (a sequenced column's), or its `by` column's value (arg_max/arg_min)."""
        values = self.with_sequence(agg, values, write)
        return with_ordering(agg, values, write.columns, self.aggregators)

    def _settle(self, agg, i, columns, counts, states, takes, write, groups) -> None:
        """What follows column i's fold: its stored form, its contribution counts, its limits."""
        columns[i] = agg.settle(columns[i])
        if i in self.counted:
            columns[i] = self._count(agg, i, counts, columns[i], states, takes, write, groups)
        agg.check_cells(columns[i])

    @staticmethod
    def _one_row_each(group_ids: np.ndarray, m: int, n: int) -> np.ndarray | bool | None:
        """When every key has exactly one input row: the input row of each key (True when
        rows are in key order already); else None."""
        if n != m:  # every key has at least one row, so n == m means one each
            return None
        placed = np.empty(m, dtype=np.int64)
        placed[group_ids] = np.arange(n, dtype=np.int64)
        if (placed == np.arange(m)).all():
            return True
        return pa.array(placed, type=pa.int64())

    @staticmethod
    def _taking_rows(agg: Aggregator, signs: np.ndarray | None, n: int) -> np.ndarray:
        """Which input rows reach the column: all, except retractions a column ignores."""
        if signs is None or agg.retractable:
            return np.ones(n, dtype=bool)
        if not agg.params.get(IGNORE_RETRACT):
            raise RetractionError(
                f"Column '{agg.column}' ({agg.name}) cannot take back a contribution exactly; "
                f"set 'fields.{agg.column}.ignore-retract' = 'true' to ignore retractions for it. "
                "Nothing was applied.")
        return signs > 0

    def _count(self, agg, i, counts, folded, states, takes, write, groups) -> pa.Array:
        """Update the contribution counts of column i; a cell with none left is empty (null).
        Counts are judged in row order, as the rows would be one write each: a retraction that
        comes before the contribution it takes back is an error even when a later row of the
        same write brings one."""
        if write.contributions is None and write.signs is None:
            # Each row adds its one contribution or none: no count can go below zero.
            counts[:, i] += groups.count_where(valid_mask(states))
        else:
            self._count_signed(agg, i, counts, states, takes, write, groups)
        empty = counts[:, i] == 0
        if empty.any():
            folded = pc.if_else(pa.array(empty), pa.nulls(len(folded), folded.type), folded)
        return folded

    def _count_signed(self, agg, i, counts, states, takes, write, groups) -> None:
        """_count's counts for a write with retractions or given contribution counts."""
        each = row_contributions(write.contributions, self.counted.index(i), states)
        signs = np.ones(len(each), dtype=np.int64) if write.signs is None else write.signs
        lowest, _, delta = groups.extremes(groups.running(each * signs * takes))
        if (counts[:, i] + lowest < 0).any():
            raise RetractionError(
                f"{agg.name} column '{agg.column}': a retraction takes back more contributions "
                "than the key holds (nothing earlier matches it). Nothing was applied.")
        counts[:, i] += delta

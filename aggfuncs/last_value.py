"""last_value and last_value_ignore_nulls: the latest written value (or latest non-null one)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from aggfuncs import stored_folds
from aggfuncs.base import Aggregator, stored_contributions, take_clamped, take_or_null, valid_mask
from aggfuncs.fixed_width import array_of, numpy_dtype, stored_cells, validity_of, values_of
from aggfuncs.functions import AggFunction
from aggfuncs.segments import Segments
from aggfuncs.string_rows import is_string, take_rows


class LastValueAggregator(Aggregator):
    """A null input overwrites: the last write wins, whatever it holds."""

    function = AggFunction.LAST_VALUE
    selects_value = True
    keeps_latest = True
    retractable = True

    def step(self, acc, value, sign):
        """A retraction of the current value clears it; of any other value, does nothing."""
        if sign < 0:
            return None if acc == value else acc
        return value

    def fold(self, states: pa.Array, written: np.ndarray, segments: Segments) -> pa.Array:
        return take_or_null(states, segments.pick(written, last=True))


class LastValueIgnoreNullsAggregator(Aggregator):
    """A null input keeps the stored value: the default for columns without a function."""

    function = AggFunction.LAST_VALUE_IGNORE_NULLS
    selects_value = True
    keeps_latest = True
    retractable = True
    folds_one_as_state = True

    def step(self, acc, value, sign):
        if sign < 0:
            return None if value is not None and acc == value else acc
        return acc if value is None else value

    def fold(self, states: pa.Array, written: np.ndarray, segments: Segments) -> pa.Array:
        return take_or_null(states, segments.pick(written & valid_mask(states), last=True))

    def fold_onto(self, stored, stored_written, states, segments) -> pa.Array | None:
        """The inputs' last non-null value, else the stored cell: fixed-width values and
        strings picked from the two arrays at once, without Arrow's take and if_else."""
        picked = stored_folds.last_valid(validity_of(states),
                                         np.ascontiguousarray(segments.group_ids), len(stored))
        found = picked >= 0
        dtype = numpy_dtype(states.type)
        if stored.type == states.type and dtype is not None:
            values, held = stored_cells(stored, stored_written, dtype)
            values[found] = values_of(states, dtype)[picked[found]]
            held[found] = 1
            return array_of(values, held, stored.type)
        base = stored_contributions(stored, stored_written)
        if stored.type == states.type and is_string(states.type):
            rows = np.where(found, picked, np.arange(len(stored), dtype=np.int64))
            return take_rows([base, states], found.astype(np.int64), rows, stored.type)
        # where no input is picked the stored cell is chosen: index 0 there is never read
        return pc.if_else(pa.array(found), take_clamped(states, picked), base)

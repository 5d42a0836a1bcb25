"""sum: exact in the column's type; a running total outside it rejects the write."""

from __future__ import annotations

import operator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from aggfuncs import stored_folds
from aggfuncs.base import (Aggregator, numeric_values, stored_contributions, valid_mask,
                           with_nulls)
from aggfuncs.fixed_width import (array_of, numpy_dtype, stored_cells, validity_of,
                                  values_of)
from aggfuncs.functions import AggFunction
from aggfuncs.numeric import (NUMERIC_TYPE_NAMES, check_result, each_contribution_breaks,
                              fold_numeric, integer_bounds, is_numeric, sum_run_breaks)
from aggfuncs.segments import Segments


class SumAggregator(Aggregator):
    function = AggFunction.SUM
    type_names = NUMERIC_TYPE_NAMES
    accepts = staticmethod(is_numeric)
    retractable = True
    counts_contributions = True
    folds_one_as_state = True

    def fold_signed(self, states, written, segments, signs) -> pa.Array:
        """A retraction subtracts: negate the retracted values and sum as usual. Integers are
        negated in int64 (-128 negates in int8 only by leaving it); 64-bit integers, which
        int64 cannot widen, fold row by row with Python integers."""
        retracting = written & (signs < 0)
        if not retracting.any():
            return self.fold(states, written, segments)
        if pa.types.is_integer(self.type):
            if self.type.bit_width == 64:
                return super().fold_signed(states, written, segments, signs)
            states = states.cast(pa.int64())
        negated = pc.if_else(pa.array(retracting), pc.negate(states), states)
        return self.fold(negated, written, segments)

    def step(self, acc, value, sign):
        if value is None:
            return acc
        result = (acc or 0) + sign * value
        check_result(result, self.type, f"sum column '{self.column}'")
        return result

    def fold(self, states: pa.Array, written: np.ndarray, segments: Segments) -> pa.Array:
        # Null rule: nulls and unwritten cells contribute nothing; a group of only those is null.
        return fold_numeric(states, written, segments, np.add, operator.add,
                            f"sum column '{self.column}'", result_type=self.type)

    def fold_onto(self, stored, stored_written, states, segments) -> pa.Array | None:
        """Integers (not uint64): the stored value plus the inputs' int64 total, when
        |stored| + the sum of |input| bounds every running value inside the column's range
        (then no step can overflow, and no order of addition can differ). Otherwise, and for
        floats (a left fold from the stored value) and decimals: None."""
        if not pa.types.is_integer(self.type) or self.type == pa.uint64():
            return None
        if stored.type == self.type and states.type == self.type:
            return self._sum_onto(stored, stored_written, states, segments)
        base = stored_contributions(stored, stored_written)
        start = numeric_values(base).astype(np.int64)
        inputs = numeric_values(states).astype(np.int64)
        magnitude, _ = segments.reduce(np.add, np.abs(inputs.astype(np.float64)))
        high = integer_bounds(self.type)[1]
        limit = float(high) if high < 2**53 else 2.0**62  # float64 rounding room, as fold's
        if not (np.abs(start.astype(np.float64)) + magnitude <= limit).all():
            return None
        total, _ = segments.reduce(np.add, inputs)
        has = valid_mask(base) | segments.any(valid_mask(states))
        return with_nulls((start + total).astype(self.type.to_pandas_dtype()), has, self.type)

    def _sum_onto(self, stored, stored_written, states, segments) -> pa.Array | None:
        """fold_onto in one compiled pass (aggfuncs.stored_folds): it checks every running
        value against the column's range, so it declines only where a step leaves it."""
        dtype = numpy_dtype(self.type)
        values, held = stored_cells(stored, stored_written, dtype)
        total = values.astype(np.int64)
        total[held == 0] = 0
        low, high = integer_bounds(self.type)
        if not stored_folds.sum_onto(total, held, values_of(states, dtype), validity_of(states),
                                     np.ascontiguousarray(segments.group_ids), low, high):
            return None
        return array_of(total.astype(dtype), held, self.type)

    def run_breaks(self, states: pa.Array, runs: Segments) -> np.ndarray | None:
        if pa.types.is_floating(self.type):
            return each_contribution_breaks(states)  # a float sum is a left fold: never regroup
        return sum_run_breaks(states, runs, self.type)

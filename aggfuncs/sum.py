"""sum: exact in the column's type; integer or decimal overflow rejects the write."""

from __future__ import annotations

import operator

import numpy as np
import pyarrow as pa

from aggfuncs.base import Aggregator, valid_mask
from aggfuncs.functions import AggFunction
import pyarrow.compute as pc

from aggfuncs.numeric import NUMERIC_TYPE_NAMES, check_result, fold_numeric, is_numeric
from tally.errors import AggregateOverflowError
from aggfuncs.segments import Segments


class SumAggregator(Aggregator):
    function = AggFunction.SUM
    type_names = NUMERIC_TYPE_NAMES
    accepts = staticmethod(is_numeric)
    retractable = True
    counts_contributions = True

    def fold_signed(self, states, written, segments, signs) -> pa.Array:
        """A retraction subtracts: negate the retracted values and sum as usual."""
        retracting = written & (signs < 0)
        if not retracting.any() or pa.types.is_unsigned_integer(self.type):
            return super().fold_signed(states, written, segments, signs)  # unsigned: row by row
        try:
            negated = pc.negate_checked(states)
        except pa.ArrowInvalid:
            raise AggregateOverflowError(
                f"sum column '{self.column}': a retracted value cannot be negated in "
                f"{self.type}. The whole write was rejected.") from None
        return self.fold(pc.if_else(pa.array(retracting), negated, states), written, segments)

    def step(self, acc, value, sign):
        if value is None:
            return acc
        result = (acc or 0) + sign * value
        check_result(result, self.type, f"sum column '{self.column}'")
        return result

    def fold(self, states: pa.Array, written: np.ndarray, segments: Segments) -> pa.Array:
        # Null rule: nulls and unwritten cells contribute nothing; a group of only those is null.
        keep = written & valid_mask(states)
        return fold_numeric(
            states.filter(pa.array(keep)),
            segments.filtered(keep),
            np.add,
            operator.add,
            f"sum column '{self.column}'",
        )

"""avg: the mean of the non-null values written to a float or decimal column.

The column's type is the type readers see, the average: float32/float64 (the mean as a float of
that width) or decimal(p, s) (the mean rounded HALF_UP to the column's scale, which always fits
p digits as no mean exceeds its largest input). Writes may bring any numbers the column's type
holds (integers included: an exact mean of integers is a decimal column's).

The state is `struct<sum, count>`, so that merges stay exact: the sum in float64 for float
columns (a strict left fold, as sum's) or in decimal(38, s) for decimal columns (exact; a sum
beyond 38 digits is refused as an overflow), and the count in int64. Readers see sum / count;
images carry the state beside it, so undo and replay restore it exactly.

- A null value contributes nothing; a cell of no contributions is empty (null).
- MERGE_STATE takes partial states, `{"sum": s, "count": n}` (n >= 0; n = 0 only with a zero
  or null sum: no contribution), or plain numbers, each the state of that one number.
- OVERWRITE replaces the cell with the given state (or number, a state of one).
- Retraction subtracts the retracted state's sum and count; a cell back at count 0 is empty,
  and a retraction that would take the count below zero is refused.
"""

from __future__ import annotations

import decimal
import operator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from aggfuncs.base import Aggregator, valid_mask
from aggfuncs.functions import AggFunction
from aggfuncs.numeric import check_result, each_contribution_breaks, fold_numeric, sum_run_breaks
from aggfuncs.segments import Segments
from tally.errors import InvalidInputError, RetractionError

SUM, COUNT = "sum", "count"
# Exact for every step of a decimal128 sum (38 digits plus room).
_EXACT = decimal.Context(prec=80, rounding=decimal.ROUND_HALF_UP)


def _accepts(arrow_type: pa.DataType) -> bool:
    return (pa.types.is_float32(arrow_type) or pa.types.is_float64(arrow_type)
            or pa.types.is_decimal128(arrow_type))


class AvgAggregator(Aggregator):
    function = AggFunction.AVG
    type_names = ("float32, float64, decimal128 (the column's type is the average's; "
                  "write integers to a decimal column for an exact mean)")
    accepts = staticmethod(_accepts)
    retractable = True
    folds_one_as_state = True
    # Images carry the state (sum and count) beside the average readers see.
    tokenized = True

    @property
    def sum_type(self) -> pa.DataType:
        return pa.decimal128(38, self.type.scale) if pa.types.is_decimal(self.type) \
            else pa.float64()

    @property
    def state_type(self) -> pa.DataType:
        return pa.struct([pa.field(SUM, self.sum_type), pa.field(COUNT, pa.int64())])

    # --- inputs -----------------------------------------------------------------------------

    def input_type(self, given: pa.DataType) -> pa.DataType:
        return self.state_type if pa.types.is_struct(given) else self.type

    def takes_type(self, given, widens, states=False, replaces=False) -> bool:
        if pa.types.is_struct(given):
            names = [given.field(i).name for i in range(given.num_fields)]
            return (states or replaces) and sorted(names) == [COUNT, SUM] and \
                widens(given.field(SUM).type, self.sum_type) and \
                widens(given.field(COUNT).type, pa.int64())
        return pa.types.is_integer(given) or widens(given, self.type)

    def python_inputs(self, values: list) -> tuple[list, pa.DataType]:
        """Dicts `{"sum": s, "count": n}` are partial states; numbers are values."""
        if any(isinstance(v, dict) for v in values):
            return values, self.state_type
        return values, self.type

    def to_state(self, values: pa.Array) -> pa.Array:
        """A value is the state of one contribution; a state given as such is checked."""
        if pa.types.is_struct(values.type):
            return self._checked(values)
        valid = valid_mask(values)
        sums = values.cast(self.sum_type)
        counts = pa.array(valid.astype(np.int64))
        return pa.StructArray.from_arrays([sums, counts], fields=list(self.state_type),
                                          mask=pa.array(~valid))

    from_merge_state = to_state
    overwrite = to_state

    def _checked(self, states: pa.Array) -> pa.Array:
        """Partial states: a count of at least one with a sum, or a count of 0 with a zero (or
        null) sum, which is no contribution (null)."""
        states = states.cast(self.state_type)
        live = valid_mask(states)
        sums, counts = states.field(SUM), states.field(COUNT)
        count = pc.fill_null(counts, -1).to_numpy(zero_copy_only=False)
        has_sum = valid_mask(sums)
        zero_sum = ~has_sum | pc.fill_null(pc.equal(sums, pa.scalar(0, sums.type)),
                                           False).to_numpy(zero_copy_only=False)
        bad = live & ((count < 0) | ((count > 0) & ~has_sum) | ((count == 0) & ~zero_sum))
        if bad.any():
            row = int(np.nonzero(bad)[0][0])
            raise InvalidInputError(
                f"Column '{self.column}' (avg) cannot take the partial state "
                f"{states[row].as_py()!r} in row {row}: a state is a sum and a count of at least "
                "1 (or a count of 0 with a zero sum). Nothing was applied.")
        empty = ~live | (count == 0)
        if not empty.any() or (empty == ~live).all():
            return states
        return pa.StructArray.from_arrays([sums, counts], fields=list(self.state_type),
                                          mask=pa.array(empty))

    # --- state and value --------------------------------------------------------------------

    def values(self, states: pa.Array) -> pa.Array:
        """The average of each state: sum / count in the column's type."""
        sums, counts = pc.struct_field(states, [0]), pc.struct_field(states, [1])
        if not pa.types.is_decimal(self.type):
            means = pc.divide(sums, counts.cast(pa.float64()))
            means = pc.if_else(states.is_valid(), means, pa.nulls(len(states), pa.float64()))
            return means.cast(self.type, safe=False)
        quantum = decimal.Decimal(1).scaleb(-self.type.scale)
        out = []
        for state in states.to_pylist():
            if state is None:
                out.append(None)
                continue
            mean = _EXACT.divide(state[SUM], decimal.Decimal(state[COUNT]))
            out.append(mean.quantize(quantum, rounding=decimal.ROUND_HALF_UP, context=_EXACT))
        return pa.array(out, type=self.type)

    # --- folding ----------------------------------------------------------------------------

    def fold(self, states: pa.Array, written: np.ndarray, segments: Segments) -> pa.Array:
        """Per group the sums and the counts of its written, non-null states added."""
        keep = written & valid_mask(states)
        sums = fold_numeric(pc.struct_field(states, [0]), keep, segments, np.add, operator.add,
                            f"avg column '{self.column}' (its sum)", result_type=self.sum_type)
        counts = fold_numeric(pc.struct_field(states, [1]), keep, segments, np.add,
                              operator.add, f"avg column '{self.column}' (its count)",
                              result_type=pa.int64())
        return pa.StructArray.from_arrays([sums, counts], fields=list(self.state_type),
                                          mask=counts.is_null())

    def run_breaks(self, states: pa.Array, runs: Segments) -> np.ndarray | None:
        if not pa.types.is_decimal(self.type):
            return each_contribution_breaks(states)  # a float sum is a left fold: never regroup
        sums = pc.fill_null(pc.struct_field(states, [0]), pa.scalar(0, self.sum_type))
        counts = pc.fill_null(pc.struct_field(states, [1]), 0)
        return sum_run_breaks(sums, runs, self.sum_type) | \
            sum_run_breaks(counts, runs, pa.int64())

    # --- retraction -------------------------------------------------------------------------

    def step(self, acc, value, sign):
        """(sum, count) after one contribution or retraction of a state."""
        if value is None:
            return acc
        total, count = acc or (None, 0)
        add = value[SUM] if sign > 0 else -value[SUM]
        if pa.types.is_decimal(self.type):
            with decimal.localcontext(_EXACT):  # the range check must not round either
                total = _EXACT.add(total if total is not None else decimal.Decimal(0), add)
                check_result(total, self.sum_type, f"avg column '{self.column}' (its sum)")
        else:
            total = add if total is None else total + add
        count += sign * value[COUNT]
        if count < 0:
            raise RetractionError(
                f"avg column '{self.column}': a retraction takes back more contributions than "
                "the key holds (nothing earlier matches it). Nothing was applied.")
        check_result(count, pa.int64(), f"avg column '{self.column}' (its count)")
        return total, count

    def finish(self, acc):
        if acc is None or acc[1] == 0:
            return None  # no contribution left: empty, whatever a float sum kept of them
        return {SUM: acc[0], COUNT: acc[1]}

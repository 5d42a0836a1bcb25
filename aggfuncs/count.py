"""count: a BIGINT that is never null; AGGREGATE adds 1 per non-null input, MERGE_STATE adds."""

from __future__ import annotations

import operator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from aggfuncs.base import Aggregator, cast_column, valid_mask
from aggfuncs.functions import AggFunction
from aggfuncs.numeric import fold_numeric, sum_run_breaks
from aggfuncs.segments import Segments


class CountAggregator(Aggregator):
    function = AggFunction.COUNT
    type_names = "int64"

    @staticmethod
    def accepts(arrow_type: pa.DataType) -> bool:
        return arrow_type == pa.int64()

    def input_type(self, given: pa.DataType) -> pa.DataType:
        # In AGGREGATE mode the input is whatever is being counted: only its nullness matters.
        return given

    def takes_type(self, given, widens, states=False, replaces=False) -> bool:
        """AGGREGATE counts non-null inputs of any type; MERGE_STATE adds partial counts."""
        if replaces:
            return widens(given, self.type)
        return pa.types.is_integer(given) if states else True

    def fallback_inputs(self, values: list) -> pa.Array:
        """Values no BIGINT holds are still counted: only their nullness matters."""
        return pa.array([None if v is None else True for v in values], type=pa.bool_())

    def to_state(self, values: pa.Array) -> pa.Array:
        return pc.cast(values.is_valid(), pa.int64())

    def from_merge_state(self, values: pa.Array) -> pa.Array:
        return pc.fill_null(self._as_int64(values), 0)

    def overwrite(self, values: pa.Array) -> pa.Array:
        return pc.fill_null(self._as_int64(values), 0)

    def _as_int64(self, values: pa.Array) -> pa.Array:
        return cast_column(values, pa.int64(), self)

    retractable = True

    def fold_signed(self, states, written, segments, signs) -> pa.Array:
        """A retraction decrements (by its partial count in MERGE_STATE mode)."""
        signed = pc.multiply(states, pa.array(signs.astype(np.int64)))
        return self.fold(signed, written, segments)

    def empty(self, n: int) -> pa.Array:
        return pa.array(np.zeros(n, dtype=np.int64))

    def is_empty(self, values: pa.Array) -> np.ndarray:
        return ~valid_mask(values) | (pc.fill_null(values, 0).to_numpy(zero_copy_only=False) == 0)

    def fold(self, states: pa.Array, written: np.ndarray, segments: Segments) -> pa.Array:
        total = fold_numeric(states, written, segments, np.add, operator.add,
                             f"count column '{self.column}'")
        return pc.fill_null(total, 0)

    def run_breaks(self, states: pa.Array, runs: Segments) -> np.ndarray | None:
        return sum_run_breaks(states, runs, pa.int64())

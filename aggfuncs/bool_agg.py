"""bool_and and bool_or over boolean columns, with the null rule (nulls are skipped)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from aggfuncs.base import Aggregator, contributions, numeric_values, with_nulls
from aggfuncs.functions import AggFunction
from aggfuncs.segments import Segments


class _BoolAggregator(Aggregator):
    type_names = "bool"
    ufunc: np.ufunc
    replay_idempotent = True  # and/or of a value again is that value's and/or (idempotent ops)

    @staticmethod
    def accepts(arrow_type: pa.DataType) -> bool:
        return pa.types.is_boolean(arrow_type)

    def fold(self, states: pa.Array, written: np.ndarray, segments: Segments) -> pa.Array:
        values, groups = contributions(states, written, segments)
        result, has = groups.reduce(self.ufunc, numeric_values(values).astype(bool))
        return with_nulls(result, has, pa.bool_())


class BoolAndAggregator(_BoolAggregator):
    function = AggFunction.BOOL_AND
    ufunc = np.logical_and


class BoolOrAggregator(_BoolAggregator):
    function = AggFunction.BOOL_OR
    ufunc = np.logical_or

"""sum: exact in the column's type; integer or decimal overflow rejects the write."""

from __future__ import annotations

import operator

import numpy as np
import pyarrow as pa

from aggfuncs.base import Aggregator, valid_mask
from aggfuncs.functions import AggFunction
from aggfuncs.numeric import NUMERIC_TYPE_NAMES, fold_numeric, is_numeric
from aggfuncs.segments import Segments


class SumAggregator(Aggregator):
    function = AggFunction.SUM
    type_names = NUMERIC_TYPE_NAMES
    accepts = staticmethod(is_numeric)

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

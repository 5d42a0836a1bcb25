"""product: exact for integers, HALF_UP to the column's scale after every decimal multiplication."""

from __future__ import annotations

import decimal
import operator

import numpy as np
import pyarrow as pa

from aggfuncs.base import Aggregator, valid_mask
from aggfuncs.functions import AggFunction
from aggfuncs.numeric import NUMERIC_TYPE_NAMES, fold_numeric, is_numeric
from aggfuncs.segments import Segments


class ProductAggregator(Aggregator):
    function = AggFunction.PRODUCT
    type_names = NUMERIC_TYPE_NAMES
    accepts = staticmethod(is_numeric)

    def fold(self, states: pa.Array, written: np.ndarray, segments: Segments) -> pa.Array:
        keep = written & valid_mask(states)
        return fold_numeric(
            states.filter(pa.array(keep)),
            segments.filtered(keep),
            np.multiply,
            operator.mul,
            f"product column '{self.column}'",
            decimal_op=self._multiply_decimal,
        )

    def _multiply_decimal(self, a: decimal.Decimal, b: decimal.Decimal) -> decimal.Decimal:
        quantum = decimal.Decimal(1).scaleb(-self.type.scale)
        return (a * b).quantize(quantum, rounding=decimal.ROUND_HALF_UP)

"""product: exact for integers, HALF_UP to the column's scale after every decimal multiplication.

Pre-aggregation never multiplies two contributions ahead of the tablet: decimal and float
products round at every step, and the range rule judges every running product from the stored
one, which a partial product cannot stand for.
"""

from __future__ import annotations

import decimal
import operator

import numpy as np
import pyarrow as pa

from aggfuncs.base import Aggregator
from aggfuncs.functions import AggFunction
from aggfuncs.numeric import (NUMERIC_TYPE_NAMES, check_result, each_contribution_breaks,
                              fold_numeric, is_numeric)
from aggfuncs.segments import Segments
from tally.errors import RetractionError


class ProductAggregator(Aggregator):
    function = AggFunction.PRODUCT
    type_names = NUMERIC_TYPE_NAMES
    accepts = staticmethod(is_numeric)
    retractable = True
    counts_contributions = True

    def step(self, acc, value, sign):
        """Multiply, or for a retraction divide, exactly for integers and decimals."""
        if value is None:
            return acc
        if sign > 0:
            result = value if acc is None else acc * value
            if pa.types.is_floating(self.type) and acc is not None:
                dtype = self.type.to_pandas_dtype()
                result = float(dtype(acc) * dtype(value))
            if pa.types.is_decimal(self.type):
                result = self._multiply_decimal(acc, value) if acc is not None else value
        else:
            if value == 0:
                raise RetractionError(
                    f"product column '{self.column}' cannot retract 0: dividing by zero")
            base = 1 if acc is None else acc
            if pa.types.is_floating(self.type):
                dtype = self.type.to_pandas_dtype()  # divide in the column's own precision
                result = float(dtype(base) / dtype(value))
            elif pa.types.is_decimal(self.type):
                result = self._divide_decimal(base, value)
            else:
                if base % value:
                    raise RetractionError(
                        f"product column '{self.column}' cannot retract {value}: {base} is not "
                        f"divisible by it")
                result = base // value
        check_result(result, self.type, f"product column '{self.column}'")
        return result

    def _divide_decimal(self, base, value):
        quantum = decimal.Decimal(1).scaleb(-self.type.scale)
        with decimal.localcontext() as ctx:
            ctx.prec = 2 * self.type.precision + 10
            exact = base / value
            if exact.quantize(quantum) != exact:
                raise RetractionError(
                    f"product column '{self.column}' cannot retract {value}: {base} / {value} "
                    f"is not exact at scale {self.type.scale}")
            return exact.quantize(quantum)

    def fold(self, states: pa.Array, written: np.ndarray, segments: Segments) -> pa.Array:
        return fold_numeric(states, written, segments, np.multiply, operator.mul,
                            f"product column '{self.column}'", decimal_op=self._multiply_decimal)

    def _multiply_decimal(self, a: decimal.Decimal, b: decimal.Decimal) -> decimal.Decimal:
        quantum = decimal.Decimal(1).scaleb(-self.type.scale)
        with decimal.localcontext() as ctx:
            ctx.prec = max(ctx.prec, 2 * self.type.precision + 4 * len(str(abs(a))) + 10)
            return (a * b).quantize(quantum, rounding=decimal.ROUND_HALF_UP)

    def run_breaks(self, states: pa.Array, runs: Segments) -> np.ndarray | None:
        return each_contribution_breaks(states)

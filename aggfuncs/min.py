"""min: the smallest non-null value (NaN only when every value is NaN)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from aggfuncs.base import Aggregator, take_or_null
from aggfuncs.functions import AggFunction
from aggfuncs.ordering import ORDERABLE_TYPE_NAMES, extreme_onto, is_orderable, pick_extreme
from aggfuncs.segments import Segments


class MinAggregator(Aggregator):
    function = AggFunction.MIN
    type_names = ORDERABLE_TYPE_NAMES
    accepts = staticmethod(is_orderable)
    folds_one_as_state = True
    replay_idempotent = True  # the smallest of x, y, x, y is the smallest of x, y

    def fold(self, states: pa.Array, written: np.ndarray, segments: Segments) -> pa.Array:
        return take_or_null(states, pick_extreme(states, written, segments, largest=False))

    def fold_onto(self, stored, stored_written, states, segments) -> pa.Array | None:
        return extreme_onto(stored, stored_written, states, segments, largest=False)

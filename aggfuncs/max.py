"""max: the largest non-null value (NaN is the largest float)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from aggfuncs.base import Aggregator, take_or_null
from aggfuncs.functions import AggFunction
from aggfuncs.ordering import ORDERABLE_TYPE_NAMES, extreme_onto, is_orderable, pick_extreme
from aggfuncs.segments import Segments


class MaxAggregator(Aggregator):
    function = AggFunction.MAX
    type_names = ORDERABLE_TYPE_NAMES
    accepts = staticmethod(is_orderable)
    folds_one_as_state = True
    replay_idempotent = True  # the largest of x, y, x, y is the largest of x, y

    def fold(self, states: pa.Array, written: np.ndarray, segments: Segments) -> pa.Array:
        return take_or_null(states, pick_extreme(states, written, segments, largest=True))

    def fold_onto(self, stored, stored_written, states, segments) -> pa.Array | None:
        return extreme_onto(stored, stored_written, states, segments, largest=True)

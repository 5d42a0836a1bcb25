"""first_value and first_value_ignore_nulls: the earliest written value (or earliest non-null).

first_value keeps a leading null: the per-cell written bit tells "never written" (take the next
input) from "written as null" (keep the null), which a value alone cannot.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from aggfuncs.base import Aggregator, take_or_null, valid_mask
from aggfuncs.functions import AggFunction
from aggfuncs.segments import Segments


class FirstValueAggregator(Aggregator):
    function = AggFunction.FIRST_VALUE
    written_is_state = True
    selects_value = True
    replay_idempotent = True  # a replayed row comes after the first one, which stays

    def fold(self, states: pa.Array, written: np.ndarray, segments: Segments) -> pa.Array:
        return take_or_null(states, segments.pick(written, last=False))


class FirstValueIgnoreNullsAggregator(Aggregator):
    function = AggFunction.FIRST_VALUE_IGNORE_NULLS
    selects_value = True
    replay_idempotent = True  # a replayed row comes after the first non-null one, which stays

    def fold(self, states: pa.Array, written: np.ndarray, segments: Segments) -> pa.Array:
        return take_or_null(states, segments.pick(written & valid_mask(states), last=False))

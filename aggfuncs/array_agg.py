"""array_agg: list<T> columns; a T input is appended, a list<T> input concatenated."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from aggfuncs.base import Aggregator, keep_untouched, parse_bool, valid_mask
from aggfuncs.functions import AggFunction
from aggfuncs.segments import Segments
from aggfuncs.tokens import apply_items, first_occurrences


def _is_list(arrow_type: pa.DataType) -> bool:
    return pa.types.is_list(arrow_type) or pa.types.is_large_list(arrow_type)


class ArrayAggAggregator(Aggregator):
    function = AggFunction.ARRAY_AGG
    type_names = "list<T>"
    parameters = {"distinct": parse_bool}
    defaults = {"distinct": False}
    accepts = staticmethod(_is_list)
    retractable = True

    def step(self, acc, value, sign):
        """Elements so far; a retraction removes the last occurrence of each retracted element."""
        if value is None:
            return acc
        return apply_items(acc, value, sign, self.params["distinct"], self.column)

    def finish(self, acc):
        return acc if acc else None  # no elements left: the empty state

    def input_type(self, given: pa.DataType) -> pa.DataType:
        return self.type if _is_list(given) else self.type.value_type

    def to_state(self, values: pa.Array) -> pa.Array:
        if _is_list(values.type):
            # An empty list holds no element: like a null, it contributes nothing.
            empty = pc.fill_null(pc.equal(pc.list_value_length(values), 0), False)
            return pc.if_else(empty, pa.nulls(len(values), values.type), values)
        # A single element becomes a one-element list; a null element stays a null (skipped).
        offsets = pa.array(np.arange(len(values) + 1), type=self._offset_type())
        return self._list_class().from_arrays(offsets, values, mask=values.is_null())

    from_merge_state = to_state

    def overwrite(self, values: pa.Array) -> pa.Array:
        return self.to_state(values)

    def _list_class(self):
        return pa.LargeListArray if pa.types.is_large_list(self.type) else pa.ListArray

    def _offset_type(self) -> pa.DataType:
        return pa.int64() if pa.types.is_large_list(self.type) else pa.int32()

    def fold(self, states: pa.Array, written: np.ndarray, segments: Segments) -> pa.Array:
        keep = written & valid_mask(states)
        sub = segments.filtered(keep)
        ordered = states.filter(pa.array(keep)).take(pa.array(sub.order, type=pa.int64()))
        elements = pc.list_flatten(ordered)
        sizes = pc.list_value_length(ordered).to_numpy(zero_copy_only=False)
        owner = np.repeat(sub.sorted_ids, sizes.astype(np.int64))
        if self.params["distinct"]:
            picked = first_occurrences(owner, elements)
            elements, owner = elements.take(pa.array(picked, type=pa.int64())), owner[picked]
        lengths = np.bincount(owner, minlength=sub.count)
        has = lengths > 0  # no elements at all is the empty state (null), as in SQL
        offsets = pa.array(np.concatenate([[0], np.cumsum(lengths)]), type=self._offset_type())
        folded = self._list_class().from_arrays(offsets, elements, mask=pa.array(~has))
        return keep_untouched(folded, states, keep, segments) if self.params["distinct"] else folded

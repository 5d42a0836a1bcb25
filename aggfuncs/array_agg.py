"""array_agg: list<T> columns; a T input is appended, a list<T> input concatenated."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from aggfuncs.base import Aggregator, parse_bool
from aggfuncs.cell_limits import (DEFAULT_MAX_CELL_BYTES, MAX_CELL_BYTES, MAX_ELEMENTS,
                                  list_cell_sizes, parse_cell_bytes, parse_elements, refuse_over)
from aggfuncs.functions import AggFunction
from aggfuncs.segments import Segments
from aggfuncs.tokens import apply_items, fold_lists, list_array


def _is_list(arrow_type: pa.DataType) -> bool:
    return pa.types.is_list(arrow_type) or pa.types.is_large_list(arrow_type)


class ArrayAggAggregator(Aggregator):
    function = AggFunction.ARRAY_AGG
    type_names = "list<T>"
    parameters = {"distinct": parse_bool, MAX_CELL_BYTES: parse_cell_bytes,
                  MAX_ELEMENTS: parse_elements}
    defaults = {"distinct": False, MAX_CELL_BYTES: DEFAULT_MAX_CELL_BYTES, MAX_ELEMENTS: 0}
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

    def takes_type(self, given, widens, states=False, replaces=False) -> bool:
        """Lists, or single elements (each appended); a replacing cell is a whole list."""
        if replaces:
            return widens(given, self.type)
        return widens(given, self.type) or widens(given, self.type.value_type)

    def to_state(self, values: pa.Array) -> pa.Array:
        if _is_list(values.type):
            # An empty list holds no element: like a null, it contributes nothing.
            empty = pc.fill_null(pc.equal(pc.list_value_length(values), 0), False)
            return pc.if_else(empty, pa.nulls(len(values), values.type), values)
        # A single element becomes a one-element list; a null element stays a null (skipped).
        valid = values.is_valid()
        return list_array(self.type, valid.to_numpy(zero_copy_only=False).astype(np.int64),
                          values.filter(valid))

    from_merge_state = to_state

    def overwrite(self, values: pa.Array) -> pa.Array:
        return self.to_state(values)

    def check_cells(self, states: pa.Array) -> None:
        """Each cell within max-cell-bytes (its elements' bytes) and max-elements."""
        byte_limit, count_limit = self.params[MAX_CELL_BYTES], self.params[MAX_ELEMENTS]
        offsets = states.offsets
        total = offsets[len(offsets) - 1].as_py() - offsets[0].as_py() if len(states) else 0
        if (not byte_limit or states.nbytes <= byte_limit) and \
                (not count_limit or total <= count_limit):
            return
        counts, sizes = list_cell_sizes(states)
        refuse_over(self.column, self.name, counts, count_limit, "elements", MAX_ELEMENTS)
        refuse_over(self.column, self.name, sizes, byte_limit, "bytes", MAX_CELL_BYTES)

    def fold(self, states: pa.Array, written: np.ndarray, segments: Segments) -> pa.Array:
        return fold_lists(states, written, segments, self.params["distinct"], self.type)

"""nested_update: list<struct<...>> columns whose elements are upserted by a nested key.

`nested-key` (required) names the struct fields that identify an element ("id" or "a,b").
A written array is applied element by element in order: an element whose nested key the cell
holds replaces that element where it stands; an element with a new key is appended. A cell's
order is therefore the order in which its keys first arrived, whatever the grouping of writes:
a run of writes folded into one state keeps its keys in first-arrival order and its last value
per key, and merging it upserts exactly what the writes one by one would. Null elements, null
arrays and arrays of nothing else contribute nothing; a null key field is a key value like any
other. Key fields have an exact equality: integers, strings, binaries, dates, timestamps,
decimals, booleans (no floats: NaN equals nothing).

`count-limit` (default 0: none) keeps the first that many elements of each cell a write leaves
(Paimon's count-limit): later keys are dropped, and keys kept keep taking updates. A folded
partial state keeps every key (`settle` cuts only what a cell stores), so pre-aggregation
drops no update of a kept key.

Retraction (a -U/-D row) removes each element of the retracted array whose key the cell still
holds with an equal element (every field equal); an element replaced since stays, and a
retraction never fails. Cells are bounded by `max-elements` and `max-cell-bytes`.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from aggfuncs.base import Aggregator, fold_cells
from aggfuncs.cell_limits import (DEFAULT_MAX_CELL_BYTES, MAX_CELL_BYTES, MAX_ELEMENTS,
                                  list_cell_sizes, parse_cell_bytes, parse_elements, refuse_over)
from aggfuncs.functions import AggFunction
from aggfuncs.segments import Segments
from aggfuncs.tokens import list_array
from tally.errors import InvalidAggFunctionError

NESTED_KEY, COUNT_LIMIT = "nested-key", "count-limit"


def _is_struct_list(arrow_type: pa.DataType) -> bool:
    return (pa.types.is_list(arrow_type) or pa.types.is_large_list(arrow_type)) and \
        pa.types.is_struct(arrow_type.value_type) and arrow_type.value_type.num_fields > 0


def _exact_key(arrow_type: pa.DataType) -> bool:
    t = pa.types
    return (t.is_integer(arrow_type) or t.is_string(arrow_type) or t.is_large_string(arrow_type)
            or t.is_binary(arrow_type) or t.is_large_binary(arrow_type) or t.is_date(arrow_type)
            or t.is_timestamp(arrow_type) or t.is_decimal(arrow_type) or t.is_boolean(arrow_type))


def parse_nested_key(name: str, value: Any) -> str:
    """Comma-separated field names, kept as one canonical string ("a,b")."""
    fields = [f.strip() for f in value.split(",")] if isinstance(value, str) else None
    if not fields or not all(fields) or len(set(fields)) != len(fields):
        raise InvalidAggFunctionError(
            f"Parameter '{name}' must name distinct struct fields separated by commas "
            f"(e.g. 'id' or 'a,b') but was {value!r}")
    return ",".join(fields)


def upsert(held: dict, elements, keys: tuple[str, ...], sign: int) -> dict:
    """`held` (nested key -> element, in cell order) after one array's contribution (sign 1)
    or retraction (sign -1)."""
    for element in elements or ():
        if element is None:
            continue
        key = tuple(element[f] for f in keys)
        if sign > 0:
            held[key] = element  # an existing key keeps its place
        elif key in held and held[key] == element:
            del held[key]
    return held


class NestedUpdateAggregator(Aggregator):
    function = AggFunction.NESTED_UPDATE
    type_names = "list<struct<...>>, large_list<struct<...>>"
    parameters = {NESTED_KEY: parse_nested_key, COUNT_LIMIT: parse_elements,
                  MAX_CELL_BYTES: parse_cell_bytes, MAX_ELEMENTS: parse_elements}
    defaults = {COUNT_LIMIT: 0, MAX_CELL_BYTES: DEFAULT_MAX_CELL_BYTES, MAX_ELEMENTS: 0}
    accepts = staticmethod(_is_struct_list)
    retractable = True

    def __init__(self, column: str, arrow_type: pa.DataType, params: dict | None = None):
        super().__init__(column, arrow_type, params)
        if NESTED_KEY not in self.params:
            raise InvalidAggFunctionError(
                f"nested_update column '{column}' needs the parameter '{NESTED_KEY}' "
                f"(option 'fields.{column}.nested_update.{NESTED_KEY}'): the struct fields "
                "that identify an element")
        struct = arrow_type.value_type
        names = [struct.field(i).name for i in range(struct.num_fields)]
        self.keys = tuple(self.params[NESTED_KEY].split(","))
        for key in self.keys:
            if key not in names:
                raise InvalidAggFunctionError(
                    f"Parameter '{NESTED_KEY}' of nested_update column '{column}' names "
                    f"'{key}', which is not a field of {struct}; its fields: {names}")
            if not _exact_key(struct.field(key).type):
                raise InvalidAggFunctionError(
                    f"Nested key field '{key}' of column '{column}' has type "
                    f"{struct.field(key).type}; a key field must be an integer, string, "
                    "binary, date, timestamp, decimal or bool")

    # --- inputs -------------------------------------------------------------------------

    def to_state(self, values: pa.Array) -> pa.Array:
        """Null elements dropped; an array with no element left contributes nothing (null)."""
        if not len(values):
            return values
        elements = pc.list_flatten(values)
        if elements.null_count:
            sizes = pc.fill_null(pc.list_value_length(values), 0).to_numpy(zero_copy_only=False)
            owner = np.repeat(np.arange(len(values)), sizes.astype(np.int64))
            live = elements.is_valid().to_numpy(zero_copy_only=False)
            counts = np.bincount(owner[live], minlength=len(values))
            return list_array(self.type, counts, elements.filter(pa.array(live)))
        empty = pc.fill_null(pc.equal(pc.list_value_length(values), 0), True)
        if not pc.any(empty).as_py():
            return values
        return pc.if_else(empty, pa.nulls(len(values), values.type), values)

    from_merge_state = to_state

    def overwrite(self, values: pa.Array) -> pa.Array:
        """The given arrays replace the cells as they are (undo writes images back so)."""
        return values

    # --- folding ------------------------------------------------------------------------

    def fold(self, states: pa.Array, written: np.ndarray, segments: Segments) -> pa.Array:
        def combine(cells: list) -> list | None:
            held: dict = {}
            for cell in cells:
                upsert(held, cell, self.keys, 1)
            return list(held.values()) or None

        return fold_cells(states, written, segments, combine, self.type)

    def settle(self, states: pa.Array) -> pa.Array:
        """A cell keeps its first count-limit elements."""
        limit = self.params[COUNT_LIMIT]
        if not limit or not len(states):
            return states
        sizes = pc.fill_null(pc.list_value_length(states), 0).to_numpy(zero_copy_only=False)
        if (sizes <= limit).all():
            return states
        return pc.list_slice(states, 0, limit).cast(self.type)

    # --- retraction ---------------------------------------------------------------------

    def step(self, acc, value, sign):
        return upsert(dict(acc or {}), value, self.keys, sign)

    def finish(self, acc):
        return list(acc.values()) if acc else None

    # --- bounds -------------------------------------------------------------------------

    def check_cells(self, states: pa.Array) -> None:
        """Each cell within max-cell-bytes (its elements' bytes) and max-elements."""
        byte_limit, count_limit = self.params[MAX_CELL_BYTES], self.params[MAX_ELEMENTS]
        if not len(states) or (not byte_limit or states.nbytes <= byte_limit) and not count_limit:
            return
        counts, sizes = list_cell_sizes(states)
        refuse_over(self.column, self.name, counts, count_limit, "elements", MAX_ELEMENTS)
        refuse_over(self.column, self.name, sizes, byte_limit, "bytes", MAX_CELL_BYTES)


"""arg_max and arg_min: the value this column was written with in the row of the largest (or
smallest) value of another column, named by the parameter `by` (`fields.<col>.by = price`).

The state is `struct<value, by>`: the selected value and the ordering value it came with, so
a later write compares against it. The merger attaches each written row's `by` value (the
value written to the `by` column in that same row, not that column's aggregate): a write that
targets the column must carry the `by` column, checked before anything is applied. States
given as such (MERGE_STATE partial states, undo's images) come as structs.

- The order is max/min's: numbers by value (floats in IEEE total order, NaN largest), strings
  by code point, binary by bytes, dates, times and timestamps by time.
- The null rule: a row whose value or `by` value is null contributes nothing.
- Ties keep the earlier arrival, for both functions (as max and min keep their first
  input): so folding rows in again never changes a state (replay-idempotent), in any order.
- Retraction cannot be taken back exactly (the runner-up is not kept) and is refused, or
  ignored with `ignore-retract`.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from aggfuncs.base import Aggregator, cast_column, take_or_null, valid_mask
from aggfuncs.functions import AggFunction
from aggfuncs.ordering import ORDERABLE_TYPE_NAMES, is_orderable, pick_extreme
from aggfuncs.segments import Segments
from tally.errors import InvalidAggFunctionError, InvalidInputError

VALUE, BY = "value", "by"


def parse_column_name(name: str, value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        raise InvalidAggFunctionError(
            f"Parameter '{name}' must name a column (a non-empty string) but was {value!r}")
    return value.strip()


def _accepts(arrow_type: pa.DataType) -> bool:
    # A struct column would be taken for a state; null columns hold nothing to select.
    return not pa.types.is_struct(arrow_type) and not pa.types.is_null(arrow_type)


class ArgSelectAggregator(Aggregator):
    """The value at the extreme of the `by` column (see the module doc)."""

    type_names = "any type but struct and null"
    parameters = {BY: parse_column_name}
    accepts = staticmethod(_accepts)
    replay_idempotent = True  # ties keep the earlier arrival: a row seen before never wins
    folds_one_as_state = True
    # Images carry the state (value and ordering value) beside the value readers see.
    tokenized = True
    largest: bool

    def __init__(self, column: str, arrow_type: pa.DataType, params: dict | None = None):
        super().__init__(column, arrow_type, params)
        if BY not in self.params:
            raise InvalidAggFunctionError(
                f"Column '{column}' ({self.name}) needs the parameter '{BY}': the column whose "
                f"largest (or smallest) value selects this column's value (option "
                f"'fields.{column}.{BY}')")
        if self.params[BY] == column:
            raise InvalidAggFunctionError(
                f"Column '{column}' ({self.name}) cannot be ordered by itself; use "
                f"{'max' if self.largest else 'min'} for that")
        self.by_type: pa.DataType | None = None

    @property
    def by(self) -> str:
        return self.params[BY]

    def bind(self, by_type: pa.DataType) -> "ArgSelectAggregator":
        """Take the `by` column's type (the table's schema knows it); refused unless ordered."""
        if not is_orderable(by_type):
            raise InvalidAggFunctionError(
                f"Column '{self.column}' ({self.name}) is ordered by column '{self.by}' of type "
                f"{by_type}; an ordering column must be one of [{ORDERABLE_TYPE_NAMES}]")
        self.by_type = by_type
        return self

    @property
    def state_type(self) -> pa.DataType:
        if self.by_type is None:
            raise InvalidAggFunctionError(
                f"Column '{self.column}' ({self.name}): the type of its '{BY}' column "
                f"'{self.by}' is not known outside a table's schema")
        return pa.struct([pa.field(VALUE, self.type), pa.field(BY, self.by_type)])

    # --- inputs -----------------------------------------------------------------------------

    def input_type(self, given: pa.DataType) -> pa.DataType:
        return self.state_type if pa.types.is_struct(given) else self.type

    def takes_type(self, given, widens, states=False, replaces=False) -> bool:
        if pa.types.is_struct(given):
            names = [given.field(i).name for i in range(given.num_fields)]
            return sorted(names) == [BY, VALUE] and widens(given.field(VALUE).type, self.type)
        return widens(given, self.type)

    def python_inputs(self, values: list) -> tuple[list, pa.DataType]:
        """Dicts `{"value": v, "by": o}` are states; anything else is a value."""
        if self.by_type is not None and any(isinstance(v, dict) for v in values):
            return values, self.state_type
        return super().python_inputs(values)

    def attach(self, values: pa.Array, by_values: pa.Array) -> pa.Array:
        """Plain values with each row's ordering value: the states they stand for (a null
        ordering value: no state). A state given already (a struct) is kept as it is."""
        if pa.types.is_struct(values.type):
            return values
        none = None
        if values.null_count or by_values.null_count:
            none = pa.array(~(valid_mask(values) & valid_mask(by_values)))
        return pa.StructArray.from_arrays([values.cast(self.type), by_values.cast(self.by_type)],
                                          fields=list(self.state_type), mask=none)

    def to_state(self, values: pa.Array) -> pa.Array:
        """States (structs); one with a null value or ordering value is none."""
        if not pa.types.is_struct(values.type):
            raise InvalidInputError(
                f"Column '{self.column}' ({self.name}) takes values with their '{BY}' column "
                f"'{self.by}' in the same write. Nothing was applied.")
        values = values.cast(self.state_type)
        value, order = values.field(VALUE), values.field(BY)
        if not value.null_count and not order.null_count:
            return values
        none = ~(valid_mask(values) & valid_mask(value) & valid_mask(order))
        return pa.StructArray.from_arrays([value, order], fields=list(self.state_type),
                                          mask=pa.array(none))

    from_merge_state = to_state
    overwrite = to_state

    # --- state and value --------------------------------------------------------------------

    def values(self, states: pa.Array) -> pa.Array:
        return pc.struct_field(states, [0])

    # --- folding ----------------------------------------------------------------------------

    def fold(self, states: pa.Array, written: np.ndarray, segments: Segments) -> pa.Array:
        """Per group, the state of the largest (smallest) ordering value, the earliest on a tie."""
        keep = written & valid_mask(states)
        order = pc.struct_field(states, [1])
        return take_or_null(states, pick_extreme(order, keep, segments, self.largest))


class ArgMaxAggregator(ArgSelectAggregator):
    function = AggFunction.ARG_MAX
    largest = True


class ArgMinAggregator(ArgSelectAggregator):
    function = AggFunction.ARG_MIN
    largest = False


def bind_orderings(aggregators: list[Aggregator], column_types: dict[str, pa.DataType]) -> None:
    """Give each arg_max/arg_min aggregator its `by` column's type, or refuse a `by` that names
    no column of the table."""
    for agg in aggregators:
        if isinstance(agg, ArgSelectAggregator):
            if agg.by not in column_types:
                raise InvalidAggFunctionError(
                    f"Column '{agg.column}' ({agg.name}) is ordered by column '{agg.by}', which "
                    f"the table does not have; its columns are {sorted(column_types)}")
            agg.bind(column_types[agg.by])


def check_orderings(targets: list[Aggregator], columns: dict[str, pa.Array]) -> None:
    """Refuse a write that targets an arg_max/arg_min column with values but lacks its `by`
    column: checked for the whole write before any column is merged."""
    for agg in targets:
        if isinstance(agg, ArgSelectAggregator) and agg.by not in columns and \
                agg.column in columns and not pa.types.is_struct(columns[agg.column].type):
            raise InvalidInputError(
                f"Column '{agg.column}' ({agg.name}) is ordered by column '{agg.by}': a write to "
                f"it must carry column '{agg.by}' (add it to the target columns). Nothing was "
                "applied.")


def with_ordering(agg: Aggregator, values: pa.Array, columns: dict[str, pa.Array],
                  aggregators: list[Aggregator]) -> pa.Array:
    """An arg_max/arg_min column's written values with each row's `by` value attached (its
    states), the `by` values cast to that column's type (an error names it when they do not
    fit); other columns' values, and states given as such, as they are. `columns`: the
    write's columns by name; `aggregators`: the table's."""
    if not isinstance(agg, ArgSelectAggregator) or pa.types.is_struct(values.type):
        return values
    check_orderings([agg], {**columns, agg.column: values})
    by_aggregator = next(a for a in aggregators if a.column == agg.by)
    return agg.attach(values, cast_column(columns[agg.by], agg.by_type, by_aggregator))

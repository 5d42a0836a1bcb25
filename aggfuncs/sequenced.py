"""Value selection by a sequence field: last_value, first_value and their ignore-nulls forms,
ordered by the sequence columns of each write instead of by arrival (`table.sequence-field`).

A cell's state is `struct<value, sequence>`: the selected value and the sequence of the write
that brought it, so a later write compares against it. Per cell, not per row: with
last_value_ignore_nulls a null keeps an older value, and that value's own sequence is what a
still later write must beat, whatever order the writes arrive in.

- last_value(_ignore_nulls): the (non-null) value of the highest sequence; on a tie the later
  arrival wins, as it would without a sequence field.
- first_value(_ignore_nulls): the (non-null) value of the lowest sequence; on a tie the earlier
  arrival stays.
- A write that targets such a column must carry every sequence column, none of them null
  (checked before anything is applied, by the merger that attaches the sequence).
- A sequence group (`fields.<seq>.sequence-group`) gives its columns their own sequence: each
  aggregator carries its own sequence type. A group's aggregating columns (sum, ...) are not
  ordered, but their writes must carry the group's sequence too (`require_sequence`).

Sequences are compared column by column (lexicographically) in Arrow's sort order. Retraction
cannot be taken back exactly here and is refused (or ignored with `ignore-retract`).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from aggfuncs.base import Aggregator, take_or_null, valid_mask
from aggfuncs.functions import AggFunction
from aggfuncs.segments import Segments

VALUE, SEQUENCE = "value", "sequence"
SEQUENCE_FIELD = "table.sequence-field"
# The sequence a write to a column must carry: (struct of the sequence columns, the option
# that orders the column), on an aggregator that selects no value but is in a sequence group.
_REQUIRED = "required_sequence"


def require_sequence(agg: Aggregator, sequence_type: pa.StructType, option: str) -> None:
    """Mark an aggregator that selects no value as needing `sequence_type` in every write
    (a sequence group's sum, ...): the write is checked, the sequence is not attached."""
    setattr(agg, _REQUIRED, (sequence_type, option))


def required_sequence(agg: Aggregator) -> tuple[pa.StructType, str] | None:
    """(sequence type, option) a write to the column must carry, or None."""
    if agg.sequenced:
        return agg.sequence_type, agg.option
    return getattr(agg, _REQUIRED, None)


def orderable_sequence(arrow_type: pa.DataType) -> bool:
    """Types a sequence column may have: an exact total order (no floats, whose NaN and -0.0
    have no agreed place)."""
    t = pa.types
    return (t.is_integer(arrow_type) or t.is_decimal(arrow_type) or t.is_date(arrow_type)
            or t.is_timestamp(arrow_type) or t.is_time(arrow_type) or t.is_string(arrow_type)
            or t.is_large_string(arrow_type) or t.is_binary(arrow_type)
            or t.is_large_binary(arrow_type))


class SequencedAggregator(Aggregator):
    """A value-selection aggregator whose order is the sequence field's (see module doc)."""

    sequenced = True

    def __init__(self, inner: Aggregator, sequence_type: pa.StructType,
                 option: str = SEQUENCE_FIELD):
        # No super().__init__: the inner aggregator already checked the type and parameters.
        self.inner = inner
        self.option = option  # what orders the column: the sequence field or a group's option
        self.function = inner.function
        self.column = inner.column
        self.type = inner.type
        self.params = inner.params
        self.sequence_type = sequence_type
        # What the function is stays the inner one's: only the order between writes changed.
        self.selects_value, self.keeps_latest = inner.selects_value, inner.keeps_latest
        self.replay_idempotent = inner.replay_idempotent
        self.last = inner.keeps_latest
        self.ignore_nulls = inner.function in (AggFunction.LAST_VALUE_IGNORE_NULLS,
                                               AggFunction.FIRST_VALUE_IGNORE_NULLS)

    def explicit_params(self) -> dict:
        return self.inner.explicit_params()

    @property
    def state_type(self) -> pa.DataType:
        return pa.struct([pa.field(VALUE, self.type), pa.field(SEQUENCE, self.sequence_type)])

    # --- inputs -----------------------------------------------------------------------------

    def input_type(self, given: pa.DataType) -> pa.DataType:
        """States (images restored by undo) come as structs; writes bring plain values."""
        return self.state_type if pa.types.is_struct(given) else self.inner.input_type(given)

    def attach(self, values: pa.Array, sequence: pa.StructArray) -> pa.Array:
        """Plain values with each row's sequence: the states they stand for. A state given
        already (a struct) is kept as it is."""
        if pa.types.is_struct(values.type):
            return values
        # An ignore-nulls cell never holds a null: a null input is no state at all.
        mask = values.is_null() if self.ignore_nulls and values.null_count else None
        return pa.StructArray.from_arrays([values.cast(self.type), sequence.cast(self.sequence_type)],
                                          fields=list(self.state_type), mask=mask)

    # --- state and value --------------------------------------------------------------------

    def values(self, states: pa.Array) -> pa.Array:
        return pc.struct_field(states, [0])

    # --- folding ----------------------------------------------------------------------------

    def fold(self, states: pa.Array, written: np.ndarray, segments: Segments) -> pa.Array:
        eligible = written & valid_mask(states)
        if self.ignore_nulls:
            eligible &= valid_mask(self.values(states))
        rows = np.nonzero(eligible)[0]
        picked = np.full(segments.count, -1, dtype=np.int64)
        if len(rows):
            index = pa.array(rows, type=pa.int64())
            sequence = pc.struct_field(states, [1]).take(index)
            columns = {"g": pa.array(segments.group_ids[rows])}
            for j in range(sequence.type.num_fields):
                columns[f"s{j}"] = pc.struct_field(sequence, [j])
            columns["p"] = index  # arrival: the stored row first, then the write's rows
            order = pc.sort_indices(pa.table(columns), sort_keys=[(name, "ascending")
                                                                  for name in columns])
            ordered = rows[order.to_numpy()]
            groups = segments.group_ids[ordered]
            if self.last:  # the highest sequence, the later arrival on a tie
                ends = np.append(groups[1:] != groups[:-1], True)
            else:  # the lowest sequence, the earlier arrival on a tie
                ends = np.insert(groups[1:] != groups[:-1], 0, True)
            picked[groups[ends]] = ordered[ends]
        return take_or_null(states, picked)

    def overwrite(self, values: pa.Array) -> pa.Array:
        return values

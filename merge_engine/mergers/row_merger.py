"""RowMerger: what the mergers of a put share, their table's columns and the columns a write
changes."""

from __future__ import annotations

from typing import Iterator

import numpy as np
import pyarrow as pa

from aggfuncs import Aggregator
from aggfuncs.base import cast_column
from aggfuncs.sequenced import required_sequence
from merge_engine.table.modes import MergeMode
from merge_engine.write.input import WriteInput
from merge_engine.write.state import StateBatch
from tally.errors import InvalidInputError


class RowMerger:
    """Merges a put's rows into the stored rows of their keys, one merge engine's way.

    `aggregators` are in schema order, `key_positions` the primary key's columns (never merged),
    `counted` the columns that count their contributions (sum and product, for retraction)."""

    def __init__(self, aggregators: list[Aggregator], key_positions: set[int], counted: list[int]):
        self.aggregators = aggregators
        self.key_positions = key_positions
        self.counted = counted

    def merge(self, stored: StateBatch, write: WriteInput, group_ids: np.ndarray,
              mode: MergeMode) -> StateBatch:
        """The rows after the write: `stored` holds each key's current row (an empty one for a
        new key), `group_ids` the position of each input row's key among them."""
        raise NotImplementedError

    def targets(self, write: WriteInput) -> Iterator[tuple[int, Aggregator]]:
        """(position, aggregator) of each value column the write targets, in schema order."""
        for i, agg in enumerate(self.aggregators):
            if i not in self.key_positions and write.target[i]:
                yield i, agg

    def check_sequences(self, write: WriteInput) -> None:
        """Every sequenced column's sequence checked for the whole write before any column is
        merged: a write that lacks or nulls a sequence is refused as such, whatever else in it
        would fail later (an overflow in another column, another key). A sequence group's
        other columns (a sum, ...) need the group's sequence as well."""
        for _, agg in self.targets(write):
            required = required_sequence(agg)
            if required is None:
                continue
            if agg.sequenced and pa.types.is_struct(write.columns[agg.column].type):
                continue  # states given as such (undo's images) carry their sequences
            self._sequence_of(agg, write, *required)

    def with_sequence(self, agg: Aggregator, values: pa.Array, write: WriteInput) -> pa.Array:
        """A sequenced column's input with each row's sequence attached (its states); other
        columns' inputs, and states given as such (undo's images), as they are."""
        if not agg.sequenced or pa.types.is_struct(values.type):
            return values
        return agg.attach(values, self._sequence_of(agg, write, agg.sequence_type, agg.option))

    def _sequence_of(self, agg: Aggregator, write: WriteInput, sequence_type: pa.StructType,
                     option: str) -> pa.StructArray | None:
        """The write's sequence for a column; refused when a field is missing or null. None
        for a column that only needs its sequence carried, given as states (undo's images)."""
        by_name = {a.column: a for a in self.aggregators}
        parts = []
        for i, name in enumerate(sequence_type.names):
            if name not in write.columns:
                raise InvalidInputError(
                    f"Column '{agg.column}' ({agg.name}) follows the sequence "
                    f"{sequence_type.names} of '{option}': a write to it must carry column "
                    f"'{name}'. Nothing was applied.")
            given = write.columns[name]
            if not agg.sequenced and pa.types.is_struct(given.type):
                return None
            column = cast_column(given, sequence_type[i].type, by_name[name])
            if column.null_count:
                row = int(np.nonzero(column.is_null().to_numpy(zero_copy_only=False))[0][0])
                needs = "a sequence column is never null" if name == agg.column else \
                    f"a write to column '{agg.column}' needs a sequence"
                raise InvalidInputError(
                    f"Sequence column '{name}' (of '{option}') is null in row {row} of the "
                    f"write; {needs}. Nothing was applied.")
            parts.append(column)
        return pa.StructArray.from_arrays(parts, fields=list(sequence_type))

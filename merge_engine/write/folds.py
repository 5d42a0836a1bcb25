"""The fold of a write's columns, one loop for the tablet's merger and the client's
pre-aggregation: each targeted column's written values made its function's states, folded per
group, and the contributions each row brings to a counted column.

Both sides must turn values into states and fold them alike: a MERGE_STATE put of what a client
pre-aggregated equals an AGGREGATE put of its rows only because the states are the same.
"""

from __future__ import annotations

from typing import Callable, Iterable, Iterator

import numpy as np
import pyarrow as pa

from aggfuncs import Aggregator, Segments
from aggfuncs.base import valid_mask
from merge_engine.table.modes import MergeMode


def column_states(targets: Iterable[tuple[int, Aggregator]], columns: dict[str, pa.Array],
                  mode: MergeMode,
                  attach: Callable[[Aggregator, pa.Array], pa.Array] | None = None
                  ) -> Iterator[tuple[int, Aggregator, pa.Array]]:
    """(position, aggregator, states) of each target value column, in the order given, one
    column at a time (a bad value fails before later columns are read): its written values
    cast to the function's input type, with `attach` (a sequenced column's row sequences)
    applied, turned into states by the mode's rule (raw values in AGGREGATE, partial states in
    MERGE_STATE)."""
    for i, agg in targets:
        values = agg.cast_input(columns[agg.column])
        if attach is not None:
            values = attach(agg, values)
        yield i, agg, (agg.to_state(values) if mode is MergeMode.AGGREGATE
                       else agg.from_merge_state(values))


def fold_states(agg: Aggregator, states: pa.Array, written: np.ndarray, segments: Segments,
                signs: np.ndarray | None = None) -> pa.Array:
    """Each group's written states folded in order into one; with `signs`, the rows signed
    negative take their contribution back."""
    if signs is None:
        return agg.fold(states, written, segments)
    return agg.fold_signed(states, written, segments, signs)


def row_contributions(contributions: list | None, slot: int, states: pa.Array) -> np.ndarray:
    """How many contributions each row brings to a counted column: the partial counts a write
    gives (`slot` of each row's list; a row without a list brings 1), else one per non-null
    state (a null contributes nothing)."""
    if contributions is None:
        return valid_mask(states).astype(np.int64)
    return np.array([1 if c is None else int(c[slot]) for c in contributions], dtype=np.int64)

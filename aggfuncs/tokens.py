"""List states: array_agg's elements and string_agg's tokens, folded, deduplicated, retracted."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from aggfuncs.base import keep_untouched, valid_mask
from aggfuncs.segments import Segments
from tally.errors import InvalidInputError, RetractionError


def apply_items(acc: list | None, items, sign: int, distinct: bool, column: str) -> list:
    """A list state after adding (sign 1) or taking back (sign -1) each of `items`: how
    array_agg elements and string_agg tokens take retractions, row by row. A retraction removes
    the last occurrence; one that matches nothing is an error."""
    held = list(acc or [])
    for item in items:
        if sign > 0:
            if not (distinct and item in held):
                held.append(item)
            continue
        for i in range(len(held) - 1, -1, -1):
            if held[i] == item:
                del held[i]
                break
        else:
            raise RetractionError(
                f"Column '{column}' cannot retract {item!r}: it holds no such contribution")
    return held


def first_occurrences(owner: np.ndarray, values: pa.Array) -> np.ndarray:
    """Indices of the first occurrence of each distinct value within each owner group.

    The result is ascending, so taking it keeps the first-seen order inside every group. Nulls
    count as one value.
    """
    if len(values) == 0:
        return np.zeros(0, dtype=np.int64)
    try:
        codes = values.dictionary_encode(null_encoding="encode").indices
    except (pa.ArrowNotImplementedError, pa.ArrowTypeError):
        raise InvalidInputError(
            f"distinct is not supported for elements of type {values.type}"
        ) from None
    codes = codes.to_numpy(zero_copy_only=False).astype(np.int64)
    combined = owner.astype(np.int64) * (int(codes.max()) + 1) + codes
    _, first = np.unique(combined, return_index=True)
    return np.sort(first)


def list_array(list_type: pa.DataType, lengths: np.ndarray, items: pa.Array) -> pa.Array:
    """Lists of `list_type` holding `items` in order, `lengths[i]` each; no items is a null."""
    large = pa.types.is_large_list(list_type)
    offsets = pa.array(np.concatenate([[0], np.cumsum(lengths)]),
                       type=pa.int64() if large else pa.int32())
    make = pa.LargeListArray if large else pa.ListArray
    return make.from_arrays(offsets, items.cast(list_type.value_type), mask=pa.array(lengths == 0))


def fold_lists(states: pa.Array, written: np.ndarray, segments: Segments, distinct: bool,
               list_type: pa.DataType) -> pa.Array:
    """Per group, the items of its written non-null lists concatenated in order (the first
    occurrence of each with `distinct`); no items at all is the empty state, null. With
    `distinct`, a stored state that is its group's only list is kept as it is."""
    keep = written & valid_mask(states)
    sub = segments.filtered(keep)
    ordered = states.filter(pa.array(keep)).take(pa.array(sub.order, type=pa.int64()))
    items = pc.list_flatten(ordered)
    sizes = pc.list_value_length(ordered).to_numpy(zero_copy_only=False)
    owner = np.repeat(sub.sorted_ids, sizes.astype(np.int64))
    if distinct:
        picked = first_occurrences(owner, items)
        items, owner = items.take(pa.array(picked, type=pa.int64())), owner[picked]
    folded = list_array(list_type, np.bincount(owner, minlength=sub.count), items)
    return keep_untouched(folded, states, keep, segments) if distinct else folded

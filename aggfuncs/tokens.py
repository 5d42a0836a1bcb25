"""First occurrence of each (group, value) pair: how the distinct options deduplicate."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

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

"""First occurrence of each (group, value) pair: how the distinct options deduplicate."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from tally.errors import InvalidInputError


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

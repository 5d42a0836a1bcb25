"""Bounds on the cells of the functions that grow without end: string_agg, array_agg and
merge_map.

Every other function keeps a cell of fixed size (or a bitmap whose size its ids bound), but a
string_agg, array_agg or merge_map cell grows with every write to its key, and a cell read, merged and
rewritten on each write costs its whole size each time. Each such column is therefore bounded,
by its function parameters (options `fields.<col>.max-cell-bytes` and
`fields.<col>.max-elements`):

- `max-cell-bytes` (default 16 MiB, '0' for none): the bytes of the value readers see, the
  joined string of a string_agg, the elements of an array_agg, the keys and values of a
  merge_map (their Arrow bytes);
- `max-elements` (array_agg, merge_map; default none): the elements (entries) of one cell.

A merge that would make a cell pass either is refused with an InvalidInputError naming the
column, before anything is applied.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tally.errors import InvalidAggFunctionError, InvalidInputError, InvalidOptionError
from tally.sizes import parse_size

MAX_CELL_BYTES = "max-cell-bytes"
MAX_ELEMENTS = "max-elements"
DEFAULT_MAX_CELL_BYTES = 16 << 20


def parse_cell_bytes(name: str, value) -> int:
    """A byte size ('16mb', 1048576; 0: no bound)."""
    if isinstance(value, bool):
        raise InvalidAggFunctionError(f"Parameter '{name}' must be a size, not {value!r}")
    try:
        return parse_size(name, value)
    except InvalidOptionError as e:
        raise InvalidAggFunctionError(str(e)) from None


def parse_elements(name: str, value) -> int:
    """A count of elements (0: no bound)."""
    text = str(value).strip()
    if isinstance(value, bool) or not text.isdigit():
        raise InvalidAggFunctionError(
            f"Parameter '{name}' must be a non-negative integer (0 for no bound), not {value!r}")
    return int(text)


def _element_bytes(values: pa.Array) -> np.ndarray:
    """The bytes of each element of `values` (variable width: their data; else their width)."""
    kind = values.type
    if pa.types.is_string(kind) or pa.types.is_large_string(kind) or \
            pa.types.is_binary(kind) or pa.types.is_large_binary(kind):
        return pc.fill_null(pc.binary_length(values), 0).to_numpy().astype(np.float64)
    try:
        width = kind.bit_width  # a bool takes an eighth of a byte, as in Arrow's own buffers
    except ValueError:  # nested and other variable-width types: each element's own buffers
        return np.array([values.slice(i, 1).nbytes for i in range(len(values))], dtype=np.float64)
    return np.full(len(values), width / 8, dtype=np.float64)


def list_cell_sizes(lists: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """(elements, bytes of those elements) of each cell of a list array."""
    offsets = lists.offsets.to_numpy().astype(np.int64)
    starts, ends = offsets[:-1], offsets[1:]
    sums = np.concatenate([[0], np.cumsum(_element_bytes(lists.values))])
    counts = np.where(lists.is_valid().to_numpy(zero_copy_only=False), ends - starts, 0)
    return counts, np.where(counts > 0, sums[ends] - sums[starts], 0)


def map_cell_sizes(sizes: np.ndarray, keys: pa.Array,
                   values: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """(entries, bytes of their keys and values) of each map cell, given its entries."""
    owner = np.repeat(np.arange(len(sizes)), sizes)
    each = _element_bytes(keys) + _element_bytes(values)
    return sizes, np.bincount(owner, weights=each, minlength=len(sizes))


def refuse_over(column: str, function: str, sizes: np.ndarray, limit: int, what: str,
                option: str) -> None:
    """InvalidInputError naming the column when any cell's size passes `limit` (0: none)."""
    if not limit or not len(sizes):
        return
    worst = int(sizes.max())
    if worst > limit:
        raise InvalidInputError(
            f"Column '{column}' ({function}): a cell would hold {worst:,} {what}, over the "
            f"column's {option} of {limit:,} (option 'fields.{column}.{option}'). Nothing was "
            "applied.")

"""string_agg (alias listagg): non-null strings joined with a delimiter, optionally distinct.

A token is a piece of an input cut at each occurrence of the delimiter, scanning left to right
("a:::" with "::" gives "a" and ":"), so a token never contains the delimiter. The joined string
is an exact state only when cutting it again gives back its tokens, which holds unless the
delimiter overlaps itself (a proper prefix equals a proper suffix: "::", "||", "aba"): "a:" and
"" join to "a:::", which cuts into "a" and ":", so a distinct merge or a retraction would see
other tokens depending on how rows fell into writes. For such delimiters the state keeps the
tokens apart (a list of strings) and readers see their join. Inputs may also be token lists,
which is how pre-aggregated states and undo images are sent exactly.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from aggfuncs.base import Aggregator, parse_bool, valid_mask
from aggfuncs.cell_limits import (DEFAULT_MAX_CELL_BYTES, MAX_CELL_BYTES, list_cell_sizes,
                                  parse_cell_bytes, refuse_over)
from aggfuncs.functions import AggFunction
from aggfuncs.group_joins import join_groups
from aggfuncs.segments import Segments
from aggfuncs.tokens import apply_items, fold_lists
from tally.errors import InvalidAggFunctionError, InvalidInputError

# The most bytes an Arrow string array holds (int32 offsets); large_string holds more.
STRING_COLUMN_BYTES = 2**31 - 1


def parse_delimiter(name: str, value: Any) -> str:
    if not isinstance(value, str) or value == "":
        raise InvalidAggFunctionError(
            f"Parameter '{name}' for aggregation function 'string_agg' must be a non-empty "
            f"string but was {value!r}"
        )
    return value


def self_overlapping(delimiter: str) -> bool:
    """Whether a proper prefix of the delimiter equals a proper suffix ("::", "aba")."""
    return any(delimiter[:k] == delimiter[-k:] for k in range(1, len(delimiter)))


def _is_list(arrow_type: pa.DataType) -> bool:
    return pa.types.is_list(arrow_type) or pa.types.is_large_list(arrow_type)


class StringAggAggregator(Aggregator):
    function = AggFunction.STRING_AGG
    type_names = "string, large_string"
    parameters = {"delimiter": parse_delimiter, "distinct": parse_bool,
                  MAX_CELL_BYTES: parse_cell_bytes}
    defaults = {"delimiter": ",", "distinct": False, MAX_CELL_BYTES: DEFAULT_MAX_CELL_BYTES}

    retractable = True

    @staticmethod
    def accepts(arrow_type: pa.DataType) -> bool:
        return pa.types.is_string(arrow_type) or pa.types.is_large_string(arrow_type)

    @property
    def tokenized(self) -> bool:
        return self_overlapping(self.params["delimiter"])

    @property
    def folds_one_as_state(self) -> bool:
        """One string is its own join; distinct ones drop repeated tokens, token lists are
        lists."""
        return not self.params["distinct"] and not self.tokenized

    @property
    def state_type(self) -> pa.DataType:
        return pa.list_(self.type) if self.tokenized else self.type

    def values(self, states: pa.Array) -> pa.Array:
        return pc.binary_join(states, self.params["delimiter"]).cast(self.type) \
            if self.tokenized else states

    # --- inputs -----------------------------------------------------------------------------

    def input_type(self, given: pa.DataType) -> pa.DataType:
        return pa.list_(self.type) if _is_list(given) else self.type

    def python_inputs(self, values: list) -> tuple[list, pa.DataType]:
        """Token lists are taken as such (pre-aggregated states and undo images come so); where
        any is given, a string among them stands for its tokens."""
        if not any(isinstance(v, (list, tuple)) for v in values):
            return values, self.type
        delimiter = self.params["delimiter"]
        return [v.split(delimiter) if isinstance(v, str) else v for v in values], \
            pa.list_(self.type)

    def to_state(self, values: pa.Array) -> pa.Array:
        if _is_list(values.type):
            tokens = self._checked(values)
            return tokens if self.tokenized else self.values_of_tokens(tokens)
        if not self.tokenized:
            return values
        return pc.split_pattern(values, self.params["delimiter"]).cast(self.state_type)

    from_merge_state = to_state
    overwrite = to_state

    def values_of_tokens(self, tokens: pa.Array) -> pa.Array:
        return pc.binary_join(tokens, self.params["delimiter"]).cast(self.type)

    def _checked(self, lists: pa.Array) -> pa.Array:
        """Token lists as states: an empty list contributes nothing (null); a null token, or a
        token holding the delimiter (no cut gives it), is an error naming the column."""
        tokens = pc.list_flatten(lists)
        if tokens.null_count:
            raise InvalidInputError(
                f"Column '{self.column}' (string_agg) takes token lists without nulls")
        inside = pc.match_substring(tokens, self.params["delimiter"])
        if pc.any(inside).as_py():
            bad = tokens.filter(inside)[0].as_py()
            raise InvalidInputError(
                f"Column '{self.column}' (string_agg): the token {bad!r} contains the delimiter "
                f"{self.params['delimiter']!r}; a token is a piece between delimiters")
        empty = pc.fill_null(pc.equal(pc.list_value_length(lists), 0), False)
        return pc.if_else(empty, pa.nulls(len(lists), lists.type), lists).cast(pa.list_(self.type))

    def check_cells(self, states: pa.Array) -> None:
        """The joined string of each cell within max-cell-bytes."""
        limit = self.params[MAX_CELL_BYTES]
        if not limit:
            return
        if self.tokenized:  # the join adds a delimiter between tokens
            offsets = states.offsets
            tokens = offsets[len(offsets) - 1].as_py() - offsets[0].as_py() if len(states) else 0
            if states.nbytes + tokens * len(self.params["delimiter"].encode()) <= limit:
                return
            counts, sizes = list_cell_sizes(states)
            sizes = sizes + np.maximum(counts - 1, 0) * len(self.params["delimiter"].encode())
        elif states.nbytes <= limit:
            return
        else:
            sizes = pc.fill_null(pc.binary_length(states), 0).to_numpy()
        refuse_over(self.column, self.name, sizes, limit, "bytes", MAX_CELL_BYTES)

    # --- folding ----------------------------------------------------------------------------

    def step(self, acc, value, sign):
        """Tokens so far (a list); a retraction removes the last occurrence of each token."""
        if value is None:
            return acc
        items = value if isinstance(value, list) else value.split(self.params["delimiter"])
        return apply_items(acc, items, sign, self.params["distinct"], self.column)

    def finish(self, acc):
        if not acc:
            return None
        return acc if self.tokenized else self.params["delimiter"].join(acc)

    def fold(self, states: pa.Array, written: np.ndarray, segments: Segments) -> pa.Array:
        delimiter, distinct = self.params["delimiter"], self.params["distinct"]
        if self.tokenized:
            return fold_lists(states, written, segments, distinct, self.state_type)
        if distinct:  # the joined string cuts back into exactly its tokens
            lists = pc.split_pattern(states, delimiter)
            return self.values_of_tokens(fold_lists(lists, written, segments, True, lists.type))
        return self._joined(segments.count, [(states, written, segments.group_ids)])

    def fold_onto(self, stored, stored_written, states, segments) -> pa.Array | None:
        """Plain strings (neither distinct nor token lists): the stored string, the delimiter
        and the inputs' join, or whichever of the two exists."""
        if self.params["distinct"] or self.tokenized:
            return None
        return self._joined(len(stored), [
            (stored, stored_written, np.arange(len(stored), dtype=np.int64)),
            (states, np.ones(len(states), dtype=bool), segments.group_ids)])

    def _joined(self, count: int, sources: list[tuple[pa.Array, np.ndarray, np.ndarray]]):
        """Per group 0..count-1, the strings of `sources` it holds joined with the delimiter
        (null for a group with none), in one pass over the bytes (aggfuncs.group_joins).
        `sources`: (strings, whether each was written, its group) in fold order; the null
        rule leaves out unwritten and null strings."""
        parts = [(*_string_buffers(strings), (written & valid_mask(strings)).view(np.uint8),
                  np.ascontiguousarray(groups, dtype=np.int64))
                 for strings, written, groups in sources]
        offsets, data, found = join_groups(parts, count, self.params["delimiter"].encode())
        large = pa.types.is_large_string(self.type)
        if not large and offsets[-1] > STRING_COLUMN_BYTES:
            raise InvalidInputError(
                f"Column '{self.column}' (string_agg): the strings one write joins come to "
                f"{int(offsets[-1]):,} bytes, more than a string column holds (2 GiB); write "
                "fewer rows at a time or make the column large_string. Nothing was applied.")
        validity = None if found.all() else pa.array(found).buffers()[1]
        return pa.Array.from_buffers(
            pa.large_string() if large else pa.string(), count,
            [validity, pa.py_buffer(offsets if large else offsets.astype(np.int32)),
             pa.py_buffer(data)]).cast(self.type)


def _string_buffers(strings: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """A string array's offsets (of its slice) and data bytes as numpy, without copying."""
    width = np.int64 if pa.types.is_large_string(strings.type) else np.int32
    _, offsets, data = strings.buffers()
    if offsets is None:  # an array of nulls only
        return np.zeros(len(strings) + 1, dtype=width), np.zeros(0, dtype=np.uint8)
    offsets = np.frombuffer(offsets, dtype=width)[strings.offset:strings.offset + len(strings) + 1]
    return offsets, np.zeros(0, dtype=np.uint8) if data is None else \
        np.frombuffer(data, dtype=np.uint8)

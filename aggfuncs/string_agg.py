"""string_agg (alias listagg): non-null strings joined with a delimiter, optionally distinct."""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from aggfuncs.base import Aggregator, keep_untouched, parse_bool, valid_mask
from aggfuncs.functions import AggFunction
from aggfuncs.segments import Segments
from aggfuncs.tokens import apply_items, first_occurrences
from tally.errors import InvalidAggFunctionError



def parse_delimiter(name: str, value: Any) -> str:
    if not isinstance(value, str) or value == "":
        raise InvalidAggFunctionError(
            f"Parameter '{name}' for aggregation function 'string_agg' must be a non-empty "
            f"string but was {value!r}"
        )
    return value


class StringAggAggregator(Aggregator):
    function = AggFunction.STRING_AGG
    type_names = "string, large_string"
    parameters = {"delimiter": parse_delimiter, "distinct": parse_bool}
    defaults = {"delimiter": ",", "distinct": False}

    retractable = True

    @staticmethod
    def accepts(arrow_type: pa.DataType) -> bool:
        return pa.types.is_string(arrow_type) or pa.types.is_large_string(arrow_type)

    def step(self, acc, value, sign):
        """Tokens so far (a list); a retraction removes the last occurrence of each token."""
        if value is None:
            return acc
        return apply_items(acc, value.split(self.params["delimiter"]), sign,
                           self.params["distinct"], self.column)

    def finish(self, acc):
        return self.params["delimiter"].join(acc) if acc else None

    def fold(self, states: pa.Array, written: np.ndarray, segments: Segments) -> pa.Array:
        keep = written & valid_mask(states)
        sub = segments.filtered(keep)
        ordered = states.filter(pa.array(keep)).take(pa.array(sub.order, type=pa.int64()))
        delimiter = self.params["delimiter"]
        if self.params["distinct"]:
            parts = pc.split_pattern(ordered, delimiter)
            tokens = pc.list_flatten(parts)
            owner = np.repeat(sub.sorted_ids, pc.list_value_length(parts).to_numpy())
            picked = first_occurrences(owner, tokens)
            tokens, owner = tokens.take(pa.array(picked, type=pa.int64())), owner[picked]
            lengths = np.bincount(owner, minlength=sub.count)
        else:
            tokens, lengths = ordered, sub.lengths
        has = sub.lengths > 0
        offsets = pa.array(np.concatenate([[0], np.cumsum(lengths)]), type=pa.int32())
        lists = pa.ListArray.from_arrays(offsets, tokens, mask=pa.array(~has))
        joined = pc.binary_join(lists, delimiter).cast(self.type)
        return keep_untouched(joined, states, keep, segments) if self.params["distinct"] else joined

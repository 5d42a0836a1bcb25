"""top_k: a binary column holding an Apache DataSketches frequent-items sketch of strings.

A cell holds the serialized image of one frequent-items sketch (DataSketches' "frequent
strings" sketch: the format Java's `ItemsSketch<String>` with `ArrayOfStringsSerDe` reads).
Writes bring sketch images or raw values: strings, or integers (counted as their decimal
strings, so 7 and "7" are one item). A merge adds the sketches' counts; while a cell holds at
most 0.75 * 2^lg-max-map-size distinct items the counts are exact, beyond it the sketch purges
its smallest counts and every estimate carries DataSketches' bounds: lower bound <= true count
<= upper bound, the two at most epsilon * (total weight) apart, epsilon = 3.5 / 2^lg-max-map-size.

Parameters: `k` (1..65535, default 10), how many items a read returns; `lg-max-map-size`
(3..21, default 10: 768 items exact, epsilon 0.34%), the sketch's size. A merge of an image
of another size keeps the column's size. A sketch cannot take a count back exactly, so
retractions are refused (or ignored with `ignore-retract`).
"""

from __future__ import annotations

import pyarrow as pa

from aggfuncs.functions import AggFunction
from aggfuncs.sketch_images import canonical_frequent_items
from aggfuncs.sketches import SketchAggregator, int_between
from tally.errors import InvalidInputError

LG_MAX_MAP_SIZE = "lg-max-map-size"
# What a read of estimates gives per cell: the top items, highest estimate first.
TOP_K_ESTIMATE_TYPE = pa.list_(pa.struct([
    pa.field("item", pa.string()), pa.field("estimate", pa.int64()),
    pa.field("lower_bound", pa.int64()), pa.field("upper_bound", pa.int64())]))


def _text_or_integer(arrow_type: pa.DataType) -> bool:
    return (pa.types.is_string(arrow_type) or pa.types.is_large_string(arrow_type)
            or pa.types.is_integer(arrow_type))


def frequent_items(sketch, k: int) -> list[dict]:
    """The `k` items of a sketch with the highest estimates (ties by item), each with its
    estimate and bounds: the items whose upper bound passes the sketch's maximum error (no
    item that frequent is missed)."""
    import datasketches

    found = sketch.get_frequent_items(datasketches.frequent_items_error_type.NO_FALSE_NEGATIVES)
    found.sort(key=lambda entry: (-entry[1], entry[0]))
    return [{"item": item, "estimate": estimate, "lower_bound": lower, "upper_bound": upper}
            for item, estimate, lower, upper in found[:k]]


class TopKAggregator(SketchAggregator):
    function = AggFunction.TOP_K
    kind = "a frequent-items sketch of strings"
    parameters = {"k": int_between(1, 65535), LG_MAX_MAP_SIZE: int_between(3, 21)}
    defaults = {"k": 10, LG_MAX_MAP_SIZE: 10}

    takes_raw = staticmethod(_text_or_integer)

    def raw_type(self, given: pa.DataType) -> pa.DataType:
        return pa.string()  # integers as their decimal strings

    def _new(self):
        import datasketches

        return datasketches.frequent_strings_sketch(self.params[LG_MAX_MAP_SIZE])

    def item_text(self, value) -> str:
        """A raw Python item as the sketch counts it, or an error naming it."""
        if isinstance(value, str):
            return value
        if isinstance(value, int) and not isinstance(value, bool):
            return str(value)
        raise InvalidInputError(
            f"Column '{self.column}' ({self.name}) counts strings or integers, not {value!r}")

    def sketch_of(self, values: list) -> bytes:
        sketch = self._new()
        for value in values:
            sketch.update(self.item_text(value))
        return canonical_frequent_items(sketch.serialize())

    def parse(self, data: bytes):
        import datasketches

        return datasketches.frequent_strings_sketch.deserialize(data)

    def merge(self, sketches: list) -> bytes:
        merged = self._new()
        for sketch in sketches:
            merged.merge(sketch)
        return canonical_frequent_items(merged.serialize())

    def top_items(self, data: bytes | None) -> list[dict] | None:
        """The top `k` items of an image with their estimates and bounds (None for None)."""
        return None if data is None else frequent_items(self.load(data), self.params["k"])

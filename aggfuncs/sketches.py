"""hll_sketch, theta_sketch and kll_sketch: binary columns holding Apache DataSketches images.

A cell holds the serialized image of one sketch, in the format every DataSketches library reads
(Spark's `hll_sketch_estimate`, `theta_sketch_estimate` and `kll_sketch_get_quantile_*` among
them). Writes bring either sketch images (a binary column: what Spark's `hll_sketch_agg`,
`theta_sketch_agg` or `kll_sketch_agg_*` made, or what `build_*_sketch` makes) or raw values
(each row adds its value). The `datasketches` package merges them: an HLL union, a theta union,
a KLL merge. Sketches cannot take back a contribution, so retractions are refused.

Parameters and mismatches follow DataSketches:
- hll_sketch: `lg-k` (4..21, default 12) and `target-type` (HLL_4, HLL_6, HLL_8; default
  HLL_4). A union keeps the smaller lg_k of what it merges: a stored sketch merged with one of
  a smaller lg_k drops to it (its error grows accordingly); a larger one is folded down.
- theta_sketch: `lg-k`, the log2 of the nominal entries (5..26, default 12; the C++ library behind the
  `datasketches` package refuses 4, which Spark allows). A union keeps the
  smallest theta it meets and at most 2^lg-k entries of the column's lg-k. Sketches must use the
  default seed (9001): another seed is refused, as DataSketches refuses it.
- kll_sketch: `k` (8..65535, default 200) and `items` (double, float or bigint; default
  double: Spark's KllDoublesSketch, KllFloatsSketch and KllLongsSketch). A merge keeps the
  smallest k seen as the sketch's error bound (min_k).
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np
import pyarrow as pa

from aggfuncs.base import Aggregator, fold_cells
from aggfuncs.functions import AggFunction
from aggfuncs.segments import Segments
from aggfuncs.sketch_images import canonical_hll, canonical_kll
from tally.errors import InvalidAggFunctionError, InvalidInputError


def _is_binary(arrow_type: pa.DataType) -> bool:
    return pa.types.is_binary(arrow_type) or pa.types.is_large_binary(arrow_type)


def int_between(low: int, high: int):
    """A parser of an integer parameter in [low, high], given as an int or an option string."""

    def parse(name: str, value: Any) -> int:
        try:
            number = int(str(value).strip()) if not isinstance(value, bool) else None
        except ValueError:
            number = None
        if number is None or not low <= number <= high:
            raise InvalidAggFunctionError(
                f"Parameter '{name}' must be an integer in [{low}, {high}] but was {value!r}")
        return number

    return parse


def one_of(*choices: str):
    """A parser of a parameter that names one of `choices` (case-insensitive)."""

    def parse(name: str, value: Any) -> str:
        text = str(value).strip().upper()
        if text not in choices:
            raise InvalidAggFunctionError(
                f"Parameter '{name}' must be one of {list(choices)} but was {value!r}")
        return text

    return parse


def _is_raw(value) -> bool:
    return value is not None and not isinstance(value, (bytes, bytearray))


class SketchAggregator(Aggregator):
    """A binary column of sketch images; subclasses say how to build, load and merge them."""

    type_names = "binary, large_binary"
    accepts = staticmethod(_is_binary)
    kind: ClassVar[str]  # what the bytes must be, for messages
    estimated = True

    # --- what subclasses provide --------------------------------------------------------

    def takes_raw(self, arrow_type: pa.DataType) -> bool:
        """Whether an input of this type is raw values (each row adds its value)."""
        raise NotImplementedError

    def raw_type(self, given: pa.DataType) -> pa.DataType:
        """The type raw values are cast to before they are added."""
        return given

    def sketch_of(self, values: list) -> bytes:
        """The canonical image of a sketch of these (non-null) raw values."""
        raise NotImplementedError

    def parse(self, data: bytes):
        """The sketch of an image (raise on bytes that are none)."""
        raise NotImplementedError

    def merge(self, sketches: list) -> bytes:
        """The canonical image of the merge of these sketches."""
        raise NotImplementedError

    # --- the Aggregator protocol --------------------------------------------------------

    def input_type(self, given: pa.DataType) -> pa.DataType:
        return self.raw_type(given) if self.takes_raw(given) else self.type

    def takes_type(self, given, widens, states=False, replaces=False) -> bool:
        """Sketch images, or raw values each row adds (replacing: the sketch of that value)."""
        return widens(given, self.type) or self.takes_raw(given)

    def python_inputs(self, values: list) -> tuple[list, pa.DataType]:
        """Raw values (numbers, strings) are taken too: each becomes a one-value sketch."""
        if any(_is_raw(v) for v in values):
            values = [self._one_value_image(v) if _is_raw(v) else v for v in values]
        return values, self.type

    def _one_value_image(self, value) -> bytes:
        """The one-value sketch of a raw Python value, or an error naming it."""
        try:
            raw = pa.array([value])
        except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError, OverflowError):
            raw = None
        if raw is None or not self.takes_raw(raw.type):
            raise InvalidInputError(
                f"Column '{self.column}' ({self.name}) takes sketch images (bytes) or raw "
                f"values it can add, not {value!r}")
        return self.sketch_of(self.cast_input(raw).to_pylist())

    def load(self, data: bytes):
        try:
            return self.parse(bytes(data))
        except (ValueError, RuntimeError, TypeError, IndexError, OverflowError) as exc:
            raise InvalidInputError(
                f"Column '{self.column}' ({self.name}) got {len(data)} bytes that are not "
                f"{self.kind} ({exc})") from None

    def raw_image(self, value) -> bytes:
        """The image of a sketch of one raw value, not yet canonical: every fold merges (and
        so canonicalises) whatever it folds, and this skips a union per row."""
        return self.sketch_of([value])

    def to_state(self, values: pa.Array) -> pa.Array:
        if _is_binary(values.type):
            return values
        return pa.array([None if v is None else self.raw_image(v) for v in values.to_pylist()],
                        type=self.type)

    from_merge_state = to_state

    def overwrite(self, values: pa.Array) -> pa.Array:
        """Images replace the cell byte for byte (undo writes before-images back this way);
        they must still be sketches of this column's kind. A raw value stores its sketch."""
        if not _is_binary(values.type):
            return pa.array([None if v is None else self.sketch_of([v])
                             for v in values.to_pylist()], type=self.type)
        for data in values.to_pylist():
            if data is not None:
                self.load(data)
        return values

    def fold(self, states: pa.Array, written: np.ndarray, segments: Segments) -> pa.Array:
        return fold_cells(states, written, segments,
                          lambda cells: self.merge([self.load(c) for c in cells]), self.type)


def _numeric_or_text(arrow_type: pa.DataType) -> bool:
    return (pa.types.is_integer(arrow_type) or pa.types.is_floating(arrow_type)
            or pa.types.is_string(arrow_type) or pa.types.is_large_string(arrow_type))


class HllSketchAggregator(SketchAggregator):
    function = AggFunction.HLL_SKETCH
    kind = "an HLL sketch"
    parameters = {"lg-k": int_between(4, 21), "target-type": one_of("HLL_4", "HLL_6", "HLL_8")}
    defaults = {"lg-k": 12, "target-type": "HLL_4"}

    takes_raw = staticmethod(_numeric_or_text)

    def _target(self):
        import datasketches

        return getattr(datasketches.tgt_hll_type, self.params["target-type"])

    def raw_image(self, value) -> bytes:
        import datasketches

        sketch = datasketches.hll_sketch(self.params["lg-k"], self._target())
        sketch.update(value)
        return sketch.serialize_compact()

    def sketch_of(self, values: list) -> bytes:
        import datasketches

        sketch = datasketches.hll_sketch(self.params["lg-k"], self._target())
        # Integers hash as 64-bit longs, floats as doubles, strings as their UTF-8 bytes: the
        # way Spark's hll_sketch_agg updates, so the same values give the same registers.
        for value in values:
            sketch.update(value)
        return self.merge([sketch])

    def parse(self, data: bytes):
        import datasketches

        return datasketches.hll_sketch.deserialize(data)

    def merge(self, sketches: list) -> bytes:
        import datasketches

        union = datasketches.hll_union(self.params["lg-k"])
        for sketch in sketches:
            union.update(sketch)
        return canonical_hll(union.get_result(self._target()).serialize_compact())


class ThetaSketchAggregator(SketchAggregator):
    function = AggFunction.THETA_SKETCH
    kind = "a compact theta sketch"
    parameters = {"lg-k": int_between(5, 26)}
    defaults = {"lg-k": 12}

    takes_raw = staticmethod(_numeric_or_text)

    def raw_image(self, value) -> bytes:
        import datasketches

        sketch = datasketches.update_theta_sketch(self.params["lg-k"])
        sketch.update(value)
        return sketch.compact().serialize()

    def sketch_of(self, values: list) -> bytes:
        import datasketches

        sketch = datasketches.update_theta_sketch(self.params["lg-k"])
        for value in values:
            sketch.update(value)
        return self.merge([sketch.compact()])

    def parse(self, data: bytes):
        import datasketches

        return datasketches.compact_theta_sketch.deserialize(data)

    def merge(self, sketches: list) -> bytes:
        import datasketches

        union = datasketches.theta_union(self.params["lg-k"])
        for sketch in sketches:
            union.update(sketch)
        # Compressed (format 4), ordered: the form Spark's theta_sketch_agg writes.
        return union.get_result().serialize(True)


# items parameter -> (datasketches class name, struct code of one item, Arrow type of raw values)
KLL_ITEMS = {
    "DOUBLE": ("kll_doubles_sketch", "d", pa.float64()),
    "FLOAT": ("kll_floats_sketch", "f", pa.float32()),
    "BIGINT": ("kll_items_sketch", "q", pa.int64()),
}


def kll_class(items: str):
    import datasketches

    return getattr(datasketches, KLL_ITEMS[items][0])


def kll_load(data: bytes, items: str):
    """The KLL sketch of an image of `items` (bigint images hold 64-bit longs)."""
    import datasketches

    if items == "BIGINT":
        return datasketches.kll_items_sketch.deserialize(data, datasketches.PyLongsSerDe())
    return kll_class(items).deserialize(data)


def kll_image(sketch, items: str) -> bytes:
    """The canonical image of a KLL sketch of `items`."""
    import datasketches

    data = sketch.serialize(datasketches.PyLongsSerDe()) if items == "BIGINT" \
        else sketch.serialize()
    return canonical_kll(data, KLL_ITEMS[items][1])


class KllSketchAggregator(SketchAggregator):
    function = AggFunction.KLL_SKETCH
    parameters = {"k": int_between(8, 65535), "items": one_of(*KLL_ITEMS)}
    defaults = {"k": 200, "items": "DOUBLE"}

    @property
    def kind(self) -> str:
        return f"a KLL sketch of {self.params['items'].lower()} items"

    @staticmethod
    def takes_raw(arrow_type: pa.DataType) -> bool:
        return pa.types.is_integer(arrow_type) or pa.types.is_floating(arrow_type)

    def raw_type(self, given: pa.DataType) -> pa.DataType:
        return KLL_ITEMS[self.params["items"]][2]

    def _new(self):
        return kll_class(self.params["items"])(self.params["k"])

    def sketch_of(self, values: list) -> bytes:
        sketch = self._new()
        for value in values:
            sketch.update(value)
        return kll_image(sketch, self.params["items"])

    def parse(self, data: bytes):
        # The format does not record the item type: bytes of another type read as garbage
        # values, not as an error (the `items` parameter must match the writer's sketch).
        return kll_load(data, self.params["items"])

    def merge(self, sketches: list) -> bytes:
        merged = self._new()
        for sketch in sketches:
            merged.merge(sketch)
        return kll_image(merged, self.params["items"])

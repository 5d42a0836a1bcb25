"""rbm32 and rbm64: binary columns holding portable roaring bitmaps, merged by union.

rbm32 holds the portable 32-bit RoaringBitmap format (the spec CRoaring, pyroaring's `BitMap`
and Java's `RoaringBitmap.serialize` share). rbm64 holds the portable 64-bit format of CRoaring
and pyroaring's `BitMap64` — not the layout of Java's `Roaring64Bitmap` (which Fluss uses), so
bytes from a Java `Roaring64Bitmap` are rejected rather than misread.

Inputs may also be integers (one id per row: a Spark integer column folded into a bitmap), and
are turned into bitmaps here. Every merged bitmap is run-optimised before it is serialised, so the
same set always gives the same bytes. Bitmaps cannot take back a contribution (no retraction).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from aggfuncs.base import Aggregator, fold_cells
from aggfuncs.functions import AggFunction
from aggfuncs.segments import Segments
from tally.errors import InvalidInputError


def _is_binary(arrow_type: pa.DataType) -> bool:
    return pa.types.is_binary(arrow_type) or pa.types.is_large_binary(arrow_type)


def _is_id(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


class _BitmapAggregator(Aggregator):
    type_names = "binary, large_binary"
    accepts = staticmethod(_is_binary)
    bits: int

    @classmethod
    def bitmap_class(cls):
        from pyroaring import BitMap, BitMap64

        return BitMap if cls.bits == 32 else BitMap64

    def input_type(self, given: pa.DataType) -> pa.DataType:
        return given if pa.types.is_integer(given) else self.type

    def python_inputs(self, values: list) -> tuple[list, pa.DataType]:
        """Integer ids are taken too: each becomes a one-id bitmap."""
        if any(_is_id(v) for v in values):
            values = [self.to_state(pa.array([v])).to_pylist()[0] if _is_id(v) else v
                      for v in values]
        return values, self.type

    def to_state(self, values: pa.Array) -> pa.Array:
        if not pa.types.is_integer(values.type):
            return values
        limit = (1 << self.bits) - 1
        ints = values.to_pylist()
        bad = next((v for v in ints if v is not None and not 0 <= v <= limit), None)
        if bad is not None:
            raise InvalidInputError(
                f"Column '{self.column}' ({self.name}) takes ids in [0, {limit}], got {bad}")
        make = self.bitmap_class()
        return pa.array([None if v is None else self._bytes(make([v])) for v in ints],
                        type=self.type)

    from_merge_state = to_state
    overwrite = to_state

    def _bytes(self, bitmap) -> bytes:
        bitmap.run_optimize()
        return bitmap.serialize()

    def load(self, data: bytes):
        try:
            return self.bitmap_class().deserialize(data)
        except (ValueError, TypeError):
            raise InvalidInputError(
                f"Column '{self.column}' ({self.name}) got {len(data)} bytes that are not a "
                f"portable {self.bits}-bit roaring bitmap") from None

    def fold(self, states: pa.Array, written: np.ndarray, segments: Segments) -> pa.Array:
        return fold_cells(states, written, segments, lambda cells: self._bytes(
            self.bitmap_class().union(*[self.load(c) for c in cells])), self.type)


class Rbm32Aggregator(_BitmapAggregator):
    function = AggFunction.RBM32
    bits = 32


class Rbm64Aggregator(_BitmapAggregator):
    function = AggFunction.RBM64
    bits = 64


def build_bitmap(ids, bits: int = 32) -> bytes:
    """The rbm32 (or rbm64) bytes of a collection of non-negative integer ids."""
    from pyroaring import BitMap, BitMap64

    bitmap = (BitMap if bits == 32 else BitMap64)(ids)
    bitmap.run_optimize()
    return bitmap.serialize()


def bitmap_ids(data: bytes, bits: int = 32) -> list[int]:
    """The ids held by rbm32 (or rbm64) bytes."""
    from pyroaring import BitMap, BitMap64

    return list((BitMap if bits == 32 else BitMap64).deserialize(data))

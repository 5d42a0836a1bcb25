"""One row as readers see it, as bytes: what a point lookup answers, read without Arrow.

Layout (little-endian), for a schema whose columns are all flat (no lists, maps or structs):

    null bits (1 = a value) | fixed-width values | uint32 length per variable-width column |
    variable-width bytes

It is the stored row format (merge_engine.format.rowcodec) without its bookkeeping (format version,
written bits, contribution counts, last-write time): a stored row of a table whose states are
its values (every column's state type is its type) becomes one by cutting those parts out,
with no decoding at all. Any other row (one in the row buffer, one whose states are not its
values, one of an older layout) is encoded from its visible Arrow arrays, a column at a time.
A null cell holds zero bytes, as in the stored format.

VisibleRowDecoder turns these bytes into the dict Arrow's `to_pylist` gives of the same row,
with struct and plain Python per column; the few types whose Python value is not plain
arithmetic (nanosecond times, half floats, intervals...) go through a one-value Arrow array.
"""

from __future__ import annotations

import datetime
import decimal
import struct
import zlib

import pyarrow as pa

from merge_engine.format.rowcodec import VERSION, RowCodec, value_kind


def flat(schema: pa.Schema) -> bool:
    """Whether every column of `schema` has a visible row layout (none is nested)."""
    return all(value_kind(f.type)[0] != "object" for f in schema)


def fingerprint(schema: pa.Schema) -> int:
    """A 32-bit mark of the column names and types: what the layout of a visible row of
    `schema` depends on, so a reader can tell it decodes a row with the writer's layout."""
    text = "\x1f".join(f"{f.name}\x1e{f.type}" for f in schema)
    return zlib.crc32(text.encode("utf-8"))


class _Layout:
    """Where each column's value sits in a visible row of a flat schema."""

    def __init__(self, schema: pa.Schema) -> None:
        if not flat(schema):
            raise ValueError(f"a visible row holds flat columns only, not {schema}")
        self.schema = schema
        self.names = schema.names
        self.types = [f.type for f in schema]
        self.kinds = [value_kind(t) for t in self.types]
        self.ncols = len(self.types)
        self.bitmap_bytes = (self.ncols + 7) // 8
        self.fixed = [i for i, (k, _) in enumerate(self.kinds) if k != "var"]
        self.var = [i for i, (k, _) in enumerate(self.kinds) if k == "var"]
        self.fixed_bytes = sum(self.kinds[i][1] for i in self.fixed)
        self.prefix = self.bitmap_bytes + self.fixed_bytes + 4 * len(self.var)
        self.fingerprint = fingerprint(schema)


class VisibleRows(_Layout):
    """A bucket's encoder of visible rows. `codec`: its current stored row format;
    `states_are_values`: whether every column's stored state is the value readers see (then a
    stored row is cut, not decoded)."""

    def __init__(self, schema: pa.Schema, codec: RowCodec, states_are_values: bool) -> None:
        super().__init__(schema)
        self.states_are_values = states_are_values
        self.codec = codec
        self._width = None if codec.version == VERSION else \
            codec.ncols.to_bytes(2, "little")
        h, b = codec.header, codec.bitmap_bytes
        self._cuts = (h + b, h + 2 * b + self.fixed_bytes, codec.lengths_offset)
        self._zeros = {w: bytes(w) for _, w in self.kinds}

    def of_stored(self, row: bytes) -> bytes | None:
        """The visible row of a stored row, cut out of it; None when it cannot be (states that
        are not their values, or a row of another layout than the current one)."""
        codec = self.codec
        if not self.states_are_values or len(row) < codec.prefix or row[0] != codec.version \
                or (self._width is not None and row[1:3] != self._width):
            return None
        nulls, fixed_end, lengths = self._cuts
        return row[nulls:fixed_end] + row[lengths:]

    def of_arrays(self, arrays: list, row: int = 0) -> bytes:
        """The visible row of row `row` of arrays (or chunked arrays) in column order, read
        where it is (a slice per column cost as much as the rest)."""
        valid = 0
        fixed: list = []
        lengths: list[int] = []
        values: list = []
        for i, array in enumerate(arrays):
            if isinstance(array, pa.ChunkedArray):
                array = array.combine_chunks()
            kind, width = self.kinds[i]
            buffers = array.buffers()
            at = array.offset + row
            present = array.null_count == 0 or _bit(buffers[0], at)
            if present:
                valid |= 1 << i
            if kind == "var":
                if present:
                    start, end = struct.unpack_from("<qq" if width == 8 else "<ii",
                                                    buffers[1], at * width)
                    lengths.append(end - start)
                    values.append(memoryview(buffers[2])[start:end] if end > start else b"")
                else:
                    lengths.append(0)
            elif not present:
                fixed.append(self._zeros[width])
            elif kind == "bool":
                fixed.append(b"\x01" if _bit(buffers[1], at) else b"\x00")
            else:
                fixed.append(memoryview(buffers[1])[at * width:(at + 1) * width])
        head = valid.to_bytes(self.bitmap_bytes, "little")
        return b"".join([head, *fixed, struct.pack(f"<{len(lengths)}I", *lengths), *values])


def _bit(bitmap: pa.Buffer, at: int) -> bool:
    return bool(memoryview(bitmap)[at >> 3] >> (at & 7) & 1)


class VisibleRowDecoder(_Layout):
    """A reader of visible rows of one schema, made once per schema: `decode` gives the dict
    `pa.RecordBatch.to_pylist()` gives of the same one-row batch."""

    def __init__(self, schema: pa.Schema) -> None:
        super().__init__(schema)
        codes, self._fixed_conversions = [], []
        for i in self.fixed:
            code, convert = _fixed_reader(self.types[i], self.kinds[i][1])
            codes.append(code)
            self._fixed_conversions.append(convert)
        self._fixed = struct.Struct("<" + "".join(codes))
        self._lengths = struct.Struct(f"<{len(self.var)}I")
        self._var_conversions = [_var_reader(self.types[i]) for i in self.var]

    def decode(self, row: bytes) -> dict:
        """The row's columns by name; ValueError when `row` is not a row of this layout."""
        if len(row) < self.prefix:
            raise ValueError(f"a row of {len(row)} bytes is shorter than its head "
                             f"({self.prefix} bytes)")
        b = self.bitmap_bytes
        valid = int.from_bytes(row[:b], "little")
        out = dict.fromkeys(self.names)
        names = self.names
        fixed = self._fixed.unpack_from(row, b)
        for i, raw, convert in zip(self.fixed, fixed, self._fixed_conversions):
            if valid >> i & 1:
                out[names[i]] = raw if convert is None else convert(raw)
        cursor = self.prefix
        lengths = self._lengths.unpack_from(row, b + self.fixed_bytes)
        if cursor + sum(lengths) != len(row):
            raise ValueError(f"a row of {len(row)} bytes does not hold the "
                             f"{sum(lengths)} bytes of values its head gives")
        for i, length, convert in zip(self.var, lengths, self._var_conversions):
            if valid >> i & 1:
                out[names[i]] = convert(row[cursor:cursor + length])
            cursor += length
        return out


_EPOCH = datetime.datetime(1970, 1, 1)
_EPOCH_DAY = datetime.date(1970, 1, 1).toordinal()
_MICROS = {"s": 1_000_000, "ms": 1_000, "us": 1}
_INT_CODES = {(8, True): "b", (8, False): "B", (16, True): "h", (16, False): "H",
              (32, True): "i", (32, False): "I", (64, True): "q", (64, False): "Q"}


def _fixed_reader(t: pa.DataType, width: int):
    """(struct code, conversion of the unpacked value or None) of a fixed-width column."""
    types = pa.types
    if types.is_boolean(t):
        return "?", None
    if types.is_integer(t):
        return _INT_CODES[(t.bit_width, types.is_signed_integer(t))], None
    if types.is_float32(t):
        return "f", None
    if types.is_float64(t):
        return "d", None
    if types.is_fixed_size_binary(t):
        return f"{width}s", None
    if types.is_decimal(t):
        return f"{width}s", _decimal(t.scale)
    if types.is_date32(t):
        return "i", lambda days: datetime.date.fromordinal(_EPOCH_DAY + days)
    micros = _MICROS.get(getattr(t, "unit", None))
    if micros is not None and types.is_timestamp(t):
        if t.tz is None:
            return "q", lambda v: _EPOCH + datetime.timedelta(microseconds=v * micros)
        zone = pa.scalar(0, type=t).as_py().tzinfo  # the zone object Arrow gives
        return "q", lambda v: zone.fromutc(
            (_EPOCH + datetime.timedelta(microseconds=v * micros)).replace(tzinfo=zone))
    if micros is not None and types.is_duration(t):
        return "q", lambda v: datetime.timedelta(microseconds=v * micros)
    if micros is not None and types.is_time(t):
        return ("i" if width == 4 else "q"), lambda v: _time_of(v * micros)
    # nanoseconds (pandas' types when pandas is there), half floats, dates in ms, intervals:
    # rare in a table, read as Arrow reads them
    return f"{width}s", lambda raw: pa.Array.from_buffers(
        t, 1, [None, pa.py_buffer(raw)])[0].as_py()


def _time_of(micros: int) -> datetime.time:
    seconds, micro = divmod(micros, 1_000_000)
    minutes, second = divmod(seconds, 60)
    hour, minute = divmod(minutes, 60)
    return datetime.time(hour, minute, second, micro)


def _decimal(scale: int):
    def convert(raw: bytes) -> decimal.Decimal:
        unscaled = int.from_bytes(raw, "little", signed=True)
        digits = tuple(int(d) for d in str(abs(unscaled)))
        return decimal.Decimal((unscaled < 0, digits, -scale))
    return convert


def _var_reader(t: pa.DataType):
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return lambda raw: raw.decode("utf-8")
    return bytes

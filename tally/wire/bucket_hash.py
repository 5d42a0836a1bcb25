"""The stable bucket function: which bucket of a table a row belongs to.

Clients bucket rows before sending them, and tablet servers check every row they receive, so the
function must give the same answer in every process, on every machine and every Python version.
Python's `hash` is salted per process and therefore never used. The function is defined on bytes:

    key encoding = for each bucket-key column, in order:
                       u32 little-endian length of the value's encoding, then the encoding
    value encoding = integers, dates, times, timestamps, durations: 8 bytes, the physical value
                       as a little-endian two's complement int64 (so int32 7 and int64 7 agree)
                     booleans: 1 byte (0 or 1)
                     floats: the 8 bytes of the IEEE float64 value
                     strings: UTF-8 bytes; binary: the bytes
                     decimals: the unscaled integer, 16 (decimal128) or 32 (decimal256) bytes LE
    hash   = fmix64(FNV-1a-64(key encoding))          (fmix64 is MurmurHash3's finalizer)
    bucket = hash % bucket_count

The implementation works on whole Arrow columns with numpy (one pass per byte position over the
rows still that long), so bucketing a million rows costs tens of milliseconds, not seconds; a
handful of rows (a lookup's key) is hashed with plain Python integers over the same bytes,
which is faster there. Tests hold both paths to a byte-by-byte reference.
Null key values are rejected: a primary key is never null.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tally.errors import InvalidInputError

FNV_OFFSET = np.uint64(0xCBF29CE484222325)
FNV_PRIME = np.uint64(0x100000001B3)
_C1 = np.uint64(0xFF51AFD7ED558CCD)
_C2 = np.uint64(0xC4CEB9FE1A85EC53)
_S33 = np.uint64(33)


def _feed_bytes(h: np.ndarray, byte_columns) -> np.ndarray:
    """FNV-1a over fixed positions: `byte_columns` yields one uint64 array (or scalar) per byte."""
    for b in byte_columns:
        h = (h ^ b) * FNV_PRIME
    return h


def _feed_fixed(h: np.ndarray, values: np.ndarray, width: int) -> np.ndarray:
    """Feed a length prefix `width` then `width` little-endian bytes of each uint64 value."""
    h = _feed_bytes(h, (np.uint64((width >> (8 * j)) & 0xFF) for j in range(4)))
    return _feed_bytes(h, ((values >> np.uint64(8 * j)) & np.uint64(0xFF) for j in range(width)))


def _feed_variable(h: np.ndarray, offsets: np.ndarray, data: np.ndarray) -> np.ndarray:
    """Feed a u32 length prefix then the bytes of each variable-length value.

    Rows are visited longest first, so the loop over byte position j touches only the rows
    longer than j and the total work is the number of bytes, however skewed the lengths.
    """
    starts = offsets[:-1].astype(np.int64)
    lengths = (offsets[1:] - offsets[:-1]).astype(np.int64)
    h = _feed_bytes(h, ((lengths.astype(np.uint64) >> np.uint64(8 * j)) & np.uint64(0xFF)
                        for j in range(4)))
    if len(lengths) == 0 or lengths.max() == 0:
        return h
    order = np.argsort(-lengths, kind="stable")
    sorted_lengths = lengths[order]
    sorted_starts = starts[order]
    hs = h[order]
    descending = -sorted_lengths  # ascending, for searchsorted
    data64 = data.astype(np.uint64)
    for j in range(int(sorted_lengths[0])):
        active = int(np.searchsorted(descending, -j, side="left"))  # rows with length > j
        hs[:active] = (hs[:active] ^ data64[sorted_starts[:active] + j]) * FNV_PRIME
    out = np.empty_like(h)
    out[order] = hs
    return out


def _fmix64(h: np.ndarray) -> np.ndarray:
    h = h ^ (h >> _S33)
    h = h * _C1
    h = h ^ (h >> _S33)
    h = h * _C2
    return h ^ (h >> _S33)


def _normalize(arr: pa.Array) -> pa.Array:
    if pa.types.is_dictionary(arr.type):
        arr = arr.dictionary_decode()
    if pa.types.is_string_view(arr.type):
        arr = arr.cast(pa.large_string())
    if pa.types.is_binary_view(arr.type):
        arr = arr.cast(pa.large_binary())
    return arr


def _canonical(arr: pa.Array, name: str):
    """A key column's canonical encoding, without copying the data:
    ("fixed", uint64 values, byte width) or ("var", offsets, bytes)."""
    arr = _normalize(arr)
    t = arr.type
    if arr.null_count:
        row = pc.index(pc.is_null(arr), True).as_py()
        raise InvalidInputError(f"primary-key column '{name}' is null in row {row}")
    n = len(arr)
    if pa.types.is_boolean(t):
        return "fixed", np.asarray(arr.to_numpy(zero_copy_only=False), dtype=np.uint64), 1
    if pa.types.is_integer(t) or pa.types.is_temporal(t):
        if pa.types.is_temporal(t):
            arr = arr.view(pa.int64() if t.bit_width == 64 else pa.int32())
        values = arr.to_numpy(zero_copy_only=False)
        if values.dtype.kind == "u":
            return "fixed", values.astype(np.uint64), 8
        return "fixed", values.astype(np.int64).view(np.uint64), 8
    if pa.types.is_floating(t):
        values = np.asarray(arr.cast(pa.float64()).to_numpy(zero_copy_only=False),
                            dtype=np.float64)
        return "fixed", values.view(np.uint64), 8
    if pa.types.is_string(t) or pa.types.is_binary(t) or pa.types.is_large_string(t) \
            or pa.types.is_large_binary(t):
        large = pa.types.is_large_string(t) or pa.types.is_large_binary(t)
        _, offsets_buf, data_buf = arr.buffers()
        offsets = np.frombuffer(offsets_buf, dtype=np.int64 if large else np.int32)
        offsets = offsets[arr.offset: arr.offset + n + 1]
        data = np.frombuffer(data_buf, dtype=np.uint8) if data_buf is not None \
            else np.zeros(0, np.uint8)
        return "var", offsets, data
    if pa.types.is_fixed_size_binary(t) or pa.types.is_decimal(t):
        width = t.byte_width
        data = np.frombuffer(arr.buffers()[1], dtype=np.uint8)[arr.offset * width:
                                                               (arr.offset + n) * width]
        return "var", np.arange(n + 1, dtype=np.int64) * width, data
    raise InvalidInputError(f"primary-key column '{name}' has type {t}, which cannot be bucketed")


def _feed_array(h: np.ndarray, arr: pa.Array, name: str) -> np.ndarray:
    """Feed one key column (a contiguous Array) into the running hashes `h`."""
    kind, a, b = _canonical(arr, name)
    if kind == "fixed":
        return _feed_fixed(h, a, b)
    return _feed_variable(h, a, b)


# --- a few rows: plain Python over the same canonical bytes (a lookup's single key) ----------

_M64 = (1 << 64) - 1
SMALL = 8  # below this many rows, Python integers beat numpy's per-call overhead


def _row_bytes(columns, i: int) -> bytes:
    out = bytearray()
    for kind, a, b in columns:
        if kind == "fixed":
            out += b.to_bytes(4, "little") + int(a[i]).to_bytes(8, "little")[:b]
        else:
            start, stop = int(a[i]), int(a[i + 1])
            out += (stop - start).to_bytes(4, "little") + b[start:stop].tobytes()
    return bytes(out)


def fnv_fmix(data: bytes) -> int:
    h = 0xCBF29CE484222325
    for byte in data:
        h = ((h ^ byte) * 0x100000001B3) & _M64
    h ^= h >> 33
    h = (h * 0xFF51AFD7ED558CCD) & _M64
    h ^= h >> 33
    h = (h * 0xC4CEB9FE1A85EC53) & _M64
    return h ^ (h >> 33)


def _hash_small(table, key_columns: list[str]) -> np.ndarray:
    columns = [_canonical(column, name) for name, column in _key_arrays(table, key_columns)]
    return np.array([fnv_fmix(_row_bytes(columns, i)) for i in range(table.num_rows)],
                    dtype=np.uint64)


def one_value_bytes(arr: pa.Array, name: str) -> bytes:
    """The length-prefixed canonical encoding of a one-value key column, read from its
    buffers without numpy (a point lookup's key; `_canonical` covers every other case)."""
    t = arr.type
    if arr.null_count:
        raise InvalidInputError(f"primary-key column '{name}' is null in row 0")
    if pa.types.is_integer(t) or (pa.types.is_temporal(t) and t.bit_width in (32, 64)):
        width = t.bit_width // 8
        data = memoryview(arr.buffers()[1])[arr.offset * width:(arr.offset + 1) * width]
        value = int.from_bytes(data, "little", signed=not pa.types.is_unsigned_integer(t))
        return _EIGHT + (value & _M64).to_bytes(8, "little")
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        data = arr[0].as_py().encode()
    elif pa.types.is_binary(t) or pa.types.is_large_binary(t):
        data = arr[0].as_py()
    elif pa.types.is_fixed_size_binary(t) or pa.types.is_decimal(t):
        width = t.byte_width
        data = bytes(memoryview(arr.buffers()[1])[arr.offset * width:(arr.offset + 1) * width])
    elif pa.types.is_boolean(t):
        data = b"\x01" if arr[0].as_py() else b"\x00"
    else:  # floats (NaN payloads as numpy casts them), views, dictionaries
        return _row_bytes([_canonical(arr, name)], 0)
    return len(data).to_bytes(4, "little") + data


_EIGHT = (8).to_bytes(4, "little")


def hash_keys(table: pa.Table | pa.RecordBatch, key_columns: list[str]) -> np.ndarray:
    """The 64-bit stable hash of each row's key (see the module docstring), as uint64."""
    n = table.num_rows
    names = table.schema.names
    for name in key_columns:
        if name not in names:
            raise InvalidInputError(f"primary-key column '{name}' is missing from the rows")
    if n == 1:
        return np.array([hash_one(table, key_columns)], dtype=np.uint64)
    if n < SMALL:
        return _hash_small(table, key_columns)
    return hash_keys_vectorized(table, key_columns)


def hash_one(table: pa.Table | pa.RecordBatch, key_columns: list[str]) -> int:
    """The hash of a one-row table's key in plain Python (tests compare it with the others)."""
    return fnv_fmix(b"".join(one_value_bytes(column, name)
                             for name, column in _key_arrays(table, key_columns)))


def _key_arrays(table, key_columns: list[str]):
    """(name, one contiguous array) per key column, in key order."""
    for name in key_columns:
        column = table.column(name)
        yield name, column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column


def hash_keys_vectorized(table, key_columns: list[str]) -> np.ndarray:
    """`hash_keys` through the numpy path whatever the row count (tests compare the paths)."""
    n = table.num_rows
    h = np.full(n, FNV_OFFSET, dtype=np.uint64)
    for name in key_columns:
        column = table.column(name)
        chunks = column.chunks if isinstance(column, pa.ChunkedArray) else [column]
        parts, start = [], 0
        for chunk in chunks:
            parts.append(_feed_array(h[start: start + len(chunk)], chunk, name))
            start += len(chunk)
        h = np.concatenate(parts) if parts else h
    return _fmix64(h)


def bucket_ids(table: pa.Table | pa.RecordBatch, key_columns: list[str],
               bucket_count: int) -> np.ndarray:
    """The bucket (0 <= b < bucket_count) of every row, as int64."""
    if bucket_count < 1:
        raise InvalidInputError(f"bucket count must be positive, not {bucket_count}")
    return (hash_keys(table, key_columns) % np.uint64(bucket_count)).astype(np.int64)


def bucket_of_key(key: dict, key_schema: pa.Schema, bucket_count: int) -> int:
    """The bucket of one key given as a dict (used for lookups and by the Spark sink).

    The dict is turned into a one-row Arrow table of the key's types, so Python values are
    converted exactly as a written row's would be, and the bucket matches the write path's.
    """
    missing = [f.name for f in key_schema if f.name not in key]
    if missing:
        raise InvalidInputError(f"key is missing primary-key column(s) {missing}")
    try:
        row = pa.table({f.name: pa.array([key[f.name]], type=f.type) for f in key_schema})
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, OverflowError) as e:
        raise InvalidInputError(f"key {key!r} does not fit the key columns: {e}") from e
    return int(bucket_ids(row, key_schema.names, bucket_count)[0])

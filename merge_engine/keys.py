"""Primary keys as bytes: order-preserving, so RocksDB iterates rows in key order.

(Which bucket a key belongs to is decided by server/bucketing.py, the one bucket function that
clients, servers and the Spark sink share.)

Fixed-width key columns are encoded with numpy in one pass; strings and binary are escaped per
value (0x00 becomes 0x00 0xFF, and each ends with 0x00 0x01, so a prefix sorts first).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from tally.errors import InvalidInputError


def _fixed_key_bytes(values: pa.Array) -> np.ndarray | None:
    """(n, width) big-endian bytes whose unsigned order equals the values' order, or None."""
    t = values.type
    n = len(values)
    if pa.types.is_boolean(t):
        return values.to_numpy(zero_copy_only=False).astype(np.uint8).reshape(n, 1)
    if pa.types.is_decimal(t):
        width = t.bit_width // 8
        raw = np.frombuffer(values.buffers()[1], dtype=np.uint8)
        raw = raw[values.offset * width:(values.offset + n) * width].reshape(n, width)
        be = raw[:, ::-1].copy()  # little-endian two's complement -> big-endian
        be[:, 0] ^= 0x80
        return be
    if pa.types.is_floating(t):
        data = values.to_numpy(zero_copy_only=False).astype(np.float64)
        data = np.where(np.isnan(data), np.nan, data)
        bits = data.view(np.uint64)
        negative = (bits >> np.uint64(63)).astype(bool)
        key = np.where(negative, ~bits, bits | np.uint64(1 << 63))
        return key.astype(">u8").view(np.uint8).reshape(n, 8)
    if pa.types.is_integer(t) or pa.types.is_temporal(t):
        width = t.bit_width // 8
        signed = not pa.types.is_unsigned_integer(t)
        raw = np.frombuffer(values.buffers()[1], dtype=np.uint8)
        raw = raw[values.offset * width:(values.offset + n) * width]
        unsigned = raw.view(f"<u{width}")
        if signed:
            unsigned = unsigned ^ np.array(1 << (8 * width - 1), dtype=f"<u{width}")
        return unsigned.astype(f">u{width}").view(np.uint8).reshape(n, width)
    return None


def _escaped(values: pa.Array) -> list[bytes]:
    if pa.types.is_string(values.type) or pa.types.is_large_string(values.type):
        items = [v.encode() for v in values.to_pylist()]
    elif pa.types.is_binary(values.type) or pa.types.is_large_binary(values.type):
        items = values.to_pylist()
    else:
        raise InvalidInputError(f"Primary key columns of type {values.type} are not supported")
    return [v.replace(b"\x00", b"\x00\xff") + b"\x00\x01" for v in items]


def encode_keys(key_columns: list[pa.Array]) -> list[bytes]:
    """One bytes key per row for the given primary-key columns (no nulls allowed)."""
    n = len(key_columns[0])
    fixed = [_fixed_key_bytes(c) for c in key_columns]
    if all(f is not None for f in fixed):
        matrix = np.hstack(fixed) if len(fixed) > 1 else fixed[0]
        width = matrix.shape[1]
        flat = matrix.tobytes()
        return [flat[i:i + width] for i in range(0, n * width, width)]
    parts = []
    for column, f in zip(key_columns, fixed):
        if f is None:
            parts.append(_escaped(column))
        else:
            flat, width = f.tobytes(), f.shape[1]
            parts.append([flat[i:i + width] for i in range(0, n * width, width)])
    return [b"".join(row) for row in zip(*parts)]

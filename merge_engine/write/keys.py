"""Primary keys as bytes: order-preserving, so RocksDB iterates rows in key order.

(Which bucket a key belongs to is decided by tally.wire.bucket_hash, the one bucket function that
clients, servers and the Spark sink share.)

Fixed-width key columns are encoded with numpy in one pass; strings and binary are escaped per
value (0x00 becomes 0x00 0xFF, and each ends with 0x00 0x01, so a prefix sorts first).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from merge_engine.write.key_groups import group_sorted
from merge_engine.write.row_bytes import join_rows
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
    return list(map(escaped_value, items))


def escaped_value(value: bytes) -> bytes:
    """A string or binary key value's stored bytes: NULs escaped and a terminator that sorts
    below any escaped byte, so concatenated columns keep the values' order."""
    return value.replace(b"\x00", b"\x00\xff") + b"\x00\x01"


def integer_value(number: int, width: int, signed: bool) -> bytes:
    """An integer or temporal key value's stored bytes: `width` big-endian bytes whose
    unsigned order is the numbers' order (a signed number offset by half its range)."""
    return (number + (1 << (8 * width - 1)) if signed else number).to_bytes(width, "big")


def decimal_value(little_endian: bytes) -> bytes:
    """A decimal key value's stored bytes from its little-endian two's complement: big-endian
    with the sign bit flipped, so the unsigned order is the values' order."""
    raw = little_endian[::-1]
    return bytes([raw[0] ^ 0x80]) + raw[1:]


def key_matrix(key_columns: list[pa.Array]) -> np.ndarray | None:
    """The encoded keys as an (n, width) byte matrix when every key column is fixed-width."""
    fixed = [_fixed_key_bytes(c) for c in key_columns]
    if any(f is None for f in fixed):
        return None
    return np.hstack(fixed) if len(fixed) > 1 else fixed[0]


def rows_as_bytes(matrix: np.ndarray, prefix: bytes = b"") -> list[bytes]:
    """Each row of the byte matrix as bytes, after `prefix`: a RocksDB key is a prefix and the
    encoded key, each made in one copy (merge_engine.write.row_bytes)."""
    blocks = [np.frombuffer(prefix, dtype=np.uint8).reshape(1, -1)] if prefix else []
    return join_rows(blocks + [matrix], [], rows=len(matrix))


class KeyArray:
    """Encoded keys as one numpy array that sorts and compares like the bytes themselves.

    Why: a bucket searches, sorts and merges a put's keys against its row buffer, and Python
    bytes objects cost more to make than all of that. Fixed-width keys of up to 8 bytes are
    big-endian uint64 (zero padded at the end), wider ones 'S<width>'; variable-width keys
    (with a string or binary column) are 'S<longest>' strings plus their lengths: numpy pads
    with zeros, which keeps order and equality because the encoding is prefix-free, and the
    lengths restore keys that end in zero bytes. Bytes objects are made only where RocksDB
    needs them (`to_list`).
    """

    __slots__ = ("search", "width", "lengths")

    def __init__(self, search: np.ndarray, width: int | None, lengths: np.ndarray | None = None):
        self.search = search
        self.width = width  # bytes per key, or None for variable-width keys
        self.lengths = lengths  # bytes per key when variable-width

    @classmethod
    def from_matrix(cls, matrix: np.ndarray) -> "KeyArray":
        """Fixed-width keys given as an (n, width) byte matrix."""
        n, width = matrix.shape
        if width <= 8:
            padded = np.zeros((n, 8), dtype=np.uint8)
            padded[:, :width] = matrix
            return cls(padded.view(">u8").ravel().astype(np.uint64), width)
        return cls(np.ascontiguousarray(matrix).view(f"S{width}").ravel(), width)

    @classmethod
    def from_bytes(cls, keys: list[bytes]) -> "KeyArray":
        """Variable-width keys given as bytes."""
        lengths = np.fromiter(map(len, keys), dtype=np.int64, count=len(keys))
        return cls(np.array(keys, dtype=bytes) if keys else np.empty(0, dtype="S1"), None, lengths)

    def __len__(self) -> int:
        return len(self.search)

    def take(self, index) -> "KeyArray":
        lengths = None if self.lengths is None else self.lengths[index]
        return KeyArray(self.search[index], self.width, lengths)

    @staticmethod
    def concat(parts: list["KeyArray"]) -> "KeyArray":
        """The keys of `parts` one after the other (all of one key encoding)."""
        if len(parts) == 1:
            return parts[0]
        lengths = None if parts[0].lengths is None else np.concatenate([p.lengths for p in parts])
        return KeyArray(np.concatenate([p.search for p in parts]), parts[0].width, lengths)

    def to_list(self, prefix: bytes = b"") -> list[bytes]:
        """The keys as bytes objects, exactly as encoded, each after `prefix`."""
        if self.width is not None and len(self.search) == 1:  # a point lookup's: no matrix
            if self.search.dtype == np.uint64:
                return [prefix + int(self.search[0]).to_bytes(8, "big")[:self.width]]
            return [prefix + self.search.tobytes()]
        if self.width is None:
            size = self.search.dtype.itemsize
            flat = self.search.tobytes()
            return [prefix + flat[i * size:i * size + n]
                    for i, n in enumerate(self.lengths.tolist())]
        if self.search.dtype == np.uint64:
            matrix = self.search.astype(">u8").view(np.uint8).reshape(-1, 8)[:, :self.width]
        else:
            matrix = self.search.view(np.uint8).reshape(-1, self.width)
        return rows_as_bytes(matrix, prefix)

    def __repr__(self) -> str:
        return f"KeyArray({len(self)} keys, width {self.width})"


def key_array(key_columns: list[pa.Array]) -> KeyArray:
    """The encoded keys of these primary-key columns (no nulls allowed)."""
    if len(key_columns[0]) == 1:
        return one_key(key_columns)
    matrix = key_matrix(key_columns)
    if matrix is not None:
        return KeyArray.from_matrix(matrix)
    return KeyArray.from_bytes(encode_keys(key_columns))


def group_keys(key_columns: list[pa.Array]) -> tuple[KeyArray, np.ndarray, np.ndarray]:
    """(distinct encoded keys in key order, each row's group id, each group's first row).

    Fixed-width keys are grouped with one numpy sort, without making a bytes object per row
    (keys of up to 8 bytes as uint64s, with an unstable sort); keys with a string or binary
    column are grouped on each column's codes (`_coded_groups`), encoding only the distinct
    keys; the rest go through Arrow's hash table.
    """
    matrix = key_matrix(key_columns)
    if matrix is not None:
        keys = KeyArray.from_matrix(matrix)
        search = keys.search
        if search.dtype == np.uint64:
            return _sorted_groups(keys)
        sortable = search.view(np.dtype((np.void, keys.width)))
        _, firsts, group_ids = np.unique(sortable, return_index=True, return_inverse=True)
        return keys.take(firsts), group_ids.astype(np.int64).ravel(), firsts
    coded = _coded_groups(key_columns)
    if coded is not None:
        return coded
    encoded = pa.array(encode_keys(key_columns), type=pa.binary()).dictionary_encode()
    order = pc.sort_indices(encoded.dictionary).to_numpy()
    rank = np.empty(len(order), dtype=np.int64)
    rank[order] = np.arange(len(order))
    group_ids = rank[encoded.indices.to_numpy(zero_copy_only=False)]
    firsts = np.empty(len(order), dtype=np.int64)
    # Assigning in reverse leaves each group's smallest row index (numpy applies repeated
    # fancy-index assignments in order).
    firsts[group_ids[::-1]] = np.arange(len(group_ids) - 1, -1, -1)
    return KeyArray.from_bytes(encoded.dictionary.take(pa.array(order)).to_pylist()), group_ids, firsts


def _column_codes(column: pa.Array) -> tuple[np.ndarray, int] | None:
    """Each row's code among the column's distinct key values (equal codes exactly when the
    encoded values are equal) and how many codes there are; None for a type or nulls the
    per-row encoding must judge."""
    if column.null_count:
        return None
    fixed = _fixed_key_bytes(column)
    if fixed is None:
        t = column.type
        if not (pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_binary(t)
                or pa.types.is_large_binary(t)):
            return None
        encoded = pc.dictionary_encode(column)  # equal strings, equal escaped bytes
    elif fixed.shape[1] <= 8:
        encoded = pc.dictionary_encode(pa.array(KeyArray.from_matrix(fixed).search))
    else:
        return None
    codes = encoded.indices.to_numpy(zero_copy_only=False).astype(np.uint64)
    return codes, len(encoded.dictionary)


def _coded_groups(key_columns: list[pa.Array]) -> tuple[KeyArray, np.ndarray, np.ndarray] | None:
    """group_keys() of keys with a string or binary column: the columns' codes combined into
    one uint64 per row (mixed radix) are grouped by one radix sort, and only each group's first
    row is encoded, then the groups are put in key order. Encoding every row in Python was most
    of a put of such keys. None when the codes do not fit in 63 bits."""
    combined, span = None, 1
    for column in key_columns:
        coded = _column_codes(column)
        if coded is None:
            return None
        codes, count = coded
        count = max(count, 1)
        span *= count
        if span >= 1 << 63:
            return None
        combined = codes if combined is None else combined * np.uint64(count) + codes
    _, code_groups, code_firsts = group_sorted(np.ascontiguousarray(combined))
    taken = pa.array(code_firsts)
    encoded = encode_keys([column.take(taken) for column in key_columns])
    order = np.argsort(np.array(encoded, dtype=bytes), kind="stable")  # prefix-free: as bytes
    rank = np.empty(len(order), dtype=np.int64)
    rank[order] = np.arange(len(order))
    keys = KeyArray.from_bytes([encoded[i] for i in order.tolist()])
    return keys, rank[code_groups], code_firsts[order]


def _sorted_groups(keys: KeyArray) -> tuple[KeyArray, np.ndarray, np.ndarray]:
    """group_keys() of uint64 keys: one stable radix sort (merge_engine.write.key_groups), whose
    order also gives each group's first row."""
    distinct, group_ids, firsts = group_sorted(np.ascontiguousarray(keys.search))
    return KeyArray(distinct, keys.width), group_ids, firsts


def encode_keys(key_columns: list[pa.Array]) -> list[bytes]:
    """One bytes key per row for the given primary-key columns (no nulls allowed)."""
    n = len(key_columns[0])
    fixed = [_fixed_key_bytes(c) for c in key_columns]
    if all(f is not None for f in fixed):
        return rows_as_bytes(np.hstack(fixed) if len(fixed) > 1 else fixed[0])
    parts = []
    for column, f in zip(key_columns, fixed):
        if f is None:
            parts.append(_escaped(column))
        else:
            flat, width = f.tobytes(), f.shape[1]
            parts.append([flat[i:i + width] for i in range(0, n * width, width)])
    return [b"".join(row) for row in zip(*parts)]


def one_key(key_columns: list[pa.Array]) -> KeyArray:
    """key_array() of a single key (a point lookup's), encoded in plain Python: numpy's
    per-call cost is most of the work for one value. Floats take the numpy path (its NaN
    rule); the encoding is the same bytes either way (tests compare the two)."""
    parts, fixed = [], True
    for column in key_columns:
        encoded = _one_fixed(column)
        if encoded is None:
            t = column.type
            if pa.types.is_floating(t) or pa.types.is_boolean(t):
                encoded = _fixed_key_bytes(column).tobytes()
            else:
                encoded = _escaped(column)[0]
                fixed = False
        parts.append(encoded)
    return key_of_parts(parts, fixed)


def key_of_parts(parts: list[bytes], fixed: bool) -> KeyArray:
    """The KeyArray of one key given as each column's encoding (`fixed`: every column is
    fixed-width), as key_array() holds it."""
    key = b"".join(parts)
    if not fixed:
        return KeyArray.from_bytes([key])
    width = len(key)
    if width <= 8:
        return KeyArray(np.array([int.from_bytes(key.ljust(8, b"\x00"), "big")],
                                 dtype=np.uint64), width)
    return KeyArray(np.frombuffer(key, dtype=f"S{width}").copy(), width)


def _one_fixed(values: pa.Array) -> bytes | None:
    """The order-preserving bytes of a one-value integer, temporal or decimal column (as
    `_fixed_key_bytes` makes them), or None for other types."""
    t = values.type
    if pa.types.is_decimal(t):
        width = t.bit_width // 8
        return decimal_value(bytes(memoryview(values.buffers()[1])[
            values.offset * width:(values.offset + 1) * width]))
    if not (pa.types.is_integer(t) or pa.types.is_temporal(t)):
        return None
    width = t.bit_width // 8
    signed = not pa.types.is_unsigned_integer(t)
    raw = memoryview(values.buffers()[1])[values.offset * width:(values.offset + 1) * width]
    return integer_value(int.from_bytes(raw, "little", signed=signed), width, signed)

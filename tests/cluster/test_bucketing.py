"""The bucket function: vectorized numpy code equals a byte-by-byte reference of the spec."""

from __future__ import annotations

import datetime
import decimal
import struct

import pyarrow as pa
import pytest
from hypothesis import given, settings, strategies as st

from tally.errors import InvalidInputError
from tally.wire.bucket_hash import (_hash_small, bucket_ids, bucket_of_key, hash_keys,
                                    hash_keys_vectorized, hash_one)

M64 = (1 << 64) - 1


def reference_hash(values: list[tuple[object, pa.DataType]]) -> int:
    """FNV-1a-64 then fmix64 over the key encoding, written straight from the docstring."""
    stream = b""
    for value, t in values:
        if pa.types.is_boolean(t):
            enc = bytes([1 if value else 0])
        elif pa.types.is_integer(t):
            enc = struct.pack("<Q", value & M64)
        elif pa.types.is_floating(t):
            enc = struct.pack("<d", value)
        elif pa.types.is_string(t):
            enc = value.encode()
        elif pa.types.is_binary(t):
            enc = value
        elif pa.types.is_date32(t):
            enc = struct.pack("<q", (value - datetime.date(1970, 1, 1)).days)
        elif pa.types.is_decimal(t):
            enc = int(value.scaleb(t.scale)).to_bytes(16, "little", signed=True)
        else:
            raise AssertionError(t)
        stream += struct.pack("<I", len(enc)) + enc
    h = 0xCBF29CE484222325
    for b in stream:
        h = ((h ^ b) * 0x100000001B3) & M64
    h ^= h >> 33
    h = (h * 0xFF51AFD7ED558CCD) & M64
    h ^= h >> 33
    h = (h * 0xC4CEB9FE1A85EC53) & M64
    return h ^ (h >> 33)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(-2**63, 2**63 - 1), st.text(max_size=12),
                          st.binary(max_size=9), st.booleans()), min_size=1, max_size=40))
def test_vectorized_hash_equals_reference(rows):
    table = pa.table({
        "i": pa.array([r[0] for r in rows], pa.int64()),
        "s": pa.array([r[1] for r in rows], pa.string()),
        "b": pa.array([r[2] for r in rows], pa.binary()),
        "f": pa.array([r[3] for r in rows], pa.bool_()),
    })
    keys = ["i", "s", "b", "f"]
    want = [reference_hash([(r[0], pa.int64()), (r[1], pa.string()), (r[2], pa.binary()),
                            (r[3], pa.bool_())]) for r in rows]
    assert hash_keys(table, keys).tolist() == want
    assert hash_keys_vectorized(table, keys).tolist() == want  # numpy path
    assert _hash_small(table, keys).tolist() == want  # plain-Python path
    assert [hash_one(table.slice(i, 1), keys) for i in range(len(rows))] == want  # one key


ONE_KEY_TYPES = [
    (pa.int8(), st.integers(-128, 127)), (pa.uint64(), st.integers(0, 2**64 - 1)),
    (pa.int32(), st.integers(-2**31, 2**31 - 1)), (pa.float32(), st.floats(width=32)),
    (pa.float64(), st.floats()), (pa.bool_(), st.booleans()), (pa.string(), st.text()),
    (pa.large_binary(), st.binary()), (pa.binary(3), st.binary(min_size=3, max_size=3)),
    (pa.decimal128(20, 4), st.decimals(-10**15, 10**15, places=4, allow_nan=False)),
    (pa.decimal256(40, 2), st.decimals(-10**30, 10**30, places=2, allow_nan=False)),
    (pa.date32(), st.dates()), (pa.date64(), st.dates()),
    (pa.timestamp("ns"), st.datetimes(datetime.datetime(1700, 1, 1),
                                      datetime.datetime(2200, 1, 1))),
    (pa.time32("ms"), st.times()), (pa.duration("s"), st.timedeltas(
        datetime.timedelta(days=-10**6), datetime.timedelta(days=10**6))),
]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(ONE_KEY_TYPES), min_size=1, max_size=3).flatmap(
    lambda types: st.tuples(st.just(types), st.tuples(*[
        st.lists(values, min_size=3, max_size=3) for _, values in types]))))
def test_one_key_hashes_as_every_row_does(case):
    """A point lookup's key is hashed in plain Python straight from its buffers: the same
    hash as the vectorised path, for every key type, sliced (an offset) or not."""
    types, values = case
    table = pa.table({f"c{i}": pa.array(v, t) for i, ((t, _), v) in enumerate(zip(types, values))})
    names = table.column_names
    assert [hash_one(table.slice(i, 1), names) for i in range(3)] == \
        hash_keys_vectorized(table, names).tolist()


def test_known_values_are_pinned():
    """These numbers must never change: data already written relies on them."""
    table = pa.table({"k": pa.array([0, 1, 42, -1], pa.int64()),
                      "s": ["", "a", "tally", "ü"]})
    assert bucket_ids(table, ["k", "s"], 16).tolist() == [
        reference_hash([(k, pa.int64()), (s, pa.string())]) % 16
        for k, s in zip([0, 1, 42, -1], ["", "a", "tally", "ü"])]
    assert hash_keys(pa.table({"k": pa.array([42], pa.int64())}), ["k"]).tolist() == [
        reference_hash([(42, pa.int64())])]


def test_types_agree_across_widths_chunks_and_slices():
    a = pa.table({"k": pa.array([1, 2, 3], pa.int32())})
    b = pa.table({"k": pa.array([1, 2, 3], pa.int64())})
    assert hash_keys(a, ["k"]).tolist() == hash_keys(b, ["k"]).tolist()
    s = pa.table({"k": pa.chunked_array([["x", "yy"], ["zzz"]])})
    whole = pa.table({"k": ["x", "yy", "zzz"]})
    assert hash_keys(s, ["k"]).tolist() == hash_keys(whole, ["k"]).tolist()
    assert hash_keys(whole.slice(1), ["k"]).tolist() == hash_keys(whole, ["k"]).tolist()[1:]
    large = pa.table({"k": pa.array(["x", "yy", "zzz"], pa.large_string())})
    assert hash_keys(large, ["k"]).tolist() == hash_keys(whole, ["k"]).tolist()


def test_dates_and_decimals_follow_the_spec():
    d = datetime.date(2024, 5, 17)
    dec = decimal.Decimal("12.34")
    t = pa.table({"d": pa.array([d], pa.date32()),
                  "m": pa.array([dec], pa.decimal128(10, 2))})
    want = [reference_hash([(d, pa.date32()), (dec, pa.decimal128(10, 2))])]
    assert hash_keys(t, ["d", "m"]).tolist() == want
    assert hash_keys_vectorized(t, ["d", "m"]).tolist() == want


def test_bucket_of_key_matches_rows_and_rejects_bad_keys():
    table = pa.table({"k": pa.array(range(100), pa.int64()), "s": [str(i) for i in range(100)]})
    schema = pa.schema([("k", pa.int64()), ("s", pa.string())])
    buckets = bucket_ids(table, ["k", "s"], 7).tolist()
    assert [bucket_of_key({"k": i, "s": str(i)}, schema, 7) for i in range(100)] == buckets
    assert len(set(buckets)) == 7
    with pytest.raises(InvalidInputError, match="missing"):
        bucket_of_key({"k": 1}, schema, 7)
    with pytest.raises(InvalidInputError, match="null in row 1"):
        bucket_ids(pa.table({"k": [1, None]}), ["k"], 4)

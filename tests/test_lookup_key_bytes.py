"""A point lookup's key as canonical bytes, against the Arrow paths it stands in for.

For every key type a table accepts (integers of every width, text, binary, dates, times,
timestamps, decimals, composite keys, partitioned tables), the bytes a client sends must bring
the server to the very storage key, bucket and partition the write path gives the same key
(the model: the key as an Arrow batch through key_array, bucket_ids and partition_names), both
when the client makes them from plain Python values and through Arrow. Bytes a client would not
send are refused with an InvalidInputError naming the column or the bucket.
"""

from __future__ import annotations

import datetime
import decimal

import pyarrow as pa
import pytest
from hypothesis import given, settings, strategies as st

from merge_engine.write.keys import encode_keys, key_array
from tally.errors import InvalidInputError
from tally.wire.bucket_hash import bucket_ids
from tally.wire.key_bytes import KeyDecoder, PlainValues, canonical_keys
from tally.wire.point_keys import PointKeys
from tally.wire.routing import TableRouting, partition_names

KEY_TYPES = [
    (pa.int64(), st.integers(-2**63, 2**63 - 1)),
    (pa.int8(), st.integers(-128, 127)),
    (pa.int16(), st.integers(-2**15, 2**15 - 1)),
    (pa.int32(), st.integers(-2**31, 2**31 - 1)),
    (pa.uint8(), st.integers(0, 255)),
    (pa.uint32(), st.integers(0, 2**32 - 1)),
    (pa.uint64(), st.integers(0, 2**64 - 1)),
    (pa.string(), st.text(max_size=6)),
    (pa.large_string(), st.text(max_size=6)),
    (pa.binary(), st.binary(max_size=6)),
    (pa.decimal128(9, 2), st.decimals(-10**6, 10**6, places=2, allow_nan=False)),
    (pa.decimal256(40, 0), st.decimals(-10**39 + 1, 10**39 - 1, places=0, allow_nan=False)),
    (pa.date32(), st.dates()),
    (pa.date64(), st.dates()),
    (pa.time64("us"), st.times()),
    (pa.timestamp("ms", "UTC"), st.datetimes(datetime.datetime(1900, 1, 1),
                                             datetime.datetime(2200, 1, 1),
                                             timezones=st.just(datetime.timezone.utc))),
    (pa.timestamp("us"), st.datetimes(datetime.datetime(1900, 1, 1),
                                      datetime.datetime(2200, 1, 1))),
]


def routing_of(types: list[pa.DataType], partitioned: bool, buckets: int) -> TableRouting:
    names = [f"k{i}" for i in range(len(types))]
    schema = pa.schema([pa.field(n, t, False) for n, t in zip(names, types)]
                       + [pa.field("v", pa.int64())])
    partition = (names[0],) if partitioned and len(names) > 1 else ()
    bucket_key = tuple(n for n in names if n not in partition)
    return TableRouting("db.t", 1, tuple(names), partition, bucket_key, buckets, schema)


@st.composite
def keys(draw):
    picked = draw(st.lists(st.sampled_from(range(len(KEY_TYPES))), min_size=1, max_size=3))
    types = [KEY_TYPES[i][0] for i in picked]
    routing = routing_of(types, draw(st.booleans()), draw(st.integers(1, 7)))
    key = {f"k{j}": draw(KEY_TYPES[i][1]) for j, i in enumerate(picked)}
    return routing, key


@settings(max_examples=400, deadline=None)
@given(case=keys())
def test_canonical_bytes_reach_the_write_paths_key_bucket_and_partition(case):
    """Property: the client's bytes, read by the server, are the key the write path stores,
    in the bucket and partition the write path puts it in."""
    routing, key = case
    assert canonical_keys(routing)
    batch = pa.RecordBatch.from_pylist([key], schema=pa.schema(
        [routing.arrow_schema.field(c) for c in routing.primary_key]))
    model_key = encode_keys([batch.column(c) for c in routing.primary_key])
    assert key_array([batch.column(c) for c in routing.primary_key]).to_list() == model_key
    model_bucket = int(bucket_ids(batch, list(routing.bucket_key), routing.bucket_count)[0])
    try:
        model_partition = partition_names(batch, routing.partition_key)[0] \
            if routing.partitioned else None
    except InvalidInputError:  # a partition value without a name (binary, not UTF-8)
        with pytest.raises(InvalidInputError, match="partition-key column 'k0'"):
            PointKeys(routing).prepare(key)
        return

    partition, bucket, payload = PointKeys(routing).prepare(key)
    assert (partition, bucket) == (model_partition, model_bucket)
    stored = KeyDecoder(routing).storage_key(payload, bucket, partition, "bucket b")
    assert stored.to_list() == model_key
    plain = PlainValues(routing).parts(key)
    if plain is not None:  # made without Arrow: the same bytes
        assert b"".join(plain) == payload
    other = (bucket + 1) % routing.bucket_count
    if other != bucket:
        with pytest.raises(InvalidInputError, match=f"belongs to bucket {bucket}, not to"):
            KeyDecoder(routing).storage_key(payload, other, partition, "bucket b")
    if routing.partitioned:
        with pytest.raises(InvalidInputError, match="belongs to partition"):
            KeyDecoder(routing).storage_key(payload, bucket, "elsewhere", "bucket b")


def test_plain_values_leave_every_other_value_to_arrow():
    """Only exact ints, strs and bytes within their column take the plain path."""
    routing = routing_of([pa.int8(), pa.string()], False, 3)
    plain = PlainValues(routing)
    assert plain.parts({"k0": 5, "k1": "x"}) is not None
    for key in ({"k0": 128, "k1": "x"}, {"k0": True, "k1": "x"}, {"k0": 5.0, "k1": "x"},
                {"k0": 5, "k1": b"x"}, {"k0": 5, "k1": "\ud800"}, {"k0": 5},
                {"k0": None, "k1": "x"}):
        assert plain.parts(key) is None
    assert PlainValues(routing_of([pa.date32()], False, 1)).parts(
        {"k0": datetime.date(2026, 1, 1)}) is None


def _value(size: int, data: bytes) -> bytes:
    return size.to_bytes(4, "little") + data


@pytest.mark.parametrize("kind, payload, message", [
    (pa.int8(), _value(8, (200).to_bytes(8, "little")), "key column 'k0' .* int8: 200 does "
                                                         "not fit"),
    (pa.uint32(), _value(8, b"\xff" * 8), "key column 'k0' .* uint32"),
    (pa.int64(), _value(4, b"\x01\x00\x00\x00"), "key column 'k0' .* int64: a value of 4 "
                                                  "bytes"),
    (pa.string(), _value(2, b"\xff\xfe"), "key column 'k0' .* not valid UTF-8"),
    (pa.decimal128(4, 2), _value(16, (10**4).to_bytes(16, "little", signed=True)),
     "key column 'k0' .* more than 4 digits"),
    (pa.decimal128(4, 2), _value(8, bytes(8)), "key column 'k0' .* a value of 8 bytes"),
    (pa.int64(), _value(8, bytes(8)) + b"x", "1 bytes beyond its primary-key columns"),
    (pa.int64(), _value(9, bytes(8)), "ends inside column 'k0'"),
    (pa.int64(), b"\x08\x00", "ends before column 'k0'"),
    (pa.int64(), b"", "ends before column 'k0'"),
])
def test_malformed_bytes_are_refused_naming_the_column(kind, payload, message):
    routing = routing_of([kind], False, 1)
    with pytest.raises(InvalidInputError, match=message):
        KeyDecoder(routing).storage_key(payload, 0, None, "bucket b")


def test_a_decimal_key_keeps_its_scale():
    routing = routing_of([pa.decimal128(9, 2)], False, 1)
    _, _, payload = PointKeys(routing).prepare({"k0": decimal.Decimal("1.1")})
    assert payload == PointKeys(routing).prepare({"k0": decimal.Decimal("1.10")})[2]
    with pytest.raises(InvalidInputError, match="key column 'k0'"):
        PointKeys(routing).prepare({"k0": decimal.Decimal("1.001")})


def test_boolean_and_float_keys_keep_the_arrow_key():
    for kind, value in ((pa.bool_(), True), (pa.float64(), 1.5)):
        routing = routing_of([pa.int64(), kind], False, 2)
        assert not canonical_keys(routing)
        partition, bucket, payload = PointKeys(routing).prepare({"k0": 1, "k1": value})
        assert payload.startswith(PointKeys(routing)._schema_message)

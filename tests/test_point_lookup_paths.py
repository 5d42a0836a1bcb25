"""The single-key paths of a point lookup equal the vectorised paths they stand in for.

A point lookup decodes one stored row, encodes one key and searches the row buffer for one key
in plain Python, where the general code does each with numpy over many: for every type a row or
key may hold, both must give the very same bytes, arrays and answers.
"""

from __future__ import annotations

import datetime
import decimal

import numpy as np
import pyarrow as pa
from hypothesis import given, settings, strategies as st

from merge_engine.format.rowcodec import RowCodec
from merge_engine.kv.buffer import RowBuffer
from merge_engine.write.keys import KeyArray, encode_keys, key_matrix, one_key
from merge_engine.write.state import StateBatch

# (arrow type, values strategy) for row columns and key columns alike
TYPES = [
    (pa.int64(), st.integers(-2**63, 2**63 - 1)),
    (pa.int8(), st.integers(-128, 127)),
    (pa.uint64(), st.integers(0, 2**64 - 1)),
    (pa.int32(), st.integers(-2**31, 2**31 - 1)),
    (pa.float64(), st.floats(allow_nan=True)),
    (pa.float32(), st.floats(width=32)),
    (pa.bool_(), st.booleans()),
    (pa.string(), st.text(max_size=5)),
    (pa.large_string(), st.text(max_size=5)),
    (pa.binary(), st.binary(max_size=5)),
    (pa.decimal128(12, 3), st.decimals(-10**8, 10**8, places=3, allow_nan=False)),
    (pa.date32(), st.dates()),
    (pa.timestamp("ms", "UTC"), st.datetimes(datetime.datetime(1900, 1, 1),
                                             datetime.datetime(2200, 1, 1),
                                             timezones=st.just(datetime.timezone.utc))),
    (pa.list_(pa.int64()), st.lists(st.integers(-5, 5), max_size=3)),  # pickled in rows
]
KEY_TYPES = [t for t in TYPES if not pa.types.is_list(t[0])]


@st.composite
def state_batches(draw):
    """A codec (some columns counted, maybe timed) and a batch of rows for it, nulls and
    unwritten cells included."""
    picked = draw(st.lists(st.sampled_from(range(len(TYPES))), min_size=1, max_size=6))
    n = draw(st.integers(1, 5))
    columns = []
    for i in picked:
        arrow_type, values = TYPES[i]
        columns.append(pa.array(draw(st.lists(st.none() | values, min_size=n, max_size=n)),
                                arrow_type))
    schema = pa.schema([pa.field(f"c{j}", c.type) for j, c in enumerate(columns)])
    counted = draw(st.lists(st.sampled_from(range(len(columns))), unique=True, max_size=2))
    timed = draw(st.booleans())
    written = np.array(draw(st.lists(st.lists(st.booleans(), min_size=len(columns),
                                              max_size=len(columns)), min_size=n, max_size=n)))
    counts = np.zeros((n, len(columns)), dtype=np.int64)
    for j in counted:
        counts[:, j] = draw(st.lists(st.integers(-2**40, 2**40), min_size=n, max_size=n))
    touched = np.array(draw(st.lists(st.integers(0, 2**50), min_size=n, max_size=n)),
                       dtype=np.int64) if timed else None
    return RowCodec(schema, counted, timed), StateBatch(columns, written, counts, touched)


def same_floats(x: pa.Array, y: pa.Array) -> bool:
    """Floats equal bit for bit (Arrow's equals holds NaN unequal to itself)."""
    if not pa.types.is_floating(x.type):
        return False
    valid = x.is_valid().to_numpy(zero_copy_only=False)
    if not (valid == y.is_valid().to_numpy(zero_copy_only=False)).all():
        return False
    xs, ys = (c.to_numpy(zero_copy_only=False)[valid] for c in (x, y))
    return xs.tobytes() == ys.tobytes()


def same_states(a: StateBatch, b: StateBatch) -> None:
    assert len(a.columns) == len(b.columns)
    for x, y in zip(a.columns, b.columns):
        assert x.type == y.type and (x.equals(y) or same_floats(x, y)), (x, y)
    assert a.written.dtype == b.written.dtype and (a.written == b.written).all()
    assert (a.counts() == b.counts()).all()
    assert (a.touched is None) == (b.touched is None)
    if a.touched is not None:
        assert a.touched.dtype == b.touched.dtype and (a.touched == b.touched).all()


@settings(max_examples=200, deadline=None)
@given(state_batches())
def test_one_row_decodes_as_the_vectorised_decoder_decodes_it(case):
    codec, batch = case
    for row in codec.encode(batch):
        one = codec.decode_one(row)
        same_states(one, codec.decode_many([row]))
        same_states(one, codec.decode([row]))
        # and it is the row that was stored: encoding it again gives the same bytes
        assert codec.encode(one) == [row]


@st.composite
def keys(draw):
    picked = draw(st.lists(st.sampled_from(KEY_TYPES), min_size=1, max_size=3))
    columns = []
    for arrow_type, values in picked:
        value = draw(values)
        array = pa.array([draw(values), value, draw(values)], arrow_type)
        columns.append(array.slice(1, 1))  # a slice: its offset must be honoured
    return columns


@settings(max_examples=300, deadline=None)
@given(keys())
def test_one_key_encodes_as_the_vectorised_encoder_does(columns):
    matrix = key_matrix(columns)
    vectorised = KeyArray.from_matrix(matrix) if matrix is not None else \
        KeyArray.from_bytes(encode_keys(columns))
    one = one_key(columns)
    assert one.to_list() == vectorised.to_list() == encode_keys(columns)
    assert one.width == vectorised.width
    assert one.search.dtype == vectorised.search.dtype
    assert one.search.tobytes() == vectorised.search.tobytes()
    assert (one.lengths is None) == (vectorised.lengths is None)
    if one.lengths is not None:
        assert one.lengths.tolist() == vectorised.lengths.tolist()


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.lists(st.integers(0, 60), max_size=20),
                          st.lists(st.integers(0, 60), max_size=5)), min_size=1, max_size=4),
       st.lists(st.integers(-5, 70), min_size=1, max_size=20),
       st.sampled_from([pa.int64(), pa.string()]))
def test_finding_one_key_in_the_buffer_agrees_with_finding_many(puts, wanted, key_type):
    """find_one and state answer what find and states do, whatever runs and removals the
    buffer holds, for fixed-width and variable-width keys."""
    def encoded(values):
        column = pa.array(values, pa.int64()) if key_type == pa.int64() else \
            pa.array([f"k{v}" for v in values])
        return one_key([column]) if len(values) == 1 else \
            (KeyArray.from_matrix(key_matrix([column])) if key_type == pa.int64()
             else KeyArray.from_bytes(encode_keys([column])))

    buffer = RowBuffer()
    for added, removed in puts:
        added = sorted(set(added))
        removed = sorted(set(removed) - set(added))
        rows = StateBatch([pa.array(added, pa.int64())], np.ones((len(added), 1), dtype=bool))
        buffer.add(encoded(added) if added else encoded([0]).take(slice(0, 0)), rows,
                   encoded(removed) if removed else encoded([0]).take(slice(0, 0)))
    for value in wanted:
        key = encoded([value])
        found = buffer.find_one(key)
        assert found == int(buffer.find(key)[0])
        if found >= 0:
            same_states(buffer.state(found), buffer.states(np.array([found])))
            assert buffer.state(found).columns[0].to_pylist() == [value]


def test_decimal_and_date_keys_of_one_value():
    columns = [pa.array([decimal.Decimal("-1.500")], pa.decimal128(12, 3)),
               pa.array([datetime.date(1969, 12, 31)])]
    assert one_key(columns).to_list() == encode_keys(columns)

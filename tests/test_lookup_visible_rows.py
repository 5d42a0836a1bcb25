"""A point lookup's answer as visible row bytes, against the Arrow answer it stands in for.

- Format: for every flat column type (integers of every width, floats, decimals, strings,
  binaries, dates, times, timestamps with and without a zone, durations, booleans) and any null
  pattern, a row encoded from its Arrow arrays, and cut out of its stored bytes, decodes to
  exactly what Arrow's `to_pylist` gives of it (compared by repr: a decimal's scale, -0.0 and
  NaN, a timestamp's zone all count).
- Tablet: on random tables (every aggregate function, sequenced ones, token-keeping string_agg,
  sketches and bitmaps as binary states, row TTL) after random writes, deletes and reopens,
  the answer a lookup gives (head and row, read as the client reads it) equals the tablet's
  Arrow row, for rows in the row buffer, in RocksDB, after a reopen, and for keys without a
  row. Tables with nested columns have no visible rows and keep the Arrow answer.
- Refusals: an answer of another version, a malformed one, and one of other columns are typed
  errors.
"""

from __future__ import annotations

import tempfile

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, assume, given, settings, strategies as st

from aggfuncs import AggFunction as F
from merge_engine import Schema, TableDescriptor
from merge_engine.format.rowcodec import RowCodec
from merge_engine.format.visible_row import VisibleRowDecoder, VisibleRows, fingerprint, flat
from merge_engine.kv.tablet import KvTablet
from merge_engine.testing.harness import TabletHarness
from merge_engine.testing.ops import Reopen
from merge_engine.testing.strategies import (keys_of, sequenced_table_specs, table_specs,
                                             write_sequences)
from merge_engine.write.input import prepare_write
from merge_engine.write.keys import key_array
from merge_engine.write.state import StateBatch
from tally.errors import InvalidInputError, StaleMetadataError, WireVersionError
from tally.wire.lookup_answer import (ANSWER_HEAD, ANSWER_MARK, ARROW_ROWS, NO_ROW, VISIBLE_ROW,
                                      LookupAnswers, answer_head)

FIXED_TYPES = [
    pa.int8(), pa.int16(), pa.int32(), pa.int64(), pa.uint8(), pa.uint16(), pa.uint32(),
    pa.uint64(), pa.float16(), pa.float32(), pa.float64(), pa.decimal128(5, 2),
    pa.decimal128(38, 10), pa.decimal128(10, -2), pa.decimal256(76, 20), pa.date32(),
    pa.date64(), pa.time32("s"), pa.time32("ms"), pa.time64("us"), pa.time64("ns"),
    pa.timestamp("s"), pa.timestamp("ms"), pa.timestamp("us"), pa.timestamp("ns"),
    pa.timestamp("us", "UTC"), pa.timestamp("ms", "Europe/Paris"),
    pa.timestamp("s", "+05:30"), pa.timestamp("ns", "America/New_York"), pa.duration("s"),
    pa.duration("us"), pa.duration("ns"), pa.binary(3),
]
VAR_TYPES = [pa.string(), pa.large_string(), pa.binary(), pa.large_binary()]
TEXT = st.text(st.sampled_from(["a", ",", "é", "\uffff", "\U0001F600", "\x00"]), max_size=5)


@st.composite
def one_value(draw, t: pa.DataType) -> pa.Array:
    """A one-value array of `t`: null, or any bit pattern its value may take."""
    if draw(st.integers(0, 3)) == 0:
        return pa.nulls(1, t)
    if pa.types.is_boolean(t):
        return pa.array([draw(st.booleans())], t)
    if t in VAR_TYPES:
        text = draw(TEXT)
        return pa.array([text if "string" in str(t) else text.encode()], t)
    width = t.byte_width
    raw = draw(st.binary(min_size=width, max_size=width))
    if pa.types.is_time(t) or pa.types.is_timestamp(t) or pa.types.is_date(t):
        # a value Arrow can show (within a day, within Python's years)
        limit = {"s": 86_400, "ms": 86_400_000, "us": 86_400_000_000,
                 "ns": 86_400_000_000_000}[getattr(t, "unit", "s")] \
            if pa.types.is_time(t) else None
        value = draw(st.integers(0, limit - 1)) if limit else \
            draw(st.integers(-10**9, 10**9)) * (86_400_000 if t == pa.date64() else 1) \
            if pa.types.is_date(t) else draw(st.integers(-2**40, 2**40))
        raw = value.to_bytes(width, "little", signed=True)
    return pa.Array.from_buffers(t, 1, [None, pa.py_buffer(raw)])


@st.composite
def flat_rows(draw):
    types = draw(st.lists(st.sampled_from(FIXED_TYPES + VAR_TYPES + [pa.bool_()]),
                          min_size=1, max_size=10))
    schema = pa.schema([pa.field(f"c{i}", t) for i, t in enumerate(types)])
    return schema, [draw(one_value(t)) for t in types]


def same(a, b) -> bool:
    """Alike in every way repr shows (NaN equals NaN; -0.0, a decimal's scale, a zone
    count)."""
    return repr(a) == repr(b)


@settings(max_examples=600, deadline=None)
@given(case=flat_rows())
def test_visible_rows_decode_to_what_arrow_gives(case):
    """Property: encoded from Arrow arrays or cut from the stored row, a row decodes to the
    dict Arrow gives of it."""
    schema, arrays = case
    try:
        expected = pa.RecordBatch.from_arrays(arrays, schema=schema).to_pylist()[0]
    except (ValueError, OverflowError, pa.ArrowException):
        assume(False)  # a value Python cannot show at all: no answer to compare
    codec = RowCodec(schema)
    rows = VisibleRows(schema, codec, states_are_values=True)
    from_arrays = rows.of_arrays(arrays)
    stored = codec.encode(StateBatch(arrays, np.ones((1, len(arrays)), dtype=bool)))[0]
    assert rows.of_stored(stored) == from_arrays
    # a row inside longer arrays (the row buffer's runs), read where it is
    inside = [pa.concat_arrays([a, pa.nulls(1, a.type), a]).slice(1) for a in arrays]
    assert rows.of_arrays(inside, 1) == from_arrays
    assert rows.of_arrays(inside, 0) == rows.of_arrays([pa.nulls(1, a.type) for a in arrays])
    decoded = VisibleRowDecoder(schema).decode(from_arrays)
    assert list(decoded) == schema.names
    for name in schema.names:
        assert same(decoded[name], expected[name]), (name, decoded[name], expected[name])


def _answer(tablet: KvTablet, key: dict) -> bytes:
    """The answer a tablet server gives for `key` (as tally.server.tablet.lookups makes it)."""
    write = prepare_write([key], tablet.schema, tablet.aggregators, keys_only=True)
    encoded = key_array(write.key_columns(tablet.schema))
    visible = tablet.visible_rows
    if visible is None:
        row = tablet.lookup_key(encoded)
        body = b"" if row is None else pa.Table.from_batches([row]).to_batches()[0]
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, tablet.arrow_schema) as writer:
            if body:
                writer.write_batch(body)
        return answer_head(ARROW_ROWS, fingerprint(tablet.arrow_schema)) + \
            sink.getvalue().to_pybytes()
    row = tablet.lookup_visible(encoded)
    return answer_head(NO_ROW, visible.fingerprint) if row is None else \
        answer_head(VISIBLE_ROW, visible.fingerprint) + row


def check_lookups(tablet: KvTablet, keys: list[dict]) -> None:
    answers = LookupAnswers(tablet.arrow_schema)
    for key in keys:
        expected = tablet.lookup(key)
        found = answers.row(_answer(tablet, key))
        assert same(found, expected), (key, found, expected)


@st.composite
def tables_and_writes(draw):
    spec = draw(st.one_of(table_specs(), sequenced_table_specs()))
    ops = draw(write_sequences(spec, max_size=8))
    extra = draw(st.lists(keys_of(spec), max_size=4))
    return spec, ops, extra


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=tables_and_writes())
def test_tablet_answers_equal_the_arrow_rows(case):
    """Property: after random writes (buffered rows), a flush (rows in RocksDB) and a reopen,
    every key's answer reads as the tablet's Arrow row, None for keys without one."""
    spec, ops, extra = case
    keys = list(extra)
    for op in ops:
        for row in getattr(op, "rows", None) or getattr(op, "keys", None) or []:
            keys.append({k: row[k] for k in spec.primary_key})
    with tempfile.TemporaryDirectory() as d, TabletHarness(spec, d) as h:
        for op in ops:
            h.apply(op)
            if not isinstance(op, Reopen):
                check_lookups(h.tablet, keys)
        assert (h.tablet.visible_rows is None) == (not flat(h.tablet.arrow_schema))
        h.tablet.flush()
        check_lookups(h.tablet, keys)
        h.reopen()
        check_lookups(h.tablet, keys)


def test_expired_rows_are_not_answered(tmp_path):
    """A row past the row TTL is no answer, read from the buffer or from RocksDB."""
    now = [1_000_000.0]
    schema = (Schema.builder().column("k", pa.int64(), nullable=False)
              .agg_column("v", pa.int64(), F.SUM).agg_column("s", pa.string(), F.MAX)
              .primary_key("k").build())
    descriptor = TableDescriptor(schema, properties={"table.merge-engine": "aggregation",
                                                     "table.kv.row-ttl": "10s"})
    tablet = KvTablet.open(str(tmp_path), descriptor, clock=lambda: now[0])
    try:
        tablet.put([{"k": 1, "v": 5, "s": "a"}])
        check_lookups(tablet, [{"k": 1}, {"k": 2}])
        assert LookupAnswers(tablet.arrow_schema).row(_answer(tablet, {"k": 1})) == \
            {"k": 1, "v": 5, "s": "a"}
        tablet.flush()
        check_lookups(tablet, [{"k": 1}])
        now[0] += 11
        assert LookupAnswers(tablet.arrow_schema).row(_answer(tablet, {"k": 1})) is None
        check_lookups(tablet, [{"k": 1}])
        tablet.put([{"k": 3, "v": 1, "s": "b"}])
        now[0] += 11
        assert LookupAnswers(tablet.arrow_schema).row(_answer(tablet, {"k": 3})) is None
    finally:
        tablet.close()


def test_answers_of_another_version_or_malformed_are_typed_errors():
    schema = pa.schema([pa.field("k", pa.int64()), pa.field("s", pa.string())])
    answers = LookupAnswers(schema)
    row = VisibleRows(schema, RowCodec(schema), True).of_arrays(
        [pa.array([1], pa.int64()), pa.array(["x"])])
    head = answer_head(VISIBLE_ROW, answers.fingerprint)
    assert answers.row(head + row) == {"k": 1, "s": "x"}
    assert answers.row(answer_head(NO_ROW, answers.fingerprint)) is None
    other_version = ANSWER_HEAD.pack(ANSWER_MARK, 1, VISIBLE_ROW, answers.fingerprint)
    with pytest.raises(WireVersionError, match="wire version 1"):
        answers.row(other_version + row)
    with pytest.raises(WireVersionError, match="another version"):
        answers.row(b"\xff\xff\xff\xff" + bytes(20))  # an Arrow IPC answer of before
    with pytest.raises(InvalidInputError, match="malformed lookup answer"):
        answers.row(head + row[:-1])
    with pytest.raises(InvalidInputError, match="malformed lookup answer"):
        answers.row(head + row + b"x")
    with pytest.raises(InvalidInputError, match="malformed lookup answer"):
        answers.row(head[:5] + b"\x07" + head[6:] + row)
    with pytest.raises(InvalidInputError, match="malformed lookup answer"):
        answers.row(answer_head(NO_ROW, answers.fingerprint) + b"x")
    with pytest.raises(InvalidInputError, match="malformed Arrow IPC"):
        answers.row(answer_head(ARROW_ROWS, answers.fingerprint) + b"not arrow")
    with pytest.raises(StaleMetadataError, match="other columns"):
        answers.row(answer_head(VISIBLE_ROW, answers.fingerprint ^ 1) + row)
    wide = pa.schema([*schema, pa.field("t", pa.date32())])
    with pytest.raises(StaleMetadataError):  # a column added since the client read the table
        answers.row(answer_head(VISIBLE_ROW, LookupAnswers(wide).fingerprint) + row)

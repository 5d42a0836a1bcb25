"""Limits on what a request may make a server parse or allocate, checked before it does.

- JSON nesting (tally.wire.messages.MAX_JSON_DEPTH): deeper documents are refused with a typed
  error before the parser recurses; brackets inside strings do not count.
- Arrow IPC streams (tally.wire.ipc_guard): the bytes and rows a stream declares are read from
  its message headers before anything is decoded, and are never less than what decoding it
  then takes; a corrupted stream is refused typed, never with an internal error.
"""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tally.errors import InvalidInputError
from tally.wire.ipc_guard import measure_stream
from tally.wire.messages import MAX_FRAMED_BYTES, MAX_JSON_DEPTH, frame, loads, unframe

json_leaves = st.one_of(st.none(), st.booleans(), st.integers(), st.text(alphabet="[]{}\"\\ab,:"))


def nested(depth: int, leaf) -> object:
    for i in range(depth):
        leaf = [leaf] if i % 2 else {"k": leaf}
    return leaf


@settings(max_examples=200, deadline=None)
@given(depth=st.integers(0, 3 * MAX_JSON_DEPTH), leaf=json_leaves)
def test_json_depth_is_bounded_before_parsing(depth, leaf):
    text = json.dumps(nested(depth, leaf)).encode()
    if depth <= MAX_JSON_DEPTH:
        assert loads(text) == nested(depth, leaf)
    else:
        with pytest.raises(InvalidInputError, match=f"the limit is {MAX_JSON_DEPTH}"):
            loads(text)


def test_json_nested_100000_deep_is_refused_typed():
    for text in (b"[" * 100_000 + b"]" * 100_000, b'{"a":' * 100_000 + b"1" + b"}" * 100_000):
        with pytest.raises(InvalidInputError, match="levels deep"):
            loads(text)


def ipc(table: pa.Table, compression: str | None) -> pa.Buffer:
    sink = pa.BufferOutputStream()
    options = pa.ipc.IpcWriteOptions(compression=compression)
    with pa.ipc.new_stream(sink, table.schema, options=options) as writer:
        writer.write_table(table, max_chunksize=7)
    return sink.getvalue()


tables = st.builds(
    lambda n, seed: pa.table({
        "i": pa.array(np.random.default_rng(seed).integers(-9, 9, n)),
        "s": pa.array([("x" * (i % 13)) if i % 5 else None for i in range(n)]),
        "l": pa.array([[i] * (i % 4) for i in range(n)], pa.list_(pa.int64())),
        "b": pa.array([i % 3 == 0 for i in range(n)]),
    }),
    st.integers(0, 60), st.integers(0, 2**32))


@settings(max_examples=100, deadline=None)
@given(table=tables, compression=st.sampled_from([None, "zstd", "lz4"]))
def test_a_stream_declares_at_least_what_decoding_it_takes(table, compression):
    data = ipc(table, compression)
    size = measure_stream(data, max_rows=10**6, max_bytes=10**9, what="a write")
    decoded = pa.ipc.open_stream(data).read_all()
    assert size.rows == decoded.num_rows == table.num_rows
    assert size.decoded_bytes >= decoded.get_total_buffer_size()
    assert size.wire_bytes == data.size
    if table.num_rows:
        with pytest.raises(InvalidInputError, match="rows"):
            measure_stream(data, max_rows=table.num_rows - 1, max_bytes=10**9, what="a write")


@settings(max_examples=300, deadline=None)
@given(table=tables, compression=st.sampled_from([None, "zstd"]), data=st.data())
def test_a_corrupted_stream_is_refused_typed(table, compression, data):
    raw = bytearray(ipc(table, compression).to_pybytes())
    for _ in range(data.draw(st.integers(1, 4))):
        raw[data.draw(st.integers(0, len(raw) - 1))] = data.draw(st.integers(0, 255))
    cut = data.draw(st.integers(0, len(raw)))
    try:
        measure_stream(bytes(raw[:cut]), max_rows=10**6, max_bytes=10**7, what="a write")
    except InvalidInputError:
        pass


def zero_string_table(size: int) -> pa.Table:
    """One string cell of `size` zero bytes, without touching them (calloc'd pages)."""
    zeros = np.zeros(size, dtype=np.uint8)
    offsets = pa.py_buffer(np.array([0, size], dtype=np.int32))
    return pa.table({"s": pa.StringArray.from_buffers(1, offsets, pa.py_buffer(zeros))})


def test_a_compression_bomb_is_measured_from_its_headers():
    bomb = ipc(zero_string_table(256 << 20), "zstd")
    assert bomb.size < 1 << 20
    with pytest.raises(InvalidInputError, match="once decoded"):
        measure_stream(bomb, max_rows=10, max_bytes=64 << 20, what="write batch")


def test_framed_requests_carry_one_small_key():
    key = pa.table({"k": [1]})
    header, payload = unframe(frame({"op": "lookup"}, key), "a lookup")
    assert header == {"op": "lookup"} and payload.equals(key)
    with pytest.raises(InvalidInputError, match="more than the limit of 1 rows"):
        unframe(frame({}, pa.table({"k": [1, 2]})), "a lookup")
    with pytest.raises(InvalidInputError, match=f"limit of {MAX_FRAMED_BYTES:,} bytes"):
        unframe(b"{}" + b" " * MAX_FRAMED_BYTES, "a lookup")
    bomb = ipc(zero_string_table(64 << 20), "zstd").to_pybytes()
    with pytest.raises(InvalidInputError, match="once decoded"):
        unframe(b"{}\n" + bomb, "a lookup")


def test_request_json_is_bounded_in_bytes_before_it_is_parsed():
    from tally.wire.messages import MAX_REQUEST_JSON_BYTES, loads_request

    doc = b'{"k":"' + b"x" * MAX_REQUEST_JSON_BYTES + b'"}'
    with pytest.raises(InvalidInputError, match="limit is 4,194,304 bytes"):
        loads_request(doc, "an action body")
    assert loads(doc) == {"k": "x" * MAX_REQUEST_JSON_BYTES}  # a client reads answers unbounded
    assert loads_request(b'{"k":1}') == {"k": 1}

"""The stored rows' bytes made by one C loop (merge_engine.write.row_bytes.join_rows) against Arrow's
join of the same parts: heads of any width (none too), values sliced (offsets not at 0), empty
and long values, nulls made empty as the row codec makes them; parts that do not fit their
rows are refused before any byte is copied. RowCodec's own tests decode what it encodes."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from hypothesis import given, settings, strategies as st

from merge_engine.testing.profiles import examples
from merge_engine.write.row_bytes import join_rows

values = st.one_of(st.none(), st.binary(max_size=3), st.binary(min_size=15, max_size=60))


@st.composite
def cases(draw):
    n = draw(st.integers(0, 12))
    width = draw(st.integers(0, 9))
    rows = draw(st.lists(st.binary(min_size=width, max_size=width), min_size=n, max_size=n))
    heads = np.frombuffer(b"".join(rows), dtype=np.uint8).reshape(n, width)
    parts = []
    for _ in range(draw(st.integers(0, 3))):
        skip = draw(st.integers(0, 5))  # leading values sliced away
        column = pa.array([b"x"] * skip + draw(st.lists(values, min_size=n, max_size=n)),
                          pa.large_binary()).slice(skip)
        parts.append(pc.fill_null(column, b"") if column.null_count else column)
    return heads, parts


@settings(max_examples=examples(300))
@given(case=cases())
def test_join_rows_equals_arrow(case):
    heads, parts = case
    expected = [bytes(heads[i]) + b"".join(p[i].as_py() for p in parts)
                for i in range(len(heads))]
    if parts and len(heads):
        joined = pc.binary_join_element_wise(
            pa.array([bytes(h) for h in heads], pa.large_binary()), *parts,
            pa.scalar(b"", pa.large_binary()))
        assert joined.to_pylist() == expected
    assert join_rows(heads, parts) == expected


@settings(max_examples=examples(200))
@given(case=cases(), cuts=st.lists(st.integers(0, 9), max_size=3),
       prefix=st.binary(max_size=10))
def test_rows_join_from_blocks_and_a_repeated_prefix(case, cuts, prefix):
    """The head given as a prefix every row repeats and the matrix cut into blocks (as the
    codec hands its header, bitmaps and values): the same bytes as the one matrix."""
    heads, parts = case
    edges = sorted({0, heads.shape[1], *[c for c in cuts if c <= heads.shape[1]]})
    blocks = [heads[:, a:b] for a, b in zip(edges[:-1], edges[1:])]
    if prefix:
        blocks.insert(0, np.frombuffer(prefix, dtype=np.uint8).reshape(1, -1))
    expected = [prefix + bytes(heads[i]) + b"".join(p[i].as_py() for p in parts)
                for i in range(len(heads))]
    assert join_rows(blocks, parts, rows=len(heads)) == expected


def test_blocks_that_do_not_fit_their_rows_are_refused():
    with pytest.raises(ValueError, match="block 1 has 2 rows for 3 rows"):
        join_rows([np.zeros((3, 1), np.uint8), np.zeros((2, 1), np.uint8)], [])


def test_parts_that_do_not_fit_their_rows_are_refused():
    heads = np.zeros((3, 2), dtype=np.uint8)
    with pytest.raises(ValueError, match="part 0 has 2 values for 3 rows"):
        join_rows(heads, [pa.array([b"a", b"b"], pa.large_binary())])


@settings(max_examples=examples(200))
@given(st.integers(0, 40), st.integers(1, 20), st.data())
def test_row_bits_pack_and_unpack_as_numpy_does_along_rows(rows, columns, data):
    """The stored rows' written and valid bits: packed flat after padding each row to whole
    bytes, the same bytes as numpy's packing along the rows, and back."""
    from merge_engine.format.rowcodec import pack_row_bits, unpack_row_bits

    flat = data.draw(st.lists(st.booleans(), min_size=rows * columns, max_size=rows * columns))
    bits = np.array(flat, dtype=bool).reshape(rows, columns)
    packed = pack_row_bits(bits)
    assert packed.tobytes() == np.packbits(bits, axis=1, bitorder="little").tobytes()
    assert packed.shape == (rows, -(-columns // 8))
    unpacked = unpack_row_bits(packed)
    assert np.array_equal(unpacked, np.unpackbits(packed, axis=1, bitorder="little"))
    assert np.array_equal(unpacked[:, :columns].astype(bool), bits)

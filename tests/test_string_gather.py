"""The row buffer's and the changelog's gather of strings (aggfuncs.string_gather through
StateBatch and take_rows) against Arrow's own take: slices (offsets not at 0), nulls, empty
and long strings, string and large_string, several arrays, and rows outside their array
refused before any byte is read."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings, strategies as st

from aggfuncs.string_rows import take_rows
from merge_engine.testing.profiles import examples
from merge_engine.write.state import StateBatch

texts = st.one_of(st.none(), st.text(max_size=3), st.text(min_size=15, max_size=40))


@st.composite
def arrays(draw, arrow_type):
    values = draw(st.lists(texts, min_size=1, max_size=12))
    skip = draw(st.integers(0, 9))  # leading rows sliced away: offsets and bits not at 0
    return pa.array([None] * skip + values, type=arrow_type).slice(skip)


@st.composite
def gathers(draw):
    arrow_type = draw(st.sampled_from([pa.string(), pa.large_string()]))
    parts = draw(st.lists(arrays(arrow_type), min_size=1, max_size=3))
    picks = draw(st.lists(st.tuples(st.integers(0, len(parts) - 1), st.integers(0, 11)),
                          max_size=20))
    picks = [(s, r % len(parts[s])) for s, r in picks]
    return arrow_type, parts, picks


@settings(max_examples=examples(300))
@given(case=gathers())
def test_take_rows_equals_arrow(case):
    arrow_type, parts, picks = case
    source = np.array([s for s, _ in picks], dtype=np.int64)
    rows = np.array([r for _, r in picks], dtype=np.int64)
    taken = take_rows(parts, source, rows, arrow_type)
    assert taken.type == arrow_type
    taken.validate(full=True)
    assert taken.to_pylist() == [parts[s][r].as_py() for s, r in picks]


@settings(max_examples=examples(100))
@given(case=gathers())
def test_state_batches_gather_strings_as_arrow_does(case):
    arrow_type, parts, picks = case
    batches = [StateBatch([p, pa.array(np.arange(len(p)))], np.ones((len(p), 2), dtype=bool))
               for p in parts]
    bounds = np.cumsum([0] + [len(p) for p in parts])
    positions = np.array([bounds[s] + r for s, r in picks], dtype=np.int64)
    gathered = StateBatch.gather(batches, positions)
    expected = pa.chunked_array(parts).take(pa.array(positions, type=pa.int64()))
    assert gathered.columns[0].to_pylist() == expected.to_pylist()
    assert gathered.columns[0].type == arrow_type


@pytest.mark.parametrize("source, row", [([0], [3]), ([0], [-1]), ([1], [0]), ([-1], [0])])
def test_a_row_outside_its_array_is_refused(source, row):
    with pytest.raises(IndexError):
        take_rows([pa.array(["a", "b", None])], np.array(source), np.array(row), pa.string())


def test_offsets_past_the_bytes_are_refused():
    from aggfuncs.string_gather import gather_strings

    offsets, data = np.array([0, 1, 9], dtype=np.int32), np.frombuffer(b"ab", dtype=np.uint8)
    with pytest.raises(ValueError):
        gather_strings([offsets], [data], [None], [0], [2], np.zeros(1), np.zeros(1))

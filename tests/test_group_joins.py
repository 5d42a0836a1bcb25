"""string_agg's one-pass join (aggfuncs.group_joins) against plain Python's str.join.

The fold and fold_onto of string_agg go through it; the engine's model tests cover them in a
table. Here the kernel's own edges: slices of Arrow arrays (offsets not at 0), string and
large_string inputs, nulls and empty strings, multi-byte and multi-character delimiters,
strings longer than its byte loop, several sources, groups without any string."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aggfuncs import AggFunction, make_aggregator, string_agg
from aggfuncs.group_joins import join_groups
from aggfuncs.segments import Segments
from merge_engine.testing.profiles import examples
from tally.errors import InvalidInputError

texts = st.one_of(st.none(), st.text(max_size=3), st.text(min_size=15, max_size=40))


@st.composite
def sources(draw):
    groups = draw(st.integers(1, 6))
    made = []
    for _ in range(draw(st.integers(1, 3))):
        values = draw(st.lists(texts, max_size=12))
        skip = draw(st.integers(0, 2))  # leading rows sliced away: offsets not at 0
        arrow_type = draw(st.sampled_from([pa.string(), pa.large_string()]))
        array = pa.array([None] * skip + values, type=arrow_type).slice(skip)
        keep = np.array(draw(st.lists(st.booleans(), min_size=len(values),
                                      max_size=len(values))), dtype=bool)
        ids = np.array(draw(st.lists(st.integers(0, groups - 1), min_size=len(values),
                                     max_size=len(values))), dtype=np.int64)
        made.append((array, keep, ids))
    return groups, made


@settings(max_examples=examples(300))
@given(case=sources(), delimiter=st.sampled_from([",", "::", "é|", "ab"]),
       large=st.booleans())
def test_join_equals_python(case, delimiter, large):
    groups, parts = case
    agg = make_aggregator(AggFunction.STRING_AGG, "v", pa.large_string() if large else pa.string(),
                          {"delimiter": delimiter})
    joined = agg._joined(groups, parts)
    expected = [[] for _ in range(groups)]
    for array, keep, ids in parts:
        for value, kept, group in zip(array.to_pylist(), keep.tolist(), ids.tolist()):
            if kept and value is not None:
                expected[group].append(value)
    assert joined.type == agg.type
    assert joined.to_pylist() == [delimiter.join(v) if v else None for v in expected]


def test_fold_skips_nulls_and_unwritten_rows():
    agg = make_aggregator(AggFunction.STRING_AGG, "v", pa.string(), {})
    states = pa.array(["a", None, "", "b", "c"])
    written = np.array([True, True, True, False, True])
    folded = agg.fold(states, written, Segments(np.array([0, 0, 1, 1, 0]), 3))
    assert folded.to_pylist() == ["a,c", "", None]


def test_a_join_past_a_string_column_is_refused_naming_the_column(monkeypatch):
    agg = make_aggregator(AggFunction.STRING_AGG, "tags", pa.string(), {})
    monkeypatch.setattr(string_agg, "STRING_COLUMN_BYTES", 2)  # not 2 GiB of test data
    with pytest.raises(InvalidInputError, match="'tags'.*Nothing was applied"):
        agg.fold(pa.array(["abc"]), np.array([True]), Segments(np.array([0]), 1))


@pytest.mark.parametrize("groups", [[0, 1], [0, -1]])
def test_a_group_outside_the_groups_is_refused_before_any_byte_is_written(groups):
    offsets, data = np.array([0, 1, 2], dtype=np.int32), np.frombuffer(b"ab", dtype=np.uint8)
    with pytest.raises(IndexError):
        join_groups([(offsets, data, np.ones(2, dtype=np.uint8), np.array(groups))], 1, b",")


def test_offsets_past_the_bytes_are_refused():
    offsets, data = np.array([0, 1, 9], dtype=np.int32), np.frombuffer(b"ab", dtype=np.uint8)
    with pytest.raises(ValueError):
        join_groups([(offsets, data, np.ones(2, dtype=np.uint8), np.zeros(2, dtype=np.int64))],
                    1, b",")

"""The gather of bookkeeping rows (merge_engine.write.row_gather, used by StateBatch.gather and the
changelog's images) against numpy's join-then-take: several matrices of one dtype and width,
matrices that are slices or column selections (not contiguous), repeated and omitted rows, and
rows outside their matrix refused before anything is copied."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from merge_engine.testing.profiles import examples
from merge_engine.write.row_gather import gather_rows


@st.composite
def gathers(draw):
    dtype = draw(st.sampled_from([np.bool_, np.int64, np.int8]))
    width = draw(st.integers(0, 6))
    parts = []
    for _ in range(draw(st.integers(1, 4))):
        rows = draw(st.integers(0, 7))
        extra = draw(st.integers(0, 2))  # columns dropped after: a non-contiguous matrix
        values = np.array(draw(st.lists(st.integers(-100, 100), min_size=rows * (width + extra),
                                        max_size=rows * (width + extra))), dtype=np.int64)
        matrix = values.reshape(rows, width + extra).astype(dtype)
        parts.append(matrix[:, extra:] if draw(st.booleans()) else matrix[:, :width])
    nonempty = [s for s, p in enumerate(parts) if len(p)]
    picks = []
    if nonempty:
        picks = draw(st.lists(st.tuples(st.sampled_from(nonempty), st.integers(0, 6)),
                              max_size=20))
    picks = [(s, r % len(parts[s])) for s, r in picks]
    return parts, picks


@settings(max_examples=examples(300))
@given(case=gathers())
def test_gather_rows_equals_joining_then_taking(case):
    parts, picks = case
    source = np.array([s for s, _ in picks], dtype=np.int64)
    rows = np.array([r for _, r in picks], dtype=np.int64)
    got = gather_rows(parts, source, rows)
    bounds = np.cumsum([0] + [len(p) for p in parts])
    want = np.concatenate(parts)[bounds[source] + rows] if len(picks) else \
        np.empty((0, parts[0].shape[1]), dtype=parts[0].dtype)
    assert got.dtype == parts[0].dtype
    assert got.shape == want.shape
    assert (got == want).all()


@pytest.mark.parametrize("width", [0, 3])
@pytest.mark.parametrize("source, row", [([0], [2]), ([0], [-1]), ([1], [0]), ([-1], [0]),
                                         ([0, 0], [0, 5])])
def test_a_row_outside_its_matrix_is_refused(width, source, row):
    with pytest.raises(IndexError):
        gather_rows([np.zeros((2, width), dtype=np.int64)], np.array(source), np.array(row))


def test_matrices_of_different_widths_or_dtypes_are_refused():
    with pytest.raises(ValueError):
        gather_rows([np.zeros((2, 3)), np.zeros((2, 2))], np.zeros(1), np.zeros(1))
    with pytest.raises(ValueError):
        gather_rows([np.zeros((2, 3), dtype=bool), np.zeros((2, 3))], np.zeros(1), np.zeros(1))

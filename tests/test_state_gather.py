"""StateBatch.gather: rows of several batches taken as one, without joining them first.

The reference is the plain way it replaces: join the batches (StateBatch.concat), then take.
Batches differ in which bookkeeping they hold (contribution counts, row times, or none), and
positions may leave batches out entirely or repeat rows.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
from hypothesis import given, settings, strategies as st

from merge_engine.write.state import StateBatch

WIDTH = 4
# The fourth column's type: numbers of each width and kind go through the compiled gather,
# booleans and decimals through Arrow's take.
OTHER_TYPES = [pa.int8(), pa.uint64(), pa.float32(), pa.float64(), pa.date32(),
               pa.timestamp("us"), pa.bool_(), pa.decimal128(22, 2)]


def _typed(values: list, arrow_type: pa.DataType) -> pa.Array:
    if pa.types.is_unsigned_integer(arrow_type):
        values = [None if v is None else abs(v) for v in values]
    source = pa.int32() if pa.types.is_date32(arrow_type) else pa.int64()
    return pa.array(values, source).cast(arrow_type)


@st.composite
def batches(draw):
    out = []
    other = draw(st.sampled_from(OTHER_TYPES))
    for _ in range(draw(st.integers(1, 5))):
        n = draw(st.integers(1, 6))
        ints = draw(st.lists(st.none() | st.integers(-5, 5), min_size=n, max_size=n))
        texts = draw(st.lists(st.none() | st.text("ab,", max_size=4), min_size=n, max_size=n))
        written = np.array(draw(st.lists(st.lists(st.booleans(), min_size=WIDTH, max_size=WIDTH),
                                         min_size=n, max_size=n)), dtype=bool)
        counts = None
        if draw(st.booleans()):
            counts = np.array(draw(st.lists(st.lists(st.integers(0, 9), min_size=WIDTH,
                                                     max_size=WIDTH), min_size=n, max_size=n)),
                              dtype=np.int64)
        touched = None
        if draw(st.booleans()):
            touched = np.array(draw(st.lists(st.integers(0, 10**12), min_size=n, max_size=n)),
                               dtype=np.int64)
        out.append(StateBatch([pa.array(ints, pa.int64()), pa.array(texts, pa.string()),
                               pa.array(ints, pa.int64()), _typed(ints, other)],
                              written, counts, touched))
    total = sum(len(b) for b in out)
    positions = draw(st.lists(st.integers(0, total - 1), max_size=12))
    return out, np.array(positions, dtype=np.int64)


@settings(max_examples=200, deadline=None)
@given(batches())
def test_gather_equals_joining_then_taking(case):
    parts, positions = case
    got = StateBatch.gather(parts, positions)
    want = StateBatch.concat(*parts).take(positions)
    assert [c.to_pylist() for c in got.columns] == [c.to_pylist() for c in want.columns]
    assert [c.type for c in got.columns] == [c.type for c in want.columns]
    assert (got.written == want.written).all()
    assert (got.counts() == want.counts()).all()
    assert (got.times() == want.times()).all()

"""Puts onto stored rows fold the inputs alone and combine once with the stored cell
(`Aggregator.fold_onto`: sum of integers, max, min, last non-null, plain string_agg).

Two levels: each aggregator's fold_onto equals its fold of the stored cell followed by the
inputs, on arrays drawn with nulls, unwritten stored cells, ties, NaN and -0.0, values at the
integer bounds (there fold_onto may decline, never differ); and a real KvTablet against the
plain-Python reference model (TabletHarness) with puts of several rows per key onto keys that
exist, partial writes, deletes, MERGE_STATE inputs and reopens, beside every other function.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from aggfuncs import AggFunction as F
from aggfuncs import Segments, make_aggregator
from merge_engine.testing import TableSpec
from merge_engine.testing.harness import TabletHarness
from merge_engine.testing.ops import Put
from merge_engine.testing.profiles import examples, load_profile
from merge_engine.testing.strategies import puts, table_specs, values_of, write_sequences
from tests.tablet_helpers import ingest_spec

load_profile()

ONTO = (F.SUM, F.MAX, F.MIN, F.LAST_VALUE_IGNORE_NULLS, F.STRING_AGG)
MIXED = ONTO * 3 + (F.COUNT, F.PRODUCT, F.LAST_VALUE, F.FIRST_VALUE, F.ARRAY_AGG, F.BOOL_OR)
# Every width and kind the compiled folds (aggfuncs.stored_folds) take, and some they do not.
ORDERED = [pa.int8(), pa.int16(), pa.int32(), pa.int64(), pa.uint8(), pa.uint16(), pa.uint32(),
           pa.uint64(), pa.float32(), pa.float64(), pa.string(), pa.date32(),
           pa.timestamp("us"), pa.decimal128(5, 2)]
TYPES = {
    F.SUM: [pa.int8(), pa.int16(), pa.int32(), pa.int64(), pa.uint8(), pa.uint32(), pa.uint64(),
            pa.float64()],
    F.MAX: ORDERED,
    F.MIN: ORDERED,
    F.LAST_VALUE_IGNORE_NULLS: [pa.int8(), pa.int64(), pa.uint16(), pa.string(), pa.float32(),
                                pa.float64(), pa.date32(), pa.timestamp("us"), pa.bool_()],
    F.STRING_AGG: [pa.string()],
}


@st.composite
def fold_cases(draw):
    function = draw(st.sampled_from(ONTO))
    arrow_type = draw(st.sampled_from(TYPES[function]))
    params = {"delimiter": draw(st.sampled_from([",", ";", "ab"]))} if function is F.STRING_AGG \
        else {}
    groups = draw(st.integers(1, 6))
    stored = draw(st.lists(values_of(arrow_type), min_size=groups, max_size=groups))
    stored_written = draw(st.lists(st.booleans(), min_size=groups, max_size=groups))
    # every group gets at least one input row, in a drawn order
    extra = draw(st.lists(st.integers(0, groups - 1), max_size=12))
    group_ids = draw(st.permutations(list(range(groups)) + extra))
    inputs = draw(st.lists(values_of(arrow_type), min_size=len(group_ids),
                           max_size=len(group_ids)))
    return function, arrow_type, params, stored, stored_written, group_ids, inputs


@settings(max_examples=examples(600))
@given(case=fold_cases())
def test_fold_onto_equals_the_fold_of_stored_then_inputs(case):
    function, arrow_type, params, stored, stored_written, group_ids, inputs = case
    agg = make_aggregator(function, "v", arrow_type, params)
    stored_states = pa.array(stored, type=agg.state_type)
    states = agg.to_state(agg.cast_input(pa.array(inputs, type=arrow_type)))
    written = np.array(stored_written, dtype=bool)
    groups = Segments(np.array(group_ids, dtype=np.int64), len(stored))
    try:
        expected = agg.fold(pa.concat_arrays([stored_states, states]),
                            np.concatenate([written, np.ones(len(inputs), dtype=bool)]),
                            Segments.after_stored(groups))
    except Exception as exc:  # noqa: BLE001 - an overflow: fold_onto must not accept it
        expected = exc
    onto = agg.fold_onto(stored_states, written, states, groups)
    event(f"{function.value}: {'declined' if onto is None else 'combined'}")
    if onto is None:
        return
    assert not isinstance(expected, Exception), f"fold_onto accepted what fold refuses: {expected}"
    assert onto.type == expected.type
    assert onto.to_pylist() == expected.to_pylist() or _same_floats(onto, expected)


def _same_floats(a: pa.Array, b: pa.Array) -> bool:
    """Equal bit for bit (NaN equals NaN, -0.0 differs from 0.0)."""
    if not pa.types.is_floating(a.type):
        return False
    x, y = a.to_numpy(zero_copy_only=False), b.to_numpy(zero_copy_only=False)
    valid = a.is_valid().to_numpy(zero_copy_only=False)
    return bool((valid == b.is_valid().to_numpy(zero_copy_only=False)).all()
                and (x[valid].tobytes() == y[valid].tobytes()))


@st.composite
def repeated_key_writes(draw, spec: TableSpec) -> list:
    """Puts of several rows per key (few keys), twice over so the second round lands on stored
    rows, among deletes and reopens."""
    first = draw(st.lists(puts(spec, ["AGGREGATE", "MERGE_STATE"]), min_size=1, max_size=6))
    others = draw(write_sequences(spec, max_size=6, modes=["AGGREGATE", "MERGE_STATE"]))
    return first + others + first


@settings(max_examples=examples(80))
@given(data=st.data(), spec=table_specs(aggregation=True, functions=MIXED))
def test_repeated_keys_onto_stored_rows_match_the_model(tmp_path_factory, data, spec):
    writes = data.draw(repeated_key_writes(spec), label="writes")
    with TabletHarness(spec, tmp_path_factory.mktemp("t")) as harness:
        for write in writes:
            harness.apply(write)


def test_the_ingest_shape_onto_stored_rows_matches_the_model(tmp_path):
    """The ingest benchmark's columns, many rows per key over keys that exist, nulls in every
    column, in dict and Arrow form."""
    spec = ingest_spec()
    rng = np.random.default_rng(11)

    def rows(n):
        ids = rng.integers(0, 40, n).tolist()
        return tuple({"id": i, "qty": None if rng.random() < 0.1 else int(rng.integers(-5, 5)),
                      "price": None if rng.random() < 0.1 else float(rng.random()),
                      "tag": None if rng.random() < 0.2 else f"t{int(rng.integers(9))}",
                      "status": None if rng.random() < 0.4 else "paid"} for i in ids)

    with TabletHarness(spec, tmp_path) as harness:
        for n, arrow in ((200, True), (300, False), (150, True)):
            harness.apply(Put(rows(n), arrow=arrow))


def test_the_compiled_folds_refuse_groups_outside_the_stored_cells():
    """A group past the stored cells would write outside them: refused before any row is
    read, as are validity arrays of another length."""
    from aggfuncs import stored_folds

    best, held = np.zeros(2, dtype=np.int64), np.zeros(2, dtype=np.uint8)
    one = np.ones(1, dtype=np.uint8)
    with pytest.raises(IndexError):
        stored_folds.extreme_onto(best, held, np.ones(1, dtype=np.int64), one,
                                  np.array([2], dtype=np.int64), True)
    with pytest.raises(IndexError):
        stored_folds.sum_onto(best, held, np.ones(1, dtype=np.int64), one,
                              np.array([-1], dtype=np.int64), -10, 10)
    with pytest.raises(IndexError):
        stored_folds.last_valid(one, np.array([5], dtype=np.int64), 2)
    with pytest.raises(ValueError):
        stored_folds.extreme_onto(best, held, np.ones(2, dtype=np.int64), one,
                                  np.zeros(2, dtype=np.int64), True)
    with pytest.raises(TypeError):  # int64 cannot hold uint64 totals; a float sum is a left fold
        stored_folds.sum_onto(best, held, np.ones(1, dtype=np.uint64), one,
                              np.zeros(1, dtype=np.int64), -10, 10)
    assert not held.any() and not best.any()


def test_a_sum_step_outside_the_column_declines_the_compiled_fold():
    """int8: 120 + 10 leaves the range even though - 20 would bring it back; the compiled
    fold declines and the exact fold (which refuses the write) decides."""
    agg = make_aggregator(F.SUM, "v", pa.int8(), {})
    onto = agg.fold_onto(pa.array([120], type=pa.int8()), np.ones(1, dtype=bool),
                         pa.array([10, -20], type=pa.int8()), Segments(np.zeros(2, np.int64), 1))
    assert onto is None
    within = agg.fold_onto(pa.array([120], type=pa.int8()), np.ones(1, dtype=bool),
                           pa.array([-20, 10], type=pa.int8()), Segments(np.zeros(2, np.int64), 1))
    assert within.to_pylist() == [110]

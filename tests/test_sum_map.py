"""sum_map through a real KvTablet: per-key sums, zero sums dropped, retraction, overflow per
key, cell bounds, undo, pre-aggregation, and agreement with the reference model."""

from __future__ import annotations

import tempfile
from decimal import Decimal

import pyarrow as pa
import pytest
from hypothesis import given, settings, strategies as st

from aggfuncs import AggFunction as F, make_aggregator
from merge_engine import MergeMode
from merge_engine.kv.tablet import KvTablet
from merge_engine.testing import ColumnSpec, TableSpec
from merge_engine.testing.harness import TabletHarness
from merge_engine.testing.profiles import examples, load_profile
from merge_engine.testing.strategies import write_sequences
from merge_engine.write.preaggregate import preaggregate
from recovery import undo_bucket
from tally.errors import AggregateOverflowError, InvalidAggFunctionError, InvalidInputError

load_profile()

AGG = {"table.merge-engine": "aggregation", "table.delete.behavior": "allow"}
COUNTS = pa.map_(pa.string(), pa.int64())
# Small sums (overflow has its own test): entries of a few keys, so that they meet.
SMALL_MAPS = st.lists(st.tuples(st.sampled_from("abc"), st.integers(-3, 3) | st.none()), max_size=3)


def spec(arrow_type=COUNTS, **params) -> TableSpec:
    return TableSpec((ColumnSpec("k", pa.int64(), nullable=False),
                      ColumnSpec("m", arrow_type, F.SUM_MAP, params)), ("k",), AGG)


def tablet(path, arrow_type=COUNTS, **params) -> KvTablet:
    return KvTablet.open(str(path), spec(arrow_type, **params).descriptor())


def value(t, key=1):
    row = t.lookup({"k": key})
    return None if row is None else row["m"]


def test_sums_per_key_sorted_and_zero_sums_leave(tmp_path):
    with tablet(tmp_path) as t:
        t.put([{"k": 1, "m": [("b", 2), ("a", 1)]}, {"k": 1, "m": [("b", 3), ("b", 1)]}])
        assert value(t) == [("a", 1), ("b", 6)]
        t.put([{"k": 1, "m": [("a", -1), ("c", None), ("d", 0)]}])
        assert value(t) == [("b", 6)]  # a came to zero; a null adds nothing; d's 0 is no entry
        end = t.log_end_offset
        t.put([{"k": 1, "m": None}, {"k": 1, "m": []}])
        assert t.log_end_offset == end  # nothing to add: no changelog entry
        t.put([{"k": 1, "m": [("b", -6)]}])
        assert value(t) is None  # no entries left: the empty state
        t.put([{"k": 2, "m": [("y", 1), ("y", 2), ("x", 0)]}], mode=MergeMode.OVERWRITE)
        assert value(t, 2) == [("y", 3)]


def test_retraction_subtracts_each_entry_exactly(tmp_path):
    with tablet(tmp_path) as t:
        t.put([{"k": 1, "m": [("a", 5), ("b", 2)]}, {"k": 1, "m": [("a", 1)]}])
        t.put([{"k": 1, "m": [("a", 5), ("b", 2)], "_change_type": "-U"}])
        assert value(t) == [("a", 1)]
        t.put([{"k": 1, "m": [("a", 1)], "_change_type": "-D"},
               {"k": 1, "m": [("z", 4)], "_change_type": "+I"}])
        assert value(t) == [("z", 4)]
        # A retraction of something never added leaves its negation (sums are exact).
        t.put([{"k": 1, "m": [("q", 3)], "_change_type": "-D"}])
        assert value(t) == [("q", -3), ("z", 4)]


def test_every_running_sum_of_a_key_fits_the_value_type(tmp_path):
    with tablet(tmp_path, pa.map_(pa.string(), pa.int8())) as t:
        t.put([{"k": 1, "m": [("a", 100)]}])
        end = t.log_end_offset
        with pytest.raises(AggregateOverflowError, match="sum_map column 'm'"):
            t.put([{"k": 1, "m": [("a", 100)]}, {"k": 1, "m": [("a", -100)]}])
        assert t.log_end_offset == end and value(t) == [("a", 100)]


def test_floats_and_decimals(tmp_path):
    with tablet(tmp_path / "f", pa.map_(pa.int64(), pa.float64())) as t:
        t.put([{"k": 1, "m": [(1, 0.1)]}, {"k": 1, "m": [(1, 0.2)]}, {"k": 1, "m": [(2, -0.0)]}])
        assert value(t) == [(1, 0.1 + 0.2)]  # -0.0 is a zero sum: no entry
    with tablet(tmp_path / "d", pa.map_(pa.string(), pa.decimal128(10, 2))) as t:
        t.put([{"k": 1, "m": [("a", Decimal("1.10"))]}, {"k": 1, "m": [("a", Decimal("2.05"))]}])
        assert value(t) == [("a", Decimal("3.15"))]


def test_cell_bounds(tmp_path):
    with tablet(tmp_path, **{"max-elements": 2}) as t:
        t.put([{"k": 1, "m": [("a", 1), ("b", 2)]}])
        end = t.log_end_offset
        with pytest.raises(InvalidInputError, match="'m'.*max-elements"):
            t.put([{"k": 1, "m": [("c", 3)]}])
        t.put([{"k": 1, "m": [("a", -1), ("c", 3)]}])  # a leaves as c comes: two entries
        assert value(t) == [("b", 2), ("c", 3)] and t.log_end_offset == end + 2
    with pytest.raises(InvalidAggFunctionError, match="max-elements"):
        make_aggregator("sum_map", "m", COUNTS, {"max-elements": "many"})


@pytest.mark.parametrize("arrow_type", [pa.map_(pa.string(), pa.string()),
                                        pa.map_(pa.float64(), pa.int64()), pa.int64()])
def test_only_maps_of_numbers_with_ordered_keys(arrow_type):
    with pytest.raises(InvalidAggFunctionError, match="sum_map column 'm'"):
        make_aggregator("sum_map", "m", arrow_type)


def test_a_bad_value_applies_nothing(tmp_path):
    with tablet(tmp_path) as t:
        with pytest.raises(InvalidInputError, match="'m'"):
            t.put([{"k": 1, "m": [("a", 1)]}, {"k": 2, "m": [("a", "one")]}])
        assert t.log_end_offset == 0


def test_undo_restores_the_sums(tmp_path):
    with tablet(tmp_path) as t:
        t.put([{"k": 1, "m": [("a", 1), ("b", 2)]}])
        baseline, before = t.log_end_offset, t.to_arrow()
        t.put([{"k": 1, "m": [("a", -1), ("c", 5)]}, {"k": 2, "m": [("x", 1)]}])
        undo_bucket(t, baseline)
        assert t.to_arrow().equals(before)


@settings(max_examples=examples(40), deadline=None)
@given(batches=st.lists(st.lists(st.tuples(st.integers(1, 2), st.none() | SMALL_MAPS),
                                 min_size=1, max_size=5), min_size=1, max_size=3))
def test_preaggregated_states_equal_the_raw_rows(batches):
    descriptor = spec().descriptor()
    with tempfile.TemporaryDirectory() as a, tempfile.TemporaryDirectory() as b, \
            KvTablet.open(a, descriptor) as raw, KvTablet.open(b, descriptor) as folded:
        for batch in batches:
            rows = [{"k": k, "m": m} for k, m in batch]
            raw.put(rows)
            folded.put(preaggregate(rows, descriptor), mode=MergeMode.MERGE_STATE)
        assert raw.to_arrow().equals(folded.to_arrow())


@settings(max_examples=examples(40), deadline=None)
@given(data=st.data())
def test_sum_map_agrees_with_the_model_in_every_mode(data):
    arrow_type = data.draw(st.sampled_from([COUNTS, pa.map_(pa.string(), pa.int8()),
                                            pa.map_(pa.int64(), pa.float32())]))
    table = spec(arrow_type)
    with tempfile.TemporaryDirectory() as d, TabletHarness(table, d) as h:
        h.run(data.draw(write_sequences(table, max_size=8)))

"""avg through a real KvTablet: the mean readers see, the sum-and-count state, retraction,
partial states, undo, pre-aggregation, and bad input that applies nothing."""

from __future__ import annotations

import tempfile
from decimal import Decimal

import pyarrow as pa
import pytest
from hypothesis import given, settings, strategies as st

from aggfuncs import AggFunction as F, make_aggregator
from merge_engine import MergeMode, TableDescriptor
from merge_engine.kv.tablet import KvTablet
from merge_engine.testing import ColumnSpec, ReferenceTable, TableSpec
from merge_engine.testing.harness import TabletHarness
from merge_engine.testing.ops import Put
from merge_engine.testing.profiles import examples, load_profile
from merge_engine.testing.strategies import write_sequences
from merge_engine.write.preaggregate import preaggregate
from recovery import undo_bucket
from tally.errors import (AggregateOverflowError, InvalidAggFunctionError, InvalidInputError,
                          RetractionError)

load_profile()

AGG = {"table.merge-engine": "aggregation", "table.delete.behavior": "allow"}
MONEY = pa.decimal128(10, 2)


def spec(arrow_type=pa.float64()) -> TableSpec:
    return TableSpec((ColumnSpec("k", pa.int64(), nullable=False),
                      ColumnSpec("f", pa.float64(), F.AVG), ColumnSpec("d", MONEY, F.AVG),
                      ColumnSpec("x", arrow_type, F.AVG)), ("k",), AGG)


def tablet(path) -> KvTablet:
    return KvTablet.open(str(path), spec().descriptor())


def row(t, key=1) -> dict:
    return t.lookup({"k": key})


def test_readers_see_the_mean_and_images_carry_sum_and_count(tmp_path):
    with tablet(tmp_path) as t:
        t.put([{"k": 1, "f": 1, "d": 1, "x": 2.5}, {"k": 1, "f": 2, "d": 2, "x": None}])
        t.put([{"k": 1, "f": 4, "d": Decimal("4.01"), "x": None}])
        assert row(t) == {"k": 1, "f": 7 / 3, "d": Decimal("2.34"), "x": 2.5}
        assert t.to_arrow().schema.field("f").type == pa.float64()
        assert t.to_arrow().column("d").to_pylist() == [Decimal("2.34")]  # 7.01 / 3, HALF_UP
        tokens = t.changelog().to_pylist()[-1]["_tokens"]
        assert tokens["f"] == {"sum": 7.0, "count": 3}
        assert tokens["d"] == {"sum": Decimal("7.01"), "count": 3}
        assert tokens["x"] == {"sum": 2.5, "count": 1}


def test_retraction_subtracts_and_count_zero_is_empty(tmp_path):
    with tablet(tmp_path) as t:
        t.put([{"k": 1, "f": 2.0, "d": 2, "x": 0.1}, {"k": 1, "f": 4.0, "d": 4, "x": 0.2}])
        t.put([{"k": 1, "f": 2.0, "d": 2, "x": 0.1, "_change_type": "-U"}])
        assert row(t) == {"k": 1, "f": 4.0, "d": Decimal("4.00"), "x": pytest.approx(0.2)}
        t.put([{"k": 1, "f": 4.0, "d": 4, "x": 0.2, "_change_type": "-D"}])
        # Count 0: empty, whatever a float sum kept of 0.1 + 0.2 - 0.1 - 0.2.
        assert row(t) == {"k": 1, "f": None, "d": None, "x": None}
        end = t.log_end_offset
        with pytest.raises(RetractionError, match="'f'"):
            t.put([{"k": 1, "f": 1.0, "_change_type": "-D"}], target_columns=["k", "f"])
        assert t.log_end_offset == end


def test_partial_states_merge_and_overwrite_replaces(tmp_path):
    with tablet(tmp_path) as t:
        t.put([{"k": 1, "f": 3.0, "d": 3}])
        t.put([{"k": 1, "f": {"sum": 9.0, "count": 3}, "d": {"sum": Decimal(1), "count": 1}},
               {"k": 1, "f": {"sum": 0.0, "count": 0}, "d": None}], mode=MergeMode.MERGE_STATE)
        assert (row(t)["f"], row(t)["d"]) == (3.0, Decimal("2.00"))
        t.put([{"k": 1, "f": 10.0}], mode=MergeMode.MERGE_STATE, target_columns=["k", "f"])
        assert row(t)["f"] == 22 / 5  # a number is the state of that one number
        t.put([{"k": 1, "f": {"sum": 1.0, "count": 4}}], mode=MergeMode.OVERWRITE,
              target_columns=["k", "f"])
        assert row(t)["f"] == 0.25
        t.put([{"k": 1, "f": 8.0}], mode=MergeMode.OVERWRITE, target_columns=["k", "f"])
        assert row(t)["f"] == 8.0


@pytest.mark.parametrize("state", [{"sum": 1.0, "count": -1}, {"sum": 1.0, "count": 0},
                                   {"sum": None, "count": 2}, {"sum": 1.0, "count": None}])
def test_a_bad_partial_state_applies_nothing(tmp_path, state):
    with tablet(tmp_path) as t:
        t.put([{"k": 1, "f": 3.0}], target_columns=["k", "f"])
        end = t.log_end_offset
        with pytest.raises(InvalidInputError, match="'f'"):
            t.put([{"k": 2, "f": 1.0}, {"k": 1, "f": state}], mode=MergeMode.MERGE_STATE,
                  target_columns=["k", "f"])
        assert t.log_end_offset == end and row(t, 2) is None


def test_bad_types_and_values_are_refused_naming_the_column(tmp_path):
    with pytest.raises(InvalidAggFunctionError, match="avg column 'n'.*int64"):
        make_aggregator("avg", "n", pa.int64())
    with pytest.raises(InvalidAggFunctionError, match="Parameter 'by'"):
        make_aggregator("avg", "n", pa.float64(), {"by": "k"})
    with tablet(tmp_path) as t:
        with pytest.raises(InvalidInputError, match="'d'"):
            t.put([{"k": 1, "d": Decimal("1.001")}], target_columns=["k", "d"])
        with pytest.raises(InvalidInputError, match="'f'"):
            t.put([{"k": 1, "f": "many"}], target_columns=["k", "f"])
        assert t.log_end_offset == 0


def test_a_decimal_sum_beyond_38_digits_is_an_overflow(tmp_path):
    wide = pa.decimal128(38, 0)
    with KvTablet.open(str(tmp_path), spec(wide).descriptor()) as t:
        top = Decimal(10**38 - 1)
        t.put([{"k": 1, "x": top}], target_columns=["k", "x"])
        with pytest.raises(AggregateOverflowError, match="avg column 'x'"):
            t.put([{"k": 1, "x": top}], target_columns=["k", "x"])
        assert row(t)["x"] == top


def test_undo_restores_sum_and_count_exactly(tmp_path):
    with tablet(tmp_path) as t:
        t.put([{"k": 1, "f": 1.0, "d": 1, "x": 1.0}, {"k": 1, "f": 2.0, "d": 2, "x": 5.0}])
        baseline, before = t.log_end_offset, t.to_arrow()
        t.put([{"k": 1, "f": 9.0, "d": 9, "x": 9.0}, {"k": 2, "f": 1.0, "d": 1, "x": 1.0}])
        undo_bucket(t, baseline)
        assert t.to_arrow().equals(before)
        # The counts came back too: one more value averages over three, not one.
        t.put([{"k": 1, "f": 3.0, "d": 3, "x": 3.0}])
        assert row(t) == {"k": 1, "f": 2.0, "d": Decimal("2.00"), "x": 3.0}


@settings(max_examples=examples(40), deadline=None)
@given(batches=st.lists(st.lists(st.tuples(st.integers(1, 2), st.integers(-50, 50) | st.none()),
                                 min_size=1, max_size=6), min_size=1, max_size=3))
def test_preaggregated_states_equal_the_raw_rows(batches):
    descriptor = spec().descriptor()
    with tempfile.TemporaryDirectory() as a, tempfile.TemporaryDirectory() as b, \
            KvTablet.open(a, descriptor) as raw, KvTablet.open(b, descriptor) as folded:
        for batch in batches:
            rows = [{"k": k, "f": v, "d": v, "x": None if v is None else v / 4} for k, v in batch]
            raw.put(rows)
            folded.put(preaggregate(rows, descriptor), mode=MergeMode.MERGE_STATE)
        assert raw.to_arrow().equals(folded.to_arrow())


@settings(max_examples=examples(40), deadline=None)
@given(data=st.data())
def test_avg_agrees_with_the_model_in_every_mode(data):
    arrow_type = data.draw(st.sampled_from([pa.float32(), pa.float64(), pa.decimal128(5, 2),
                                            pa.decimal128(38, 6)]))
    table = spec(arrow_type)
    with tempfile.TemporaryDirectory() as d, TabletHarness(table, d) as h:
        h.run(data.draw(write_sequences(table, max_size=8)))
        h.apply(Put(({"k": 9, "x": None},), "AGGREGATE", ("k", "x")))


def test_a_descriptor_round_trips_an_avg_column():
    descriptor = spec().descriptor()
    again = TableDescriptor.from_json(descriptor.to_json())
    assert [a.function for a in again.aggregators()][1:] == [F.AVG] * 3


def mixed_spec() -> TableSpec:
    """avg, sum_map and arg_max columns together (their states all are more than a value)."""
    return TableSpec((ColumnSpec("k", pa.int64(), nullable=False),
                      ColumnSpec("price", pa.int64(), F.MAX), ColumnSpec("mean", MONEY, F.AVG),
                      ColumnSpec("per", pa.map_(pa.string(), pa.int64()), F.SUM_MAP),
                      ColumnSpec("top", pa.string(), F.ARG_MAX, {"by": "price"})), ("k",), AGG)


@settings(max_examples=examples(30), deadline=None)
@given(data=st.data())
def test_undo_restores_every_state_after_any_writes(data):
    table = mixed_spec()
    before_ops = data.draw(write_sequences(table, max_size=5), label="before")
    after_ops = data.draw(write_sequences(table, min_size=1, max_size=5), label="after")
    with tempfile.TemporaryDirectory() as d, TabletHarness(table, d) as h:
        h.run(before_ops)
        baseline, state = h.tablet.log_end_offset, h.tablet.to_arrow()
        expected = h.model.states()  # hidden states (sums and counts, ordering values) too
        h.run(after_ops)  # the model agrees at every step
        undo_bucket(h.tablet, baseline)
        assert h.tablet.to_arrow().equals(state)
        # The hidden states came back too: the changelog, undo's records included, replays
        # consistently (every -U image is the stored state), into the states before.
        replayed = ReferenceTable(table).replay(h.tablet.changelog(), strict=True)
        assert len(replayed.states()) == len(expected)
        assert all(a.same_as(b) for a, b in zip(replayed.states(), expected))

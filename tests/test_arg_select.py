"""arg_max and arg_min through a real KvTablet: the value at the extreme of the `by` column,
ties, nulls, the `by` column a write must carry, partial states, undo, pre-aggregation,
retraction refused, bad definitions, and agreement with the reference model."""

from __future__ import annotations

import datetime
import tempfile

import pyarrow as pa
import pytest
from hypothesis import given, settings, strategies as st

from aggfuncs import AggFunction as F
from merge_engine import MergeMode, Schema, TableDescriptor
from merge_engine.kv.tablet import KvTablet
from merge_engine.testing import ColumnSpec, TableSpec
from merge_engine.testing.harness import TabletHarness
from merge_engine.testing.profiles import examples, load_profile
from merge_engine.testing.strategies import table_specs, write_sequences
from merge_engine.write.preaggregate import preaggregate
from recovery import undo_bucket
from tally.errors import InvalidAggFunctionError, InvalidInputError, RetractionError

load_profile()

AGG = {"table.merge-engine": "aggregation", "table.delete.behavior": "allow"}


def spec(by_type=pa.float64(), value_type=pa.string(), price=F.MAX, **params) -> TableSpec:
    return TableSpec((ColumnSpec("k", pa.int64(), nullable=False),
                      ColumnSpec("price", by_type, price),
                      ColumnSpec("top", value_type, F.ARG_MAX, {"by": "price", **params}),
                      ColumnSpec("low", value_type, F.ARG_MIN, {"by": "price", **params})),
                     ("k",), AGG)


def tablet(path, **kwargs) -> KvTablet:
    return KvTablet.open(str(path), spec(**kwargs).descriptor())


def picked(t, key=1):
    row = t.lookup({"k": key})
    return None if row is None else (row["top"], row["low"])


def rows(*pairs, key=1):
    return [{"k": key, "price": p, "top": v, "low": v} for p, v in pairs]


def test_the_value_at_the_largest_and_smallest_ordering_value(tmp_path):
    with tablet(tmp_path) as t:
        t.put(rows((3.0, "c"), (5.0, "e"), (1.0, "a")))
        assert picked(t) == ("e", "a")
        t.put(rows((4.0, "d")))
        assert picked(t) == ("e", "a")
        t.put(rows((float("nan"), "nan"), (-0.0, "minus zero"), (0.0, "zero")))
        # max's total order: NaN is the largest float, -0.0 below 0.0.
        assert picked(t) == ("nan", "minus zero")
        low = t.changelog().to_pylist()[-1]["_tokens"]["low"]
        assert low["value"] == "minus zero" and str(low["by"]) == "-0.0"


def test_ties_keep_the_earlier_arrival_and_nulls_contribute_nothing(tmp_path):
    with tablet(tmp_path) as t:
        t.put(rows((2.0, "first"), (2.0, "second")))
        assert picked(t) == ("first", "first")
        end = t.log_end_offset
        t.put(rows((2.0, "third"), (None, "no price")))
        assert picked(t) == ("first", "first") and t.log_end_offset == end
        t.put(rows((9.0, None)))  # the price is the max's; a null value is no contribution
        assert picked(t) == ("first", "first") and t.lookup({"k": 1})["price"] == 9.0
        t.put(rows((None, "x"), key=2))
        assert picked(t, 2) == (None, None)


def test_a_write_to_the_column_must_carry_its_by_column(tmp_path):
    with tablet(tmp_path) as t:
        t.put(rows((1.0, "a")))
        end = t.log_end_offset
        for mode in MergeMode:
            with pytest.raises(InvalidInputError, match="'top'.*must carry column 'price'"):
                t.put([{"k": 2, "top": "b"}], mode=mode, target_columns=["k", "top"])
        assert t.log_end_offset == end and picked(t, 2) is None
        # A partial write without the column needs no price.
        t.put([{"k": 1, "price": 7.0}], target_columns=["k", "price"])
        assert picked(t) == ("a", "a")


def test_the_by_value_is_the_rows_not_the_by_columns_aggregate(tmp_path):
    schema = (Schema.builder().column("k", pa.int64()).agg_column("qty", pa.int64(), "sum")
              .agg_column("biggest", pa.string(), "arg_max", by="qty").primary_key("k").build())
    with KvTablet.open(str(tmp_path), TableDescriptor(schema, properties=AGG)) as t:
        t.put([{"k": 1, "qty": 5, "biggest": "five"}, {"k": 1, "qty": 3, "biggest": "three"},
               {"k": 1, "qty": 4, "biggest": "four"}])
        assert t.lookup({"k": 1}) == {"k": 1, "qty": 12, "biggest": "five"}


def test_partial_states_and_overwrite(tmp_path):
    with tablet(tmp_path) as t:
        t.put(rows((3.0, "c")))
        t.put([{"k": 1, "top": {"value": "s", "by": 8.0}, "low": {"value": "t", "by": 0.5}}],
              mode=MergeMode.MERGE_STATE, target_columns=["k", "top", "low"])
        assert picked(t) == ("s", "t")
        t.put(rows((2.0, "o")), mode=MergeMode.OVERWRITE)
        assert picked(t) == ("o", "o")
        t.put(rows((1.0, "p")))
        assert picked(t) == ("o", "p")


def test_retraction_is_refused_unless_ignored(tmp_path):
    with tablet(tmp_path, price=F.SUM) as t:  # a sum takes retractions back
        t.put(rows((3.0, "c")))
        end = t.log_end_offset
        with pytest.raises(RetractionError, match="'top'.*ignore-retract"):
            t.put([{**rows((3.0, "c"))[0], "_change_type": "-D"}])
        assert t.log_end_offset == end
    with tablet(tmp_path / "ignoring", price=F.SUM, **{"ignore-retract": "true"}) as t:
        t.put(rows((3.0, "c")))
        t.put([{**rows((9.0, "i"))[0], "_change_type": "-U"}, *rows((1.0, "a"))])
        assert picked(t) == ("c", "a")


def test_undo_restores_value_and_ordering_value(tmp_path):
    with tablet(tmp_path, value_type=pa.list_(pa.int64())) as t:
        t.put([{"k": 1, "price": 5.0, "top": [5], "low": [5]}])
        baseline, before = t.log_end_offset, t.to_arrow()
        t.put([{"k": 1, "price": 9.0, "top": [9], "low": [9]},
               {"k": 1, "price": 1.0, "top": [1, 1], "low": [1, 1]}])
        undo_bucket(t, baseline)
        assert t.to_arrow().equals(before)
        # The ordering value came back too: 7 beats 5 but not 9.
        t.put([{"k": 1, "price": 7.0, "top": [7], "low": [7]}])
        assert picked(t) == ([7], [5])


@pytest.mark.parametrize("params, match", [
    ({}, "needs the parameter 'by'"),
    ({"by": "top"}, "cannot be ordered by itself"),
    ({"by": "nowhere"}, "column 'nowhere', which the table does not have"),
    ({"by": "flag"}, "type bool"),
    ({"by": "price", "order": "desc"}, "Parameter 'order' is not supported"),
    ({"by": ""}, "must name a column"),
])
def test_bad_definitions_are_refused_naming_the_column(params, match):
    builder = (Schema.builder().column("k", pa.int64()).column("price", pa.int64())
               .column("flag", pa.bool_()).agg_column("top", pa.string(), "arg_max", **params)
               .primary_key("k"))
    with pytest.raises(InvalidAggFunctionError, match=match):
        builder.build()


def test_connector_options_name_the_by_column():
    descriptor = TableDescriptor.from_options(
        pa.schema([("k", pa.int64()), ("price", pa.int64()), ("top", pa.string())]), ["k"],
        options={"table.merge-engine": "aggregation", "fields.price.agg": "max",
                 "fields.top.agg": "arg_max", "fields.top.by": "price"})
    top = descriptor.schema.column("top")
    assert (top.agg, top.params) == (F.ARG_MAX, {"by": "price"})
    assert TableDescriptor.from_json(descriptor.to_json()).aggregators()[2].by_type == pa.int64()


def test_ordering_by_a_key_or_a_timestamp(tmp_path):
    schema = (Schema.builder().column("k", pa.string()).column("at", pa.timestamp("us"))
              .agg_column("latest", pa.int64(), "arg_max", by="at")
              .agg_column("by_key", pa.int64(), "arg_min", by="k").primary_key("k").build())
    day = datetime.datetime(2026, 1, 1)
    with KvTablet.open(str(tmp_path), TableDescriptor(schema, properties=AGG)) as t:
        t.put([{"k": "a", "at": day + datetime.timedelta(hours=h), "latest": h, "by_key": h}
               for h in (3, 7, 5)])
        assert t.lookup({"k": "a"})["latest"] == 7
        assert t.lookup({"k": "a"})["by_key"] == 3  # one key: the earliest arrival


@settings(max_examples=examples(30), deadline=None)
@given(batches=st.lists(st.lists(st.tuples(st.integers(1, 2), st.none() | st.integers(0, 4),
                                           st.none() | st.sampled_from("abc")),
                                 min_size=1, max_size=6), min_size=1, max_size=3))
def test_preaggregated_states_equal_the_raw_rows(batches):
    descriptor = spec(by_type=pa.int64()).descriptor()
    with tempfile.TemporaryDirectory() as a, tempfile.TemporaryDirectory() as b, \
            KvTablet.open(a, descriptor) as raw, KvTablet.open(b, descriptor) as folded:
        for batch in batches:
            rows = [{"k": k, "price": p, "top": v, "low": v} for k, p, v in batch]
            raw.put(rows)
            folded.put(preaggregate(rows, descriptor), mode=MergeMode.MERGE_STATE)
        assert raw.to_arrow().equals(folded.to_arrow())


@settings(max_examples=examples(40), deadline=None)
@given(data=st.data())
def test_arg_select_agrees_with_the_model_in_every_mode(data):
    table = data.draw(table_specs(aggregation=True, functions=[F.ARG_MAX, F.ARG_MIN, F.MAX, None],
                                  min_value_columns=2))
    with tempfile.TemporaryDirectory() as d, TabletHarness(table, d) as h:
        h.run(data.draw(write_sequences(table, max_size=8)))

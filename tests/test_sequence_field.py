"""`table.sequence-field`: first/last value ordered by a sequence, through a real KvTablet.

- Model: random writes (every mode, partial writes, deletes, reopens) on sequenced tables
  against the reference model, changelog (`_sequences`) and replay included.
- Order: micro-batches whose sequences are distinct per key give the same rows in any order.
- Undo: undo to a baseline restores the rows and the sequences later writes compare against.
- Pre-aggregation, ties, nulls and option checks by hand.
"""

from __future__ import annotations

import tempfile

import pyarrow as pa
import pytest
from hypothesis import given, settings, strategies as st

from aggfuncs import AggFunction as F
from merge_engine import MergeMode, Schema, TableDescriptor
from merge_engine.kv.tablet import KvTablet
from merge_engine.testing import ReferenceTable
from merge_engine.testing.harness import TabletHarness
from merge_engine.testing.ops import Put
from merge_engine.testing.profiles import examples, load_profile
from merge_engine.testing.strategies import sequenced_table_specs, write_sequences
from merge_engine.write.preaggregate import preaggregate
from recovery import undo_bucket
from tally.errors import InvalidInputError, InvalidOptionError, RetractionError

load_profile()

AGG = {"table.merge-engine": "aggregation", "table.sequence-field": "ts"}
SELECTION = ("lv", "lvn", "fv", "fvn")


def descriptor(properties=None) -> TableDescriptor:
    schema = (Schema.builder().column("k", pa.int64()).column("ts", pa.int64())
              .agg_column("lv", pa.string(), F.LAST_VALUE)
              .agg_column("lvn", pa.string(), F.LAST_VALUE_IGNORE_NULLS)
              .agg_column("fv", pa.string(), F.FIRST_VALUE)
              .agg_column("fvn", pa.string(), F.FIRST_VALUE_IGNORE_NULLS)
              .primary_key("k").build())
    return TableDescriptor(schema, properties={**AGG, **(properties or {})})


def rows_of(tablet) -> list[dict]:
    return tablet.to_arrow().to_pylist()


@settings(max_examples=examples(80))
@given(data=st.data())
def test_sequenced_tables_equal_the_model(data):
    spec = data.draw(sequenced_table_specs(), label="spec")
    ops = data.draw(write_sequences(spec, max_size=10), label="ops")
    with tempfile.TemporaryDirectory() as d, TabletHarness(spec, d) as h:
        h.run(ops)


@st.composite
def batches_with_distinct_sequences(draw):
    """Micro-batches of full rows whose sequences differ per key (so the order is defined)."""
    n = draw(st.integers(1, 10))
    keys = draw(st.lists(st.integers(0, 2), min_size=n, max_size=n))
    sequences = draw(st.lists(st.integers(0, 50), min_size=n, max_size=n, unique=True))
    values = st.one_of(st.none(), st.sampled_from(["a", "b", "c", ""]))
    rows = [{"k": k, "ts": s, **{c: draw(values) for c in SELECTION}}
            for k, s in zip(keys, sequences)]
    cuts = sorted(draw(st.sets(st.integers(1, max(n - 1, 1)), max_size=3)))
    bounds = [0, *cuts, n]
    return [rows[a:b] for a, b in zip(bounds, bounds[1:]) if rows[a:b]]


@settings(max_examples=examples(60))
@given(batches=batches_with_distinct_sequences(), data=st.data())
def test_any_order_of_micro_batches_gives_the_same_rows(batches, data):
    order = data.draw(st.permutations(range(len(batches))), label="order")
    mode = data.draw(st.sampled_from([MergeMode.AGGREGATE, MergeMode.MERGE_STATE]), label="mode")
    model = ReferenceTable(descriptor())
    for batch in batches:
        model.put(batch, mode.name)
    results = []
    for sequence in (range(len(batches)), order):
        with tempfile.TemporaryDirectory() as d, KvTablet.open(d, descriptor()) as t:
            for i in sequence:
                t.put(batches[i], mode)
            results.append(rows_of(t))
    assert results[0] == results[1] == model.rows()


@settings(max_examples=examples(40))
@given(before=batches_with_distinct_sequences(), after=batches_with_distinct_sequences())
def test_undo_restores_rows_and_the_sequences_later_writes_meet(before, after):
    with tempfile.TemporaryDirectory() as d, KvTablet.open(d, descriptor()) as t:
        for batch in before:
            t.put(batch)
        baseline, expected = t.log_end_offset, rows_of(t)
        for batch in after:
            t.put(batch)
        undo_bucket(t, baseline)
        assert rows_of(t) == expected
        # Replaying the later writes after undo ends where they ended the first time: the
        # restored cells kept their sequences.
        model = ReferenceTable(descriptor())
        for batch in before + after + after:
            model.put(batch)
        for batch in after:
            t.put(batch)
        assert rows_of(t) == model.rows()


def test_ties_nulls_and_older_writes(tmp_path):
    with KvTablet.open(str(tmp_path), descriptor()) as t:
        t.put([{"k": 1, "ts": 5, "lv": "a", "lvn": "a", "fv": "a", "fvn": None}])
        t.put([{"k": 1, "ts": 3, "lv": "old", "lvn": "old", "fv": "older", "fvn": "x"}])
        assert rows_of(t) == [{"k": 1, "ts": 5, "lv": "a", "lvn": "a", "fv": "older", "fvn": "x"}]
        # A tie: the later write wins for last_value, the earlier stays for first_value.
        t.put([{"k": 1, "ts": 5, "lv": "tie", "lvn": "tie", "fv": "tie", "fvn": "tie"}])
        t.put([{"k": 1, "ts": 3, "lv": None, "lvn": None, "fv": "tie3", "fvn": "tie3"}])
        assert rows_of(t) == [{"k": 1, "ts": 5, "lv": "tie", "lvn": "tie", "fv": "older",
                               "fvn": "x"}]
        # A newer null: last_value takes it, last_value_ignore_nulls keeps its value, whose
        # own sequence (5) a write at 6 still beats.
        t.put([{"k": 1, "ts": 9, "lv": None, "lvn": None}], target_columns=["k", "ts", "lv", "lvn"])
        t.put([{"k": 1, "ts": 6, "lv": "six", "lvn": "six"}], target_columns=["k", "ts", "lv", "lvn"])
        assert rows_of(t)[0] | {"fv": None, "fvn": None} == {
            "k": 1, "ts": 9, "lv": None, "lvn": "six", "fv": None, "fvn": None}
        images = t.changelog().to_pylist()[-1]["_sequences"]
        assert images["lvn"] == {"value": "six", "sequence": {"ts": 6}}
        assert images["lv"] == {"value": None, "sequence": {"ts": 9}}
        end = t.log_end_offset
        for bad, targets in (([{"k": 1, "ts": None, "lv": "x"}], ["k", "ts", "lv"]),
                             ([{"k": 1, "lv": "x"}], ["k", "lv"])):
            with pytest.raises(InvalidInputError, match="ts"):
                t.put(bad, target_columns=targets)
        assert t.log_end_offset == end


def test_columns_the_sequence_does_not_order_need_no_sequence(tmp_path):
    schema = (Schema.builder().column("k", pa.int64()).column("ts", pa.int64())
              .agg_column("n", pa.int64(), F.SUM).agg_column("lv", pa.string(), F.LAST_VALUE)
              .primary_key("k").build())
    d = TableDescriptor(schema, properties=AGG)
    with KvTablet.open(str(tmp_path), d) as t:
        t.put([{"k": 1, "n": 2}, {"k": 1, "n": 3}], target_columns=["k", "n"])
        t.put([{"k": 1, "ts": 2, "lv": "b"}, {"k": 1, "ts": 1, "lv": "a"}],
              target_columns=["k", "ts", "lv"])
        assert rows_of(t) == [{"k": 1, "ts": 2, "n": 5, "lv": "b"}]
        with pytest.raises(RetractionError, match="cannot take back"):
            t.put([{"k": 1, "ts": 3, "lv": "b", "_change_type": "-U"}],
                  target_columns=["k", "ts", "lv"])


def test_preaggregated_writes_equal_the_rows(tmp_path):
    rows = [{"k": k, "ts": s, "lv": v, "lvn": v, "fv": v, "fvn": v}
            for k, s, v in [(1, 4, "a"), (1, 2, "b"), (2, 1, None), (1, 9, None), (2, 0, "c")]]
    with KvTablet.open(str(tmp_path / "a"), descriptor()) as raw, \
            KvTablet.open(str(tmp_path / "b"), descriptor()) as folded:
        raw.put(rows)
        folded.put(preaggregate(rows, descriptor()), MergeMode.MERGE_STATE)
        assert rows_of(raw) == rows_of(folded)


def test_sequence_field_from_connector_options():
    arrow = pa.schema([("k", pa.int64()), ("ts", pa.timestamp("us")), ("v", pa.string())])
    d = TableDescriptor.from_options(arrow, ["k"], options={
        "table.merge-engine": "aggregation", "table.sequence-field": "ts",
        "fields.v.agg": "last_value"})
    assert d.sequence_fields == ("ts",)
    assert TableDescriptor.from_json(d.to_json()).sequence_fields == ("ts",)


@pytest.mark.parametrize("value, properties, message", [
    ("nope", {}, "'nope' is not a column"),
    ("k", {}, "primary key"),
    ("f", {}, "double"),
    ("ts,ts", {}, "distinct"),
    ("n", {}, "takes no function"),
])
def test_bad_sequence_fields_are_refused(value, properties, message):
    schema = (Schema.builder().column("k", pa.int64()).column("ts", pa.int64())
              .column("f", pa.float64()).agg_column("n", pa.int64(), F.SUM)
              .primary_key("k").build())
    props = {**AGG, "table.sequence-field": value, **properties}
    props = {key: v for key, v in props.items() if v is not None}
    with pytest.raises(InvalidOptionError, match=message):
        TableDescriptor(schema, properties=props)


def test_a_sequence_field_needs_the_aggregation_engine():
    schema = Schema.builder().column("k", pa.int64()).column("ts", pa.int64()).primary_key("k").build()
    with pytest.raises(InvalidOptionError, match="aggregation tables"):
        TableDescriptor(schema, properties={"table.sequence-field": "ts"})

"""nested_update: list<struct> columns through a real KvTablet, checked against the model.

- The rules by hand: replace in place, append new keys, null elements and empty arrays bring
  nothing, composite keys, OVERWRITE as given.
- Any grouping: one put each, one put, and pre-aggregated partial states agree (count-limit
  included, which a partial state must not apply).
- Retraction, cell bounds, undo, parameters, options and schema JSON, bad input.
"""

from __future__ import annotations

import tempfile

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from aggfuncs import AggFunction as F
from merge_engine import MergeMode, Schema, TableDescriptor
from merge_engine.kv.tablet import KvTablet
from merge_engine.testing import ColumnSpec, ReferenceTable, TableSpec
from merge_engine.testing.harness import TabletHarness
from merge_engine.testing.ops import Put
from merge_engine.testing.profiles import examples, load_profile
from merge_engine.testing.strategies import (NESTED_TYPES, nested_arrays, single_column_specs,
                                             table_specs, write_sequences)
from merge_engine.write.preaggregate import preaggregate
from recovery import undo_bucket
from sink.types import widens
from tally.errors import InvalidAggFunctionError, InvalidInputError

load_profile()

ITEM = pa.struct([("id", pa.int64()), ("sub", pa.string()), ("v", pa.int64())])
NESTED = pa.list_(ITEM)
AGG = {"table.merge-engine": "aggregation", "table.delete.behavior": "allow"}


def spec(**params) -> TableSpec:
    return TableSpec((ColumnSpec("k", pa.int64(), nullable=False),
                      ColumnSpec("n", NESTED, F.NESTED_UPDATE, {"nested-key": "id", **params})),
                     ("k",), AGG)


def e(id, v, sub="s"):
    return {"id": id, "sub": sub, "v": v}


def put(h: TabletHarness, mode: str, *arrays, key: int = 1) -> bool:
    return h.apply(Put(tuple({"k": key, "n": a} for a in arrays), mode))


def value(h: TabletHarness, key: int = 1):
    row = h.tablet.lookup({"k": key})
    return None if row is None else row["n"]


def test_an_element_replaces_its_key_in_place_and_new_keys_append(tmp_path):
    with TabletHarness(spec(), str(tmp_path)) as h:
        put(h, "AGGREGATE", [e(2, 20), None, e(1, 10)])
        assert value(h) == [e(2, 20), e(1, 10)]
        # In one put: 1 replaced where it stands, 3 appended, then 3 replaced again.
        put(h, "AGGREGATE", [e(1, 11), e(3, 30)], None, [], [None], [e(3, 31)])
        assert value(h) == [e(2, 20), e(1, 11), e(3, 31)]
        end = h.tablet.log_end_offset
        put(h, "AGGREGATE", None, [], [None])  # nothing to upsert: no changelog entry
        assert h.tablet.log_end_offset == end
        put(h, "MERGE_STATE", [e(2, None, "t")])  # a null field is a value like any other
        assert value(h) == [e(2, None, "t"), e(1, 11), e(3, 31)]
        put(h, "OVERWRITE", [e(5, 1), e(5, 2), None], key=2)  # replaces the cell as given
        assert value(h, 2) == [e(5, 1), e(5, 2), None]
        put(h, "AGGREGATE", [e(6, 1)], key=2)
        assert value(h, 2) == [e(5, 2), e(6, 1)]


def test_a_composite_nested_key(tmp_path):
    with TabletHarness(spec(**{"nested-key": "id, sub"}), str(tmp_path)) as h:
        put(h, "AGGREGATE", [e(1, 1, "a"), e(1, 2, "b")], [e(1, 3, "a"), e(None, 4, None)])
        put(h, "AGGREGATE", [e(None, 5, None)])
        assert value(h) == [e(1, 3, "a"), e(1, 2, "b"), e(None, 5, None)]


@st.composite
def key_arrays(draw, nested_type=NESTED):
    arrays = nested_arrays(nested_type)
    return draw(st.lists(arrays, min_size=1, max_size=8)), draw(arrays)


@settings(max_examples=examples(100), deadline=None)
@given(case=key_arrays(), key=st.sampled_from(["id", "id,sub"]), limit=st.sampled_from([0, 1, 2, 3]))
def test_one_put_each_one_put_and_partial_states_agree(case, key, limit):
    """The order of first arrival, the last value per key and count-limit do not depend on
    how the writes are grouped: a partial state keeps every key, so merging it onto a stored
    cell updates each kept key as the writes one by one would."""
    arrays, stored = case
    table = spec(**{"nested-key": key, "count-limit": limit})
    rows = [{"k": 1, "n": a} for a in arrays]
    model = ReferenceTable(table)
    model.put([{"k": 1, "n": stored}])
    model.put(rows)
    expected = model.lookup({"k": 1})["n"]
    with tempfile.TemporaryDirectory() as d, TabletHarness(table, d) as h:
        for k in (1, 2, 3, 4):
            put(h, "AGGREGATE", stored, key=k)
        for a in arrays:
            put(h, "AGGREGATE", a, key=1)
        put(h, "AGGREGATE", *arrays, key=2)
        partial = preaggregate([{**r, "k": 3} for r in rows], table.descriptor())
        h.tablet.put(partial, MergeMode.MERGE_STATE)
        for a in arrays:  # each a partial state of its own
            h.tablet.put(preaggregate([{"k": 4, "n": a}], table.descriptor()), MergeMode.MERGE_STATE)
        assert value(h, 1) == value(h, 2) == value(h, 3) == value(h, 4) == expected


def test_count_limit_keeps_the_first_keys_and_their_updates(tmp_path):
    with TabletHarness(spec(**{"count-limit": "2"}), str(tmp_path)) as h:
        put(h, "AGGREGATE", [e(1, 1)])
        put(h, "AGGREGATE", [e(2, 2), e(3, 3), e(1, 10)])
        assert value(h) == [e(1, 10), e(2, 2)]
        put(h, "AGGREGATE", [e(3, 30)], [e(2, 20)])  # 3 stays out, 2 is updated
        assert value(h) == [e(1, 10), e(2, 20)]
    # A partial state of the rows past the limit still carries the update of a kept key.
    partial = preaggregate([{"k": 1, "n": [e(2, 2), e(3, 3), e(1, 10)]}], spec(**{"count-limit": 2}).descriptor())
    assert partial.column("n").to_pylist() == [[e(2, 2), e(3, 3), e(1, 10)]]


def test_retraction_removes_elements_that_still_hold_their_value(tmp_path):
    with KvTablet.open(str(tmp_path), spec().descriptor()) as t:
        t.put([{"k": 1, "n": [e(1, 1), e(2, 2), e(3, 3)]}])
        t.put([{"k": 1, "n": [e(2, 20)]}])
        # 1: still equal, removed; 2: replaced since, stays; 9: not held, nothing (no error).
        t.put([{"k": 1, "n": [e(1, 1), e(2, 2), e(9, 9), None], "_change_type": "-U"}])
        assert t.lookup({"k": 1})["n"] == [e(2, 20), e(3, 3)]
        # Retraction and contribution in one write apply in order: 1 comes back at the end.
        t.put([{"k": 1, "n": [e(2, 20)], "_change_type": "-U"}, {"k": 1, "n": [e(1, 1), e(3, 3)]}])
        assert t.lookup({"k": 1})["n"] == [e(3, 3), e(1, 1)]
        t.put([{"k": 1, "n": [e(3, 3), e(1, 1)], "_change_type": "-D"}])
        assert t.lookup({"k": 1})["n"] is None  # no element left: the empty state


def test_retraction_through_partial_states(tmp_path):
    rows = [{"k": 1, "n": [e(1, 1)]}, {"k": 1, "n": [e(1, 1)], "_change_type": "-U"},
            {"k": 1, "n": [e(2, 2)]}]
    with KvTablet.open(str(tmp_path), spec().descriptor()) as t:
        t.put([{"k": 1, "n": [e(0, 0)]}])
        t.put(preaggregate(rows, spec().descriptor()), MergeMode.MERGE_STATE)
        assert t.lookup({"k": 1})["n"] == [e(0, 0), e(2, 2)]


def test_cell_bounds(tmp_path):
    with KvTablet.open(str(tmp_path), spec(**{"max-elements": 2}).descriptor()) as t:
        t.put([{"k": 1, "n": [e(1, 1), e(2, 2)]}])
        end = t.log_end_offset
        with pytest.raises(InvalidInputError, match="'n'.*max-elements"):
            t.put([{"k": 2, "n": [e(1, 1)]}, {"k": 1, "n": [e(3, 3)]}])
        assert t.log_end_offset == end and t.lookup({"k": 2}) is None
        t.put([{"k": 1, "n": [e(2, 5)]}])  # an update adds no element
        assert t.lookup({"k": 1})["n"] == [e(1, 1), e(2, 5)]


def test_undo_restores_the_arrays(tmp_path):
    with KvTablet.open(str(tmp_path), spec().descriptor()) as t:
        t.put([{"k": 1, "n": [e(1, 1)]}, {"k": 2, "n": [e(9, 9), e(8, 8)]}])
        baseline, before = t.log_end_offset, t.to_arrow().to_pylist()
        t.put([{"k": 1, "n": [e(1, 2), e(3, 3)]}, {"k": 3, "n": [e(0, 0)]}])
        t.put([{"k": 2, "n": [e(8, 8)], "_change_type": "-U"}])
        undo_bucket(t, baseline)
        assert t.to_arrow().to_pylist() == before


def test_bad_input_is_refused_naming_the_column_and_nothing_is_applied(tmp_path):
    with KvTablet.open(str(tmp_path), spec().descriptor()) as t:
        t.put([{"k": 1, "n": [e(1, 1)]}])
        end, before = t.log_end_offset, t.to_arrow()
        with pytest.raises(InvalidInputError, match="'n'"):
            t.put([{"k": 2, "n": [e(2, 2)]}, {"k": 1, "n": "not an array"}])
        with pytest.raises(InvalidInputError, match="'n'"):
            t.put([{"k": 2, "n": [e(2, 2)]}, {"k": 1, "n": [{"id": "x", "sub": "s", "v": 1}]}])
        with pytest.raises(InvalidInputError, match="'n'"):
            t.put(pa.table({"k": [1], "n": pa.array([[1, 2]], pa.list_(pa.int64()))}))
        assert t.log_end_offset == end and t.to_arrow().equals(before)


@pytest.mark.parametrize("arrow_type, params, message", [
    (NESTED, {}, r"nested_update column 'n' needs the parameter 'nested-key'"),
    (NESTED, {"nested_key": "id,zz"}, r"names 'zz', which is not a field of"),
    (NESTED, {"nested_key": "id,,sub"}, r"'nested-key' must name distinct struct fields"),
    (NESTED, {"nested_key": "id,id"}, r"'nested-key' must name distinct struct fields"),
    (pa.list_(pa.struct([("x", pa.float64())])), {"nested_key": "x"},
     r"Nested key field 'x' of column 'n' has type double"),
    (NESTED, {"nested_key": "id", "count_limit": -1}, r"'count-limit' must be a non-negative"),
    (pa.list_(pa.int64()), {"nested_key": "id"}, r"nested_update column 'n' must be one of"),
    (ITEM, {"nested_key": "id"}, r"nested_update column 'n' must be one of"),
])
def test_bad_parameters_and_types_are_refused_by_name(arrow_type, params, message):
    with pytest.raises(InvalidAggFunctionError, match=message):
        Schema.builder().column("k", pa.int64()).agg_column("n", arrow_type, "nested_update",
                                                            **params).primary_key("k").build()


def test_options_and_schema_json():
    arrow = pa.schema([("k", pa.int64()), ("n", pa.large_list(ITEM))])
    d = TableDescriptor.from_options(arrow, ["k"], options={
        "table.merge-engine": "aggregation", "fields.n.agg": "nested_update",
        "fields.n.nested_update.nested-key": " sub ,id", "fields.n.nested_update.count-limit": "5"})
    assert d.schema.column("n").params == {"nested-key": "sub,id", "count-limit": 5}
    assert TableDescriptor.from_json(d.to_json()) == d
    # A Spark array<struct> with the same fields feeds the column (narrower fields widen).
    spark_like = pa.list_(pa.struct([("id", pa.int32()), ("sub", pa.string()), ("v", pa.int16())]))
    assert widens(spark_like, NESTED)
    assert not widens(pa.list_(pa.struct([("v", pa.int64()), ("id", pa.int64())])), NESTED)


@settings(max_examples=examples(60), deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(data=st.data())
def test_every_mode_against_the_reference_model(tmp_path_factory, data):
    spec_ = data.draw(table_specs(aggregation=True, functions=(F.NESTED_UPDATE, F.NESTED_UPDATE,
                                                               F.ARRAY_AGG), max_value_columns=3))
    with TabletHarness(spec_, tmp_path_factory.mktemp("nested")) as h:
        for op in data.draw(write_sequences(spec_)):
            h.apply(op)


@settings(max_examples=examples(30), deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(data=st.data())
def test_one_column_sequences_against_the_reference_model(tmp_path_factory, data):
    spec_ = data.draw(single_column_specs(F.NESTED_UPDATE, data.draw(st.sampled_from(NESTED_TYPES))))
    with TabletHarness(spec_, tmp_path_factory.mktemp("one")) as h:
        for op in data.draw(write_sequences(spec_)):
            h.apply(op)

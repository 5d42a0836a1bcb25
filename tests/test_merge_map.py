"""merge_map: map columns through a real KvTablet, checked against the reference model.

- The rules by hand: last value per map key, a null value deletes, keys sorted, no entries left
  is null, duplicate keys in one map, OVERWRITE.
- Associativity: folding a key's maps one put each, all in one put, and pre-aggregated into
  partial states (deletions kept as tombstones) then merged all give the model's map.
- Retraction, cell bounds, undo, options and schema JSON.
"""

from __future__ import annotations

import tempfile

import pyarrow as pa
import pytest
from hypothesis import given, settings, strategies as st

from aggfuncs import AggFunction as F
from merge_engine import MergeMode, Schema, TableDescriptor
from merge_engine.kv.tablet import KvTablet
from merge_engine.testing import ColumnSpec, ReferenceTable, TableSpec
from merge_engine.testing.harness import TabletHarness
from merge_engine.testing.ops import Put
from merge_engine.testing.profiles import examples, load_profile
from merge_engine.testing.strategies import values_of
from merge_engine.write.preaggregate import preaggregate
from recovery import undo_bucket
from tally.errors import InvalidAggFunctionError, InvalidInputError

load_profile()

MAP = pa.map_(pa.string(), pa.int64())
AGG = {"table.merge-engine": "aggregation", "table.delete.behavior": "allow"}


def spec(**params) -> TableSpec:
    return TableSpec((ColumnSpec("k", pa.int64(), nullable=False),
                      ColumnSpec("m", MAP, F.MERGE_MAP, params)), ("k",), AGG)


def descriptor(**params) -> TableDescriptor:
    return spec(**params).descriptor()


def put(h: TabletHarness, mode: str, *maps, key: int = 1) -> bool:
    return h.apply(Put(tuple({"k": key, "m": m} for m in maps), mode))


def value(h: TabletHarness, key: int = 1):
    row = h.tablet.lookup({"k": key})
    return None if row is None else row["m"]


def test_last_value_per_key_null_deletes_keys_sorted(tmp_path):
    with TabletHarness(spec(), str(tmp_path)) as h:
        put(h, "AGGREGATE", [("b", 2), ("a", 1)])
        assert value(h) == [("a", 1), ("b", 2)]
        # In one put: a deleted, c added, b overwritten by the later map.
        put(h, "AGGREGATE", [("a", None), ("c", 3)], [("b", 5), ("b", 6)])
        assert value(h) == [("b", 6), ("c", 3)]
        end = h.tablet.log_end_offset
        put(h, "AGGREGATE", None, [])  # null and empty maps bring nothing: no changelog entry
        assert h.tablet.log_end_offset == end
        put(h, "MERGE_STATE", [("b", None), ("c", None), ("zz", None)])
        assert value(h) is None  # no entries left: the empty state
        put(h, "OVERWRITE", [("y", 1), ("x", None), ("y", 2)], key=2)
        assert value(h, 2) == [("y", 2)]


@st.composite
def key_maps(draw):
    maps = st.one_of(st.none(), values_of(MAP, nulls=False))
    return draw(st.lists(maps, min_size=1, max_size=6)), draw(values_of(MAP, nulls=False))


@settings(max_examples=examples(100))
@given(case=key_maps())
def test_one_put_each_one_put_and_partial_states_agree(case):
    maps, stored = case
    rows = [{"k": 1, "m": m} for m in maps]
    model = ReferenceTable(spec())
    model.put([{"k": 1, "m": stored}])
    model.put(rows)
    expected = model.lookup({"k": 1})["m"]
    with tempfile.TemporaryDirectory() as d, TabletHarness(spec(), d) as h:
        for key in (1, 2, 3):
            put(h, "AGGREGATE", stored, key=key)
        for m in maps:
            put(h, "AGGREGATE", m, key=1)
        put(h, "AGGREGATE", *maps, key=2)
        # (b⊕c)⊕... as partial states: tombstones must reach the stored map.
        partial = preaggregate([{**r, "k": 3} for r in rows], descriptor())
        h.tablet.put(partial, MergeMode.MERGE_STATE)
        assert value(h, 1) == value(h, 2) == value(h, 3) == expected


def test_a_partial_state_keeps_its_deletions():
    partial = preaggregate([{"k": 1, "m": [("a", 1)]}, {"k": 1, "m": [("a", None), ("b", 2)]}],
                           descriptor())
    assert partial.column("m").to_pylist() == [[("a", None), ("b", 2)]]


def test_retraction_takes_back_entries_that_still_hold_their_value(tmp_path):
    with KvTablet.open(str(tmp_path), descriptor()) as t:
        t.put([{"k": 1, "m": [("a", 1), ("b", 2), ("c", 3)]}])
        t.put([{"k": 1, "m": [("b", 20)]}])
        # a: still 1, taken back; b: overwritten since, stays; c -> null: a deletion, nothing.
        t.put([{"k": 1, "m": [("a", 1), ("b", 2), ("c", None)], "_change_type": "-U"}])
        assert t.lookup({"k": 1})["m"] == [("b", 20), ("c", 3)]
        t.put([{"k": 1, "m": [("b", 20), ("c", 3)], "_change_type": "-D"}])
        assert t.lookup({"k": 1})["m"] is None


def test_cell_bounds(tmp_path):
    with KvTablet.open(str(tmp_path), descriptor(**{"max-elements": 2})) as t:
        t.put([{"k": 1, "m": [("a", 1), ("b", 2)]}])
        end = t.log_end_offset
        with pytest.raises(InvalidInputError, match="'m'.*max-elements"):
            t.put([{"k": 1, "m": [("c", 3)]}])
        assert t.log_end_offset == end
        t.put([{"k": 1, "m": [("a", None), ("c", 3)]}])  # a deletion makes room
        assert t.lookup({"k": 1})["m"] == [("b", 2), ("c", 3)]


def test_undo_restores_maps(tmp_path):
    with KvTablet.open(str(tmp_path), descriptor()) as t:
        t.put([{"k": 1, "m": [("a", 1)]}, {"k": 2, "m": [("x", 9)]}])
        baseline, before = t.log_end_offset, t.to_arrow().to_pylist()
        t.put([{"k": 1, "m": [("a", None), ("b", 2)]}, {"k": 3, "m": [("z", 0)]}])
        t.put([{"k": 2, "m": [("x", None)]}])
        undo_bucket(t, baseline)
        assert t.to_arrow().to_pylist() == before


def test_options_schema_json_and_type_checks():
    arrow = pa.schema([("k", pa.int64()), ("m", pa.map_(pa.int32(), pa.list_(pa.string())))])
    d = TableDescriptor.from_options(arrow, ["k"], options={
        "table.merge-engine": "aggregation", "fields.m.agg": "merge_map",
        "fields.m.max-cell-bytes": "1kb"})
    assert TableDescriptor.from_json(d.to_json()) == d
    assert d.schema.column("m").agg is F.MERGE_MAP
    with pytest.raises(InvalidAggFunctionError, match="'m'"):
        Schema.builder().column("k", pa.int64()).agg_column(
            "m", pa.map_(pa.float64(), pa.int64()), "merge_map").primary_key("k").build()
    with pytest.raises(InvalidAggFunctionError, match="'m'"):
        Schema.builder().column("k", pa.int64()).agg_column(
            "m", pa.list_(pa.int64()), "merge_map").primary_key("k").build()


def test_the_command_line_names_map_types():
    from tally.cli.column_types import parse_type
    from tally.errors import InvalidOptionError

    assert parse_type(str(MAP)) == MAP  # what `tally describe` prints creates it again
    assert parse_type("map<string, bigint>") == MAP
    assert parse_type("MAP<int, list<item: string>>") == pa.map_(pa.int32(), pa.list_(pa.string()))
    with pytest.raises(InvalidOptionError, match="map<K, V>"):
        parse_type("map<string>")

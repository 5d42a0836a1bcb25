"""Columns added to a live table (Schema.with_column, add_column's engine side) against the
reference model.

The model's statement: a table that gained columns is the table created with them whose earlier
writes targeted only the columns it had then (the added columns of existing rows are empty, null
and unwritten). Random writes before and after the addition, crashes (RocksDB keeps its commits,
the row buffer is lost) and reopens run on a real KvTablet and on a ReferenceTable of the final
schema; rows, lookups and the whole changelog (records written before the addition read with the
new columns) must agree, and an undo across the addition restores the rows of its baseline.
"""

from __future__ import annotations

import copy

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from merge_engine import Schema, TableDescriptor
from merge_engine.kv.tablet import KvTablet
from merge_engine.testing.model import ReferenceTable
from merge_engine.testing.records import diff_records, records_from_arrow
from recovery.bucket_undo import undo_bucket
from tally.errors import InvalidAggFunctionError, SchemaError, StorageError
from tests.test_row_ttl import crash

KEYS = range(4)
OLD = (Schema.builder().column("k", pa.int64())
       .agg_column("total", pa.int64(), "sum")
       .agg_column("last", pa.string(), "last_value_ignore_nulls")
       .primary_key("k").build())
NEW = (OLD.with_column("hits", pa.int64(), "sum")
       .with_column("tags", pa.string(), "string_agg", delimiter="::")
       .with_column("top", pa.float64(), "max"))
PROPERTIES = {"table.merge-engine": "aggregation", "table.delete.behavior": "allow",
              "table.kv.buffer-size": "2kb"}  # some writes flush, others stay buffered

old_rows = st.lists(st.fixed_dictionaries({
    "k": st.sampled_from(KEYS), "total": st.integers(-3, 3),
    "last": st.sampled_from(["a", None])}), min_size=1, max_size=3)
new_rows = st.lists(st.fixed_dictionaries({
    "k": st.sampled_from(KEYS), "total": st.integers(-3, 3), "last": st.sampled_from(["b", None]),
    "hits": st.one_of(st.none(), st.integers(0, 3)), "tags": st.sampled_from(["x", "y", None]),
    "top": st.one_of(st.none(), st.floats(-2, 2, allow_nan=False))}), min_size=1, max_size=3)


def phase_ops(rows):
    return st.lists(st.one_of(
        st.tuples(st.just("put"), rows), st.tuples(st.just("put"), rows),
        st.tuples(st.just("delete"), st.lists(st.sampled_from(KEYS), min_size=1, max_size=2)),
        st.tuples(st.just("crash")), st.tuples(st.just("reopen")),
    ), max_size=8)


def check(tablet: KvTablet, model: ReferenceTable) -> None:
    assert tablet.to_arrow().to_pylist() == model.rows()
    for k in KEYS:
        assert tablet.lookup({"k": k}) == model.lookup({"k": k})
    problem = diff_records(model.changelog, records_from_arrow(tablet.changelog(), NEW.names))
    assert problem is None, problem
    replayed = ReferenceTable(NEW, PROPERTIES).replay(tablet.changelog())
    assert replayed.rows() == model.rows()


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(before=phase_ops(old_rows), after=phase_ops(new_rows), undo=st.booleans(),
       baseline_at=st.integers(0, 8))
def test_adding_columns_matches_the_model(tmp_path_factory, before, after, undo, baseline_at):
    path = tmp_path_factory.mktemp("added")
    old, new = (TableDescriptor(s, properties=PROPERTIES) for s in (OLD, NEW))
    model = ReferenceTable(NEW, PROPERTIES)
    tablet = KvTablet.open(path, old)
    baseline = None
    try:
        for phase, (descriptor, ops, targets) in enumerate(
                [(old, before, OLD.names), (new, after, None)]):
            if phase == 1:
                crash(tablet)  # the addition reaches a bucket as a reopen with the new schema
                tablet = KvTablet.open(path, new)
            for i, op in enumerate(ops):
                if phase == 0 and i == baseline_at:
                    baseline = (tablet.log_end_offset, copy.deepcopy(model.rows()))
                if op[0] == "put":
                    tablet.put(op[1], target_columns=targets)
                    model.put(op[1], target_columns=targets)
                elif op[0] == "delete":
                    keys = [{"k": k} for k in op[1]]
                    tablet.delete(keys)
                    model.delete(keys)
                else:
                    crash(tablet) if op[0] == "crash" else tablet.close()
                    tablet = KvTablet.open(path, descriptor)
                if phase == 1:
                    check(tablet, model)
        check(tablet, model)
        if undo:
            offset, rows = baseline or (0, [])
            undo_bucket(tablet, offset)
            assert tablet.to_arrow().to_pylist() == rows
    finally:
        tablet.close()


def test_existing_rows_read_null_and_writes_see_the_new_column(tmp_path):
    with KvTablet.open(tmp_path, TableDescriptor(OLD, properties=PROPERTIES)) as tablet:
        tablet.put([{"k": 1, "total": 2, "last": "a"}])
    with KvTablet.open(tmp_path, TableDescriptor(NEW, properties=PROPERTIES)) as tablet:
        assert tablet.lookup({"k": 1}) == {"k": 1, "total": 2, "last": "a", "hits": None,
                                           "tags": None, "top": None}
        tablet.put([{"k": 1, "total": 1, "last": None, "hits": 4, "tags": "x", "top": 1.5}])
        assert tablet.lookup({"k": 1}) == {"k": 1, "total": 3, "last": "a", "hits": 4,
                                           "tags": "x", "top": 1.5}
        first = tablet.changelog(0, 1).to_pylist()[0]
        assert (first["hits"], sorted(first["_unwritten"])) == (None, ["hits", "tags", "top"])


def test_a_bucket_refuses_a_schema_that_does_not_extend_its_own(tmp_path):
    with KvTablet.open(tmp_path, TableDescriptor(NEW, properties=PROPERTIES)):
        pass
    other = OLD.with_column("tags", pa.string(), "string_agg", delimiter=";")
    for schema in (OLD, other):  # fewer columns; a column the bucket has with another function
        with pytest.raises(StorageError, match="another schema"):
            KvTablet.open(tmp_path, TableDescriptor(schema, properties=PROPERTIES))


@pytest.mark.parametrize("args, error, match", [
    (("total", pa.int64(), "sum"), SchemaError, "defined twice"),
    (("n", pa.string(), "sum"), InvalidAggFunctionError, "sum column 'n'"),
    (("n", "int64", "max"), SchemaError, "needs a pyarrow type"),
    (("n", pa.int64(), "median"), InvalidAggFunctionError, "Unknown aggregation function"),
])
def test_with_column_validates_as_table_creation_does(args, error, match):
    with pytest.raises(error, match=match):
        OLD.with_column(*args)


def test_added_columns_take_the_next_ids_and_parameters_as_creation_does():
    schema = OLD.with_column("tags", pa.string(), "listagg", delimiter=";", distinct="true")
    assert [c.id for c in schema.columns] == [0, 1, 2, 3]
    built = (Schema.builder().column("k", pa.int64()).agg_column("total", pa.int64(), "sum")
             .agg_column("last", pa.string(), "last_value_ignore_nulls")
             .agg_column("tags", pa.string(), "listagg", delimiter=";", distinct="true")
             .primary_key("k").build())
    assert schema == built
    assert schema.column("tags").nullable

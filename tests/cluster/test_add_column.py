"""add_column on a live cluster: existing rows read null, writers and readers that refresh see
the column, bad columns are refused as at table creation, a lock over whole rows refuses it."""

from __future__ import annotations

import pyarrow as pa
import pytest

from merge_engine import Schema, TableDescriptor
from tally.errors import ColumnLockConflict, InvalidAggFunctionError, SchemaError

_names = iter(range(10**6))


def make_table(conn):
    name = f"default.addcol{next(_names)}"
    schema = (Schema.builder().column("k", pa.int64()).agg_column("a", pa.int64(), "sum")
              .agg_column("b", pa.int64(), "max").primary_key("k").build())
    conn.admin.create_table(name, TableDescriptor(schema, bucket_count=2, properties={
        "table.merge-engine": "aggregation"}))
    return conn.table(name)


def write(table, rows, **kwargs):
    with table.upsert_writer(**kwargs) as writer:
        writer.upsert(rows)


def test_a_column_added_to_a_live_table(conn):
    table = make_table(conn)
    write(table, [{"k": k, "a": 1, "b": k} for k in range(4)])
    reader = table.changelog_reader()
    assert reader.poll().num_rows == 4
    column_id = conn.admin.add_column(table.name, "tags", pa.string(), agg="string_agg",
                                      delimiter=";")
    assert column_id == 3
    table = conn.table(table.name)
    assert table.to_arrow().to_pylist() == [{"k": k, "a": 1, "b": k, "tags": None}
                                            for k in range(4)]
    write(table, [{"k": 1, "a": 1, "b": 0, "tags": "x"}, {"k": 9, "a": 1, "b": 0, "tags": "y"}])
    write(table, [{"k": 1, "a": 1, "b": 0, "tags": "z"}])
    assert table.lookup({"k": 1}) == {"k": 1, "a": 3, "b": 1, "tags": "x;z"}
    assert table.lookup({"k": 2}) == {"k": 2, "a": 1, "b": 2, "tags": None}
    records = table.changelog_reader().poll().to_pylist()   # old records, new columns
    assert [r["tags"] for r in records if r["k"] == 0] == [None]
    # A reader keeps the columns it started with; one resumed from its positions has the new one.
    resumed = table.changelog_reader(start=reader.positions())
    assert {r["tags"] for r in resumed.poll().to_pylist()} == {None, "x", "x;z", "y"}
    described = conn.admin.describe_table(table.name).descriptor.schema
    assert [(c.id, c.name) for c in described.columns] == [(0, "k"), (1, "a"), (2, "b"),
                                                           (3, "tags")]


def test_a_handle_from_before_a_column_was_added_looks_up_the_new_columns(conn, cluster):
    """A lookup answer's row carries the fingerprint of its columns: a handle whose metadata
    predates the column (its connection never heard of it) reads it after a refresh, never as
    a row of the old layout. Rows stored before (an older row layout) and written after both
    answer right."""
    from tally import client

    table = make_table(conn)
    write(table, [{"k": k, "a": k, "b": -k} for k in range(3)])
    assert table.lookup({"k": 1}) == {"k": 1, "a": 1, "b": -1}  # metadata cached
    with client.connect(cluster.url, retry_timeout=60) as other:
        other.admin.add_column(table.name, "d", pa.float64(), agg="max")
        write(other.table(table.name), [{"k": 2, "a": 1, "b": 0, "d": 0.5}])
    assert "d" not in table.meta.routing.arrow_schema.names  # still the old metadata
    assert table.lookup({"k": 1}) == {"k": 1, "a": 1, "b": -1, "d": None}
    assert table.lookup({"k": 2}) == {"k": 2, "a": 3, "b": 0, "d": 0.5}
    assert table.lookup({"k": 7}) is None


@pytest.mark.parametrize("args, kwargs, error", [
    (("a", pa.int64()), {"agg": "sum"}, SchemaError),                # an existing name
    (("s", pa.string()), {"agg": "sum"}, InvalidAggFunctionError),   # a type sum refuses
    (("s", pa.int64()), {"agg": "median"}, InvalidAggFunctionError),
    (("s", pa.string()), {"agg": "string_agg", "delimter": ";"}, InvalidAggFunctionError),
])
def test_a_bad_column_is_refused_and_nothing_changes(conn, args, kwargs, error):
    table = make_table(conn)
    with pytest.raises(error):
        conn.admin.add_column(table.name, *args, **kwargs)
    assert conn.admin.describe_table(table.name).descriptor.schema.names == ["k", "a", "b"]


def test_refused_while_a_lock_covers_whole_rows_not_while_one_covers_some(conn):
    table = make_table(conn)
    some = conn.locks.acquire(table.name, "some", ["k", "a"], ttl=60)
    try:
        conn.admin.add_column(table.name, "c", pa.int64(), agg="sum")
    finally:
        conn.locks.release(some)
    whole = conn.locks.acquire(table.name, "whole", ["k", "a", "b", "c"], ttl=60)
    try:
        with pytest.raises(ColumnLockConflict, match="whole"):
            conn.admin.add_column(table.name, "d", pa.int64(), agg="sum")
    finally:
        conn.locks.release(whole)
    assert conn.admin.describe_table(table.name).descriptor.schema.names == ["k", "a", "b", "c"]

"""A table dropped and re-created under the same name is another table, for writers and readers.

A handle resolves a name to a table id once (`conn.table(name)`), and its writers, reads and
undo go to that table only: the writer's cached metadata may still name the old table, and the
retry that follows a StaleMetadataError re-resolves the name, but it must raise
TableRecreatedError rather than follow the name into the new table. The re-creation runs on
another connection, as it would in another process, so the writer's connection learns of it
only from the tablet server.
"""

from __future__ import annotations

import pyarrow as pa
import pytest

from aggfuncs import AggFunction
from merge_engine import Schema, TableDescriptor
from recovery import undo_remote
from tally import client
from tally.errors import NotFoundError, StaleMetadataError, TableRecreatedError
from tally.wire.bucket_hash import bucket_ids

BUCKETS = 2
SCHEMA = (Schema.builder().column("k", pa.int64())
          .agg_column("total", pa.int64(), AggFunction.SUM).primary_key("k").build())
DESCRIPTOR = TableDescriptor(SCHEMA, bucket_count=BUCKETS,
                             properties={"table.merge-engine": "aggregation"})


def rows(keys, total: int = 1) -> pa.Table:
    return pa.table({"k": pa.array(list(keys), pa.int64()),
                     "total": pa.array([total] * len(keys), pa.int64())})


def rows_of_bucket(bucket: int, total: int = 1) -> pa.Table:
    data = rows(range(40), total)
    return data.filter(pa.array(bucket_ids(data, ["k"], BUCKETS) == bucket))


@pytest.fixture
def other(cluster):
    """A second connection: the one that drops and re-creates tables."""
    with client.connect(cluster.url) as c:
        yield c


def recreate(other, name: str) -> int:
    other.admin.drop_table(name)
    return other.admin.create_table(name, DESCRIPTOR)


def assert_untouched(other, name: str) -> None:
    fresh = other.table(name)
    assert fresh.to_arrow().num_rows == 0
    assert set(fresh.list_offsets().values()) == {0}


def assert_recreated_error(error: TableRecreatedError, name: str, old: int, new: int) -> None:
    assert isinstance(error, StaleMetadataError)
    assert (error.table, error.resolved_id, error.current_id) == (name, old, new)
    assert name in str(error) and str(old) in str(error) and str(new) in str(error)


def test_an_upsert_writer_of_a_recreated_table_is_refused_and_the_new_table_untouched(
        conn, other, table_name):
    old_id = conn.admin.create_table(table_name, DESCRIPTOR)
    table = conn.table(table_name)
    writer = table.upsert_writer()
    writer.upsert(rows(range(10)))
    writer.flush()
    new_id = recreate(other, table_name)

    writer.upsert(rows(range(10), total=5))
    with pytest.raises(TableRecreatedError) as refused:
        writer.flush()
    assert_recreated_error(refused.value, table_name, old_id, new_id)
    assert_untouched(other, table_name)
    # Its next write is refused before it is even queued: the writer's table is gone for good.
    with pytest.raises(TableRecreatedError):
        writer.upsert(rows(range(3)))
    writer.close()

    fresh = conn.table(table_name)
    assert fresh.table_id == new_id
    with fresh.upsert_writer() as new_writer:
        new_writer.upsert(rows(range(4), total=7))
    assert fresh.to_arrow().to_pylist() == [{"k": k, "total": 7} for k in range(4)]


def test_a_bucket_writer_of_a_recreated_table_is_refused_and_the_new_table_untouched(
        conn, other, table_name):
    old_id = conn.admin.create_table(table_name, DESCRIPTOR)
    table = conn.table(table_name)
    writer = table.bucket_writer(1)
    writer.put(rows_of_bucket(1))
    new_id = recreate(other, table_name)

    with pytest.raises(TableRecreatedError) as refused:
        writer.put(rows_of_bucket(1, total=5))
    assert_recreated_error(refused.value, table_name, old_id, new_id)
    assert_untouched(other, table_name)

    fresh = conn.table(table_name).bucket_writer(1)
    ends = fresh.put(rows_of_bucket(1, total=7))
    assert ends == {(None, 1): rows_of_bucket(1).num_rows}
    assert {r["total"] for r in conn.table(table_name).to_arrow().to_pylist()} == {7}


def test_a_writer_of_a_dropped_table_is_refused(conn, other, table_name):
    conn.admin.create_table(table_name, DESCRIPTOR)
    writer = conn.table(table_name).bucket_writer(0)
    other.admin.drop_table(table_name)
    with pytest.raises(NotFoundError):
        writer.put(rows_of_bucket(0))


def test_reads_and_undo_through_a_handle_of_a_recreated_table_are_refused(
        conn, other, table_name):
    """Lookups, scans, changelog ranges, offsets and undo (its reads and its writes) all stay
    with the handle's table: nothing of the new one is read as the old one's, or changed."""
    conn.admin.create_table(table_name, DESCRIPTOR)
    table = conn.table(table_name)
    with table.upsert_writer() as writer:
        writer.upsert(rows(range(10)))
    assert table.lookup({"k": 3}) == {"k": 3, "total": 1}
    recreate(other, table_name)
    with other.table(table_name).upsert_writer() as writer:
        writer.upsert(rows(range(10), total=9))
    new_state = other.table(table_name).to_arrow()
    new_offsets = other.table(table_name).list_offsets()

    for read in (lambda: table.lookup({"k": 3}), table.to_arrow,
                 lambda: table.changelog(0, 0, 1), table.list_offsets,
                 lambda: undo_remote(table, 0, baseline=0)):
        with pytest.raises(TableRecreatedError):
            read()
    assert other.table(table_name).to_arrow() == new_state
    assert other.table(table_name).list_offsets() == new_offsets


def test_the_coordinator_refuses_partitions_and_offsets_for_a_recreated_table_id(
        conn, other, table_name):
    """A writer's first write to a new partition value asks the coordinator to create it, with
    its table id: a re-created table gets no partition from the old table's writer."""
    from tests.cluster import reference_workload

    old_id = conn.admin.create_table(table_name, reference_workload.descriptor(buckets=2))
    other.admin.drop_table(table_name)
    new_id = other.admin.create_table(table_name, reference_workload.descriptor(buckets=2))
    with pytest.raises(TableRecreatedError):
        conn.coordinator_action("create_partition", {
            "name": table_name, "partition": "apac", "dynamic": True, "table_id": old_id})
    with pytest.raises(TableRecreatedError):
        conn.admin.list_offsets(table_name, old_id)
    assert other.admin.list_partitions(table_name) == []
    assert conn.admin.list_offsets(table_name, new_id) == {}

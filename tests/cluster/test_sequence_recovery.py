"""Undo recovery over a cluster for a table with a sequence field and a merge_map column: the
restored rows carry the sequences later writes are compared against, and the restored maps."""

from __future__ import annotations

import pyarrow as pa

from merge_engine import Schema, TableDescriptor
from merge_engine.testing import ReferenceTable
from recovery import recover

COLUMNS = ["k", "ts", "status", "m"]


def test_recover_restores_sequences_and_maps(conn, table_name):
    schema = (Schema.builder().column("k", pa.int64()).column("ts", pa.int64())
              .column("status", pa.string())
              .agg_column("m", pa.map_(pa.string(), pa.int64()), "merge_map")
              .primary_key("k").build())
    properties = {"table.merge-engine": "aggregation", "table.sequence-field": "ts"}
    conn.admin.create_table(table_name, TableDescriptor(schema, bucket_count=2,
                                                        properties=properties))
    table = conn.table(table_name)
    before = [{"k": k, "ts": 10 + k, "status": f"s{k}", "m": {"a": k}} for k in range(6)]
    later = [{"k": k, "ts": 100 + k, "status": None, "m": {"a": None, "b": k}} for k in range(0, 9, 2)]
    lease = conn.locks.acquire(table_name, "job", COLUMNS[1:], ttl=30)
    with table.upsert_writer(lease=lease) as w:
        w.upsert(before)
    assert conn.locks.commit(lease, 0, conn.admin.list_offsets(table_name))
    at_baseline = table.to_arrow().to_pylist()
    with table.upsert_writer(lease=lease) as w:
        w.upsert(later)
    recover(conn, table_name, lease)
    assert table.to_arrow().to_pylist() == at_baseline
    # After undo an older write loses to the restored sequence and a newer one wins.
    replay = [{"k": 1, "ts": 5, "status": "older", "m": None},
              {"k": 2, "ts": 50, "status": "newer", "m": None}]
    conn.locks.release(lease)
    lease = conn.locks.acquire(table_name, "next-job", COLUMNS[1:], ttl=30)
    with table.upsert_writer(lease=lease) as w:
        w.upsert(replay)
    model = ReferenceTable(schema, properties)
    model.put(before)
    model.put(replay)
    assert table.to_arrow().to_pylist() == model.rows()
    conn.locks.release(lease)

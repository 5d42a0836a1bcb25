"""Retraction and bitmaps through the client."""

import pyarrow as pa

from merge_engine import Schema, TableDescriptor
from recovery import recover
from tally import client


def test_writer_retract_takes_back_contributions_and_undo_restores(conn, table_name):
    schema = (Schema.builder().column("product", pa.string()).agg_column("revenue", pa.int64(), "sum")
              .agg_column("orders", pa.int64(), "count").agg_column("ids", pa.list_(pa.int64()), "array_agg")
              .agg_column("buyers", pa.binary(), "rbm32", ignore_retract=True).primary_key("product").build())
    conn.admin.create_table(table_name, TableDescriptor(schema, bucket_count=2, properties={
        "table.merge-engine": "aggregation"}))
    table = conn.table(table_name)
    lease = conn.locks.acquire(table_name, "cdc-job", ["revenue", "orders", "ids", "buyers"], ttl=30)
    with table.upsert_writer(lease=lease) as w:
        w.upsert([{"product": "p", "revenue": 10, "orders": 1, "ids": 1, "buyers": 7},
                  {"product": "p", "revenue": 5, "orders": 1, "ids": 2, "buyers": client.build_bitmap([8])}])
    conn.locks.commit(lease, 0, conn.admin.list_offsets(table_name))
    committed = table.to_arrow()
    with table.upsert_writer(lease=lease) as w:
        w.retract([{"product": "p", "revenue": 10, "orders": 1, "ids": 1, "buyers": 7}])  # a refund
        w.upsert([{"product": "q", "revenue": 3, "orders": 1, "ids": 3, "buyers": 9}])
    row = table.lookup({"product": "p"})
    assert (row["revenue"], row["orders"], row["ids"]) == (5, 1, [2])
    assert client.bitmap_ids(row["buyers"]) == [7, 8]  # bitmaps ignore the retraction
    recover(conn, table_name, lease)
    assert table.to_arrow().equals(committed)
    conn.locks.release(lease)

"""Retraction, bitmaps and sketches through the client."""

import pyarrow as pa
import pytest

from merge_engine import Schema, TableDescriptor
from recovery import recover
from tally import client
from tally.errors import RetractionError


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


def test_sketches_merge_through_the_client_refuse_retraction_and_undo_restores(conn, table_name):
    schema = (Schema.builder().column("page", pa.string())
              .agg_column("visitors", pa.binary(), "hll_sketch")
              .agg_column("buyers", pa.binary(), "theta_sketch")
              .agg_column("latency", pa.binary(), "kll_sketch").primary_key("page").build())
    conn.admin.create_table(table_name, TableDescriptor(schema, bucket_count=2, properties={
        "table.merge-engine": "aggregation"}))
    table = conn.table(table_name)
    lease = conn.locks.acquire(table_name, "sketch-job", ["visitors", "buyers", "latency"], ttl=30)
    with table.upsert_writer(lease=lease) as w:
        w.upsert([{"page": "home", "visitors": u, "buyers": u, "latency": u / 10} for u in range(50)])
        w.upsert([{"page": "home", "visitors": client.build_hll_sketch(range(25, 75)),
                   "buyers": client.build_theta_sketch(range(25, 75)),
                   "latency": client.build_kll_sketch([100.0])}])
    conn.locks.commit(lease, 0, conn.admin.list_offsets(table_name))
    committed = table.to_arrow()
    row = table.lookup({"page": "home"})
    assert client.hll_sketch_estimate(row["visitors"]) == 75
    assert client.theta_sketch_estimate(row["buyers"]) == 75
    assert client.kll_sketch_quantile(row["latency"], 1.0) == 100.0
    assert client.kll_sketch_rank(row["latency"], 4.9) == 50 / 51
    with pytest.raises(RetractionError, match=r"Column 'visitors' \(hll_sketch\) cannot take back"):
        with table.upsert_writer(lease=lease) as w:
            w.retract([{"page": "home", "visitors": 1, "buyers": 1, "latency": 0.1}])
    assert table.to_arrow().equals(committed)  # nothing of the refused write applied
    with table.upsert_writer(lease=lease) as w:  # uncommitted: undone by recovery
        w.upsert([{"page": "home", "visitors": u, "buyers": u, "latency": 1.0} for u in range(75, 90)])
        w.upsert([{"page": "new", "visitors": 1}])
    assert client.hll_sketch_estimate(table.lookup({"page": "home"})["visitors"]) == 90
    recover(conn, table_name, lease)
    assert table.to_arrow().equals(committed)
    conn.locks.release(lease)

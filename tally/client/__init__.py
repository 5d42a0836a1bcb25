"""The Tally client: `client.connect(url, token=None) -> Connection`.

    conn = client.connect(cluster.url)
    conn.admin.create_table("db.t", descriptor)
    with conn.table("db.t").upsert_writer() as writer:
        writer.upsert(rows)
        offsets = writer.flush()
    conn.table("db.t").lookup({"k": 1})

Rows are bucketed here, by the stable bucket function `bucket_ids` / `TableRouting.bucket_of`
(server/bucketing.py documents its exact definition), so the Spark sink can bucket the same way.
"""

from aggfuncs import bitmap_ids, build_bitmap
from client.admin import Admin, TableInfo
from client.connection import Connection, connect
from client.table import Table
from client.writer import UpsertWriter
from server.bucketing import bucket_ids, bucket_of_key, hash_keys
from server.routing import TableRouting, group_rows, partition_names

__all__ = ["bitmap_ids", "build_bitmap", "Admin", "Connection", "Table", "TableInfo", "TableRouting", "UpsertWriter",
           "bucket_ids", "bucket_of_key", "connect", "group_rows", "hash_keys",
           "partition_names"]

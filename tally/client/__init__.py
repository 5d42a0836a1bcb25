"""The Tally client: `tally.connect(url, token=None) -> Connection`.

    conn = tally.connect(cluster.url)
    conn.admin.create_table("db.t", descriptor)
    with conn.table("db.t").upsert_writer() as writer:
        writer.upsert(rows)
        offsets = writer.flush()
    conn.table("db.t").lookup({"k": 1})
    for batch in conn.table("db.t").scan(columns=["k", "v"], filter={"k": [1, 2]}):
        ...
    for batch in conn.table("db.t").changelog_reader(start="earliest"):  # every bucket
        ...

Rows are bucketed here, by the stable bucket function `bucket_ids` / `TableRouting.bucket_of`
(tally.wire.bucket_hash documents its exact definition), so the Spark sink can bucket the same
way.
"""

from aggfuncs import bitmap_ids, build_bitmap
from tally.client.admin import Admin, TableInfo
from tally.client.changelog_reader import ChangelogReader
from tally.client.consumer_position import ConsumerPosition
from tally.client.connection import Connection, connect
from tally.client.table import Table
from tally.client.table_scan import ScanPart, TableScan
from tally.client.writer import UpsertWriter
from tally.wire.bucket_hash import bucket_ids, bucket_of_key, hash_keys
from tally.wire.routing import TableRouting, group_rows, partition_names

__all__ = ["bitmap_ids", "build_bitmap", "Admin", "ChangelogReader", "Connection",
           "ConsumerPosition", "ScanPart", "Table", "TableInfo", "TableRouting", "TableScan",
           "UpsertWriter", "bucket_ids", "bucket_of_key", "connect", "group_rows",
           "hash_keys", "partition_names"]

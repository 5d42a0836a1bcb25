"""The floor of the ingest benchmark: the least any store must do to hold the aggregated table.

All the input at once, grouped by one pyarrow hash group-by (single-threaded, so each key's
rows keep their input order: sum, max, the list of tags joined, the last non-null status), every
result row encoded in the engine's own row format (merge_engine.format.rowcodec, so the bytes stored
are what a bucket stores for the same row), and all of them put in one RocksDB write batch
written with one fsync. No read-modify-write, no changelog, no state between batches: no store
that takes the input a batch at a time and keeps it durable can be faster, so Tally's ingest is
reported as a share of it.
"""

from __future__ import annotations

import collections
import os
import time

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tally.bench.workload import Workload

DELIMITER = ","
ROW = b"k"  # the engine's prefix of row keys: the floor's keys are the engine's keys
COLUMNS = ("id", "qty", "price", "tag", "status")


def _codec():
    from merge_engine.format.rowcodec import RowCodec

    # The table's stored states (tally.bench.workload.table_descriptor): string_agg with a
    # delimiter that does not overlap itself and last non-null store plain values; the sum
    # stores how many contributions it holds.
    schema = pa.schema([("id", pa.int64()), ("qty", pa.int64()), ("price", pa.float64()),
                        ("tag", pa.string()), ("status", pa.string())])
    return RowCodec(schema, counted=[1])


def joined_tags(lists: pa.Array) -> pa.Array:
    """Each group's non-null tags joined with DELIMITER, null for a group with none."""
    flat = lists.flatten()
    parents = pc.list_parent_indices(lists).to_numpy()
    valid = flat.is_valid().to_numpy(zero_copy_only=False)
    counts = np.bincount(parents[valid], minlength=len(lists))
    offsets = pa.array(np.concatenate([[0], np.cumsum(counts)]).astype(np.int32))
    kept = pa.ListArray.from_arrays(offsets, flat.filter(pa.array(valid)),
                                    mask=pa.array(counts == 0))
    return pc.binary_join(kept, DELIMITER)


def aggregate(table: pa.Table):
    """The aggregated rows of `table` as the engine's states (a StateBatch) and their ids."""
    from merge_engine.write.state import StateBatch

    grouped = table.group_by("id", use_threads=False).aggregate(
        [("qty", "sum"), ("qty", "count"), ("price", "max"), ("tag", "list"),
         ("status", "last")])  # hash_last skips nulls: the last non-null status
    n = grouped.num_rows
    ids = grouped.column("id").combine_chunks()
    counts = np.zeros((n, len(COLUMNS)), dtype=np.int64)
    counts[:, 1] = grouped.column("qty_count").to_numpy()
    columns = [ids, grouped.column("qty_sum").combine_chunks(),
               grouped.column("price_max").combine_chunks(),
               joined_tags(grouped.column("tag_list").combine_chunks()),
               grouped.column("status_last").combine_chunks()]
    return StateBatch(columns, np.ones((n, len(COLUMNS)), dtype=bool), counts), ids


def open_db(path: str):
    from rocksdict import Options, Rdict

    options = Options(raw_mode=True)
    options.create_if_missing(True)
    return Rdict(os.path.join(path, "rocksdb"), options)


def ingest(path: str, workload: Workload, progress=None) -> dict:
    """Group, encode and write the whole input; time all of it (data generation excluded)."""
    from rocksdict import WriteBatch, WriteOptions

    from merge_engine.write.keys import key_array

    batches = list(workload.batches())
    codec = _codec()
    db = open_db(path)
    durable = WriteOptions()
    durable.sync = True
    started, cpu_started = time.perf_counter(), time.process_time()
    states, ids = aggregate(pa.Table.from_batches(batches))
    values = codec.encode(states)
    batch = WriteBatch(raw_mode=True)
    collections.deque(map(batch.put, key_array([ids]).to_list(ROW), values), maxlen=0)
    db.write(batch, durable)
    elapsed = time.perf_counter() - started
    cpu = time.process_time() - cpu_started
    db.close()
    if progress:
        progress(workload.rows)
    return {"rows": workload.rows, "seconds": elapsed, "cpu_seconds": cpu}


def read_rows(path: str, ids: list[int]) -> dict[int, dict | None]:
    """The stored rows of `ids`, decoded with the engine's row format, shaped like lookup()."""
    from merge_engine.write.keys import key_array

    codec = _codec()
    db = open_db(path)
    try:
        keys = key_array([pa.array(ids, pa.int64())]).to_list(ROW)
        found = {}
        for key_id, raw in zip(ids, db.get(keys)):
            if raw is None:
                found[key_id] = None
                continue
            state = codec.decode([raw])
            found[key_id] = {name: column[0].as_py() for name, column in
                             zip(COLUMNS, state.columns)}
        return found
    finally:
        db.close()


def count_rows(path: str) -> int:
    db = open_db(path)
    try:
        return sum(1 for _ in db.keys(from_key=ROW))
    finally:
        db.close()

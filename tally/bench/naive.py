"""The baseline: a naive per-row read-modify-write loop on RocksDB (rocksdict), from Python.

What someone would write first without an engine: for each input row, get the key, unpickle the
stored row, merge the four columns in Python, pickle it and put it back. It is written to be
fair, not slow: raw mode (no rocksdict value wrapping), bound methods, one `to_pylist` per
column per batch. Its merge follows the contract's rules for these four functions, so its
results must equal the engine's exactly.
"""

from __future__ import annotations

import pickle
import time

from tally.bench.workload import Workload

DELIMITER = ","


def encode_key(key_id: int) -> bytes:
    return key_id.to_bytes(8, "big", signed=True)


def merge_row(stored: list | None, qty, price, tag, status) -> list:
    """Fold one input row into the stored [qty, price, tag, status] (null with x gives x)."""
    if stored is None:
        return [qty, price, tag, status]
    s_qty, s_price, s_tag, s_status = stored
    if qty is not None:
        s_qty = qty if s_qty is None else s_qty + qty
    if price is not None and (s_price is None or price > s_price):
        s_price = price  # the workload has no NaN or -0.0, so Python's order is the contract's
    if tag is not None:
        s_tag = tag if s_tag is None else s_tag + DELIMITER + tag
    if status is not None:
        s_status = status
    return [s_qty, s_price, s_tag, s_status]


def open_db(path: str):
    from rocksdict import Options, Rdict

    return Rdict(path, options=Options(raw_mode=True))


def ingest(path: str, workload: Workload, progress=None) -> dict:
    """Run the loop over the workload; time only the loop (data generation excluded)."""
    db = open_db(path)
    get, put = db.get, db.put
    loads, dumps = pickle.loads, pickle.dumps
    elapsed = cpu = 0.0
    done = 0
    for batch in workload.batches():
        started, cpu_started = time.perf_counter(), time.process_time()
        columns = [column.to_pylist() for column in batch.columns]
        for key_id, qty, price, tag, status in zip(*columns):
            key = key_id.to_bytes(8, "big", signed=True)
            old = get(key)
            row = merge_row(None if old is None else loads(old), qty, price, tag, status)
            put(key, dumps(row))
        elapsed += time.perf_counter() - started
        cpu += time.process_time() - cpu_started
        done += batch.num_rows
        if progress:
            progress(done)
    db.close()
    return {"rows": done, "seconds": elapsed, "cpu_seconds": cpu}


def read_rows(path: str, ids: list[int]) -> dict[int, dict | None]:
    """The stored rows of `ids` as dicts shaped like the engine's lookup()."""
    db = open_db(path)
    try:
        found = {}
        for key_id in ids:
            raw = db.get(encode_key(key_id))
            if raw is None:
                found[key_id] = None
            else:
                qty, price, tag, status = pickle.loads(raw)
                found[key_id] = {"id": key_id, "qty": qty, "price": price, "tag": tag, "status": status}
        return found
    finally:
        db.close()

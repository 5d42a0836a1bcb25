"""The engine side of the ingest benchmark: KvTablet.put of whole Arrow batches."""

from __future__ import annotations

import time

from tally.bench.workload import Workload, table_descriptor


def ingest(path: str, workload: Workload, progress=None) -> dict:
    """Put every batch into a fresh tablet; time only the puts (data generation excluded).

    After put returns, the rows are queryable (lookup reads them), which is the point the naive
    loop is timed to as well. The rows a tablet still buffers in memory are written to RocksDB
    by the timed flush() at the end, so the measure includes every row reaching RocksDB; close()
    (RocksDB closing its files) is timed apart, as the naive loop's is not timed at all.
    """
    from merge_engine.kv.tablet import KvTablet

    tablet = KvTablet.open(path, table_descriptor())
    elapsed = cpu = 0.0
    done = 0
    end_offset = 0
    for batch in workload.batches():
        started, cpu_started = time.perf_counter(), time.process_time()
        end_offset = tablet.put(batch)
        elapsed += time.perf_counter() - started
        cpu += time.process_time() - cpu_started
        done += batch.num_rows
        if progress:
            progress(done)
    started, cpu_started = time.perf_counter(), time.process_time()
    tablet.flush()
    elapsed += time.perf_counter() - started
    cpu += time.process_time() - cpu_started
    started = time.perf_counter()
    tablet.close()
    return {
        "rows": done,
        "seconds": elapsed,
        "cpu_seconds": cpu,
        "close_seconds": time.perf_counter() - started,
        "log_end_offset": end_offset,
    }


def read_rows(path: str, ids: list[int]) -> dict[int, dict | None]:
    """The stored rows of `ids` through the public lookup()."""
    from merge_engine.kv.tablet import KvTablet

    with KvTablet.open(path, table_descriptor()) as tablet:
        return {key_id: tablet.lookup({"id": key_id}) for key_id in ids}


def count_rows(path: str) -> int:
    from merge_engine.kv.tablet import KvTablet

    with KvTablet.open(path, table_descriptor()) as tablet:
        return tablet.to_arrow().num_rows

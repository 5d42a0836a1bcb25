"""Ingest through one client upsert writer, timed the way every cluster benchmark times it:
from the first upsert to the flush that acknowledges every row (batches made beforehand)."""

from __future__ import annotations

import time

from tally.bench.progress import Progress


def timed_upserts(conn, name: str, batches, total: int, progress: Progress) -> dict:
    """Upsert `batches` into table `name` (within the progress step already begun)."""
    writer = conn.table(name).upsert_writer()
    started = time.perf_counter()
    done = 0
    for batch in batches:
        writer.upsert(batch)
        done += batch.num_rows
        progress.rows(done, total)
    offsets = writer.flush()
    seconds = time.perf_counter() - started
    writer.close()
    progress.done(f"{done / seconds:,.0f} rows/s")
    return {"rows": done, "seconds": seconds, "rows_per_s": done / seconds,
            "log_end_offsets": sum(offsets.values())}

"""A rollup's backfill, run by the admin client: the source's rows scanned, projected and merged
into the rollup as states.

While the rollup is "building" the coordinator refuses epochs on its source, so no Spark write
moves the source under the scan; the backfill first waits (at most `wait` seconds) for the
epochs that began before the rollup was created to commit (and builds from an empty rollup
again if one of them wrote it too). Each scanned row is one source key's
merged cells; projected onto the rollup's key they are written in MERGE_STATE mode, which folds
states exactly as the source folded the writes (the coordinator refuses a backfill of a rollup
where that does not hold). Then the rollup is marked "ready" and epochs begin again.

A backfill that dies leaves the rollup "building" (epochs on the source wait); running it
again (`admin.backfill_rollup`) makes the rollup's table again, empty, and builds it whole.
"""

from __future__ import annotations

import time

from tally.errors import ColumnLockConflict

# How long a backfill waits for the epochs in flight on its source to commit.
BACKFILL_WAIT = 60.0


def wait_for_epochs(conn, source: str, wait: float) -> None:
    """Return once no epoch on `source` is in flight; ColumnLockConflict naming them after
    `wait` seconds."""
    deadline = time.monotonic() + wait
    while True:
        in_flight = conn.coordinator_action("rollup_epochs_in_flight", {"source": source})
        if not in_flight:
            return
        if time.monotonic() >= deadline:
            raise ColumnLockConflict(
                f"epochs on {source} stayed in flight for {wait:.0f} s ({'; '.join(in_flight)}); "
                "the rollup stays building, and epochs on the source wait: run its backfill "
                "again once they commit (a crashed owner's, once it recovers), or drop it")
        time.sleep(0.5)


def backfill(conn, spec, table_id: int, wait: float = BACKFILL_WAIT):
    """Build rollup `spec` (building, its table `table_id` empty) from a scan of its source;
    the spec, ready."""
    from merge_engine import MergeMode
    from merge_engine.table.rollups import RollupSpec

    wait_for_epochs(conn, spec.source, wait)
    if any(end > 0 for end in conn.admin.list_offsets(spec.name).values()):
        # an epoch that began as the rollup was made wrote it too: build from empty
        answer = conn.coordinator_action("rollup_reset", {"name": spec.name,
                                                          "source": spec.source})
        table_id = int(answer["table_id"])
        conn.invalidate(spec.name)
    source = conn.table(spec.source)
    rollup = conn.table(spec.name)
    names = source.meta.routing.arrow_schema.names
    needed = spec.source_columns()
    fed = [c.name for c in spec.columns]
    with rollup.upsert_writer(mode=MergeMode.MERGE_STATE) as writer:
        for batch in source.scan(columns=[n for n in names if n in needed]):
            writer.upsert(spec.project(batch, fed))
            writer.flush()  # a refusal raises at the batch it is met in
    answer = conn.coordinator_action("rollup_ready", {"name": spec.name, "table_id": table_id})
    conn.invalidate(spec.source)
    conn.invalidate(spec.name)
    return RollupSpec.from_json(answer)

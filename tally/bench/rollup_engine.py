"""Tally's side of the rollup benchmark: the events table and a tablet per rollup.

Each rollup is a `RollupSpec` (the engine's rollup definitions, made from tally.bench.events'
ROLLUPS) with its table from `spec.descriptor(source_schema)`. Per batch: `KvTablet.put` of the
events into the source tablet, then each rollup's `spec.project(batch)` put into its tablet,
which folds the projected rows per key as any aggregate write. The side is timed over the puts
and a read of each rollup's rows (a snapshot's batches, the scan a tablet server serves): when
the last put returns, every rollup holds the batch; the read proves it readable, as
ClickHouse's side reads its rollups.
"""

from __future__ import annotations

import os
import time

import pyarrow as pa
import pyarrow.compute as pc

from tally.bench.events import ROLLUPS, EventWorkload, source_descriptor

SOURCE = "bench.events"


def specs():
    from merge_engine.table.rollups import RollupSpec

    return [RollupSpec.define(f"bench.{r.name}", SOURCE, list(r.keys), dict(r.columns),
                              start="from-now") for r in ROLLUPS]


def _open(path: str):
    from merge_engine.kv.tablet import KvTablet

    source = source_descriptor()
    os.makedirs(path, exist_ok=True)
    events = KvTablet.open(os.path.join(path, "events"), source)
    rollups = []
    for rollup, spec in zip(ROLLUPS, specs()):
        spec = spec.bind(source.schema)
        rollups.append((spec, KvTablet.open(os.path.join(path, rollup.name),
                                            spec.descriptor(source.schema))))
    return events, rollups


def read_all(tablet) -> pa.Table:
    """Every row of the tablet, through a snapshot (buffered rows as they are, then stored)."""
    snapshot = tablet.snapshot()
    try:
        batches = list(snapshot.batches())
    finally:
        snapshot.release()
    if not batches:
        return tablet.to_arrow()  # empty: the table's schema
    return pa.Table.from_batches(batches)


def _close(events, rollups) -> None:
    events.close()
    for _, tablet in rollups:
        tablet.close()


def ingest(path: str, workload: EventWorkload, progress=None) -> dict:
    events, rollups = _open(path)
    elapsed = cpu = 0.0
    done = 0
    for batch in workload.batches():
        started, cpu_started = time.perf_counter(), time.process_time()
        rows = pa.Table.from_batches([batch])
        events.put(rows)
        for spec, tablet in rollups:
            tablet.put(spec.project(rows))
        elapsed += time.perf_counter() - started
        cpu += time.process_time() - cpu_started
        done += batch.num_rows
        if progress:
            progress(done)
    started, cpu_started = time.perf_counter(), time.process_time()
    rollup_rows = {r.name: read_all(tablet).num_rows for r, (_, tablet) in zip(ROLLUPS, rollups)}
    read_seconds = time.perf_counter() - started
    cpu += time.process_time() - cpu_started
    _close(events, rollups)
    return {"rows": done, "seconds": elapsed + read_seconds, "write_seconds": elapsed,
            "read_seconds": read_seconds, "cpu_seconds": cpu, "rollup_rows": rollup_rows}


def _epoch_seconds(column) -> pa.Array:
    """A time bucket column (a timestamp of any unit) as whole seconds since the epoch."""
    return pc.cast(pc.cast(column, pa.timestamp("s")), pa.int64())


def read_rollups(path: str) -> dict[str, dict[tuple, dict]]:
    """Each rollup's rows: key tuple (time buckets in epoch seconds) -> {column: value}."""
    events, rollups = _open(path)
    try:
        answers = {}
        for rollup, (_, tablet) in zip(ROLLUPS, rollups):
            table = read_all(tablet)
            keys = []
            for name, _, unit in rollup.key_parts():
                if unit is not None:
                    table = table.set_column(table.schema.get_field_index(name), name,
                                             _epoch_seconds(table[name]))
                keys.append(name)
            columns = [name for name, _, _ in rollup.column_parts()]
            answers[rollup.name] = {tuple(row[k] for k in keys): {c: row[c] for c in columns}
                                    for row in table.to_pylist()}
        return answers
    finally:
        _close(events, rollups)


def source_rows(path: str) -> int:
    events, rollups = _open(path)
    try:
        return read_all(events).num_rows
    finally:
        _close(events, rollups)

"""ClickHouse's side of the rollup benchmark: a source table and three materialized views.

The events go into a MergeTree (ORDER BY event_id; ClickHouse keeps every inserted row, where
Tally's keyed table keeps each event_id's last); each rollup is an AggregatingMergeTree fed by a
materialized view that groups every inserted block by the rollup's keys (time buckets by
toStartOfMinute/Hour/Day). ClickHouse runs a table's views synchronously inside the insert, so
when an insert returns every rollup holds its rows: the side is timed over the inserts and a
read of each rollup's merged rows (its parts merged by GROUP BY, as ClickHouse users read it).

Aggregates as states (`SimpleAggregateFunction`): count(*) as sum of counts, sum, min, max.
"""

from __future__ import annotations

import time

import pyarrow as pa

from tally.bench import clickhouse_peer
from tally.bench.events import ROLLUPS, EventWorkload, Rollup

TIME_FUNCTIONS = {"minute": "toStartOfMinute", "hour": "toStartOfHour", "day": "toStartOfDay"}
STATE_FUNCTIONS = {"count": ("sum", "UInt64"), "sum": ("sum", "Int64"),
                   "min": ("min", "Int64"), "max": ("max", "Int64")}

CREATE_SOURCE = """
CREATE TABLE IF NOT EXISTS bench.events (
  event_id Int64, ts DateTime64(3, 'UTC'), product String, region String, user Int64,
  clicks Int64, amount Int64
) ENGINE = MergeTree ORDER BY event_id
"""
INSERT = "INSERT INTO bench.events SELECT * FROM Python(batch)"


def _key_sql(rollup: Rollup) -> list[tuple[str, str, str]]:
    """(name, column type, expression over the source) per key."""
    keys = []
    for name, source, unit in rollup.key_parts():
        if unit is None:
            keys.append((name, "String", f"e.{source}"))
        else:
            keys.append((name, "DateTime('UTC')", f"{TIME_FUNCTIONS[unit]}(e.{source})"))
    return keys


def create_statements(rollup: Rollup) -> list[str]:
    """The rollup's AggregatingMergeTree and the materialized view that feeds it (source
    columns qualified: an alias such as `amount` would otherwise shadow the column)."""
    keys = _key_sql(rollup)
    columns = [f"{name} {kind}" for name, kind, _ in keys]
    selects = [f"{expression} AS {name}" for name, _, expression in keys]
    for name, function, source in rollup.column_parts():
        state, kind = STATE_FUNCTIONS[function]
        columns.append(f"{name} SimpleAggregateFunction({state}, {kind})")
        selects.append(f"count() AS {name}" if function == "count"
                       else f"{function}(e.{source}) AS {name}")
    key_names = ", ".join(name for name, _, _ in keys)
    return [
        f"CREATE TABLE IF NOT EXISTS bench.{rollup.name} ({', '.join(columns)}) "
        f"ENGINE = AggregatingMergeTree ORDER BY ({key_names})",
        f"CREATE MATERIALIZED VIEW IF NOT EXISTS bench.{rollup.name}_feed TO bench.{rollup.name} "
        f"AS SELECT {', '.join(selects)} FROM bench.events AS e GROUP BY {key_names}",
    ]


def read_statement(rollup: Rollup) -> str:
    """Every row of the rollup, its parts merged; time buckets as epoch seconds."""
    keys = _key_sql(rollup)
    selects = [f"toUnixTimestamp({name}) AS {name}" if kind.startswith("DateTime") else name
               for name, kind, _ in keys]
    for name, function, _ in rollup.column_parts():
        state, _ = STATE_FUNCTIONS[function]
        selects.append(f"{state}({name}) AS {name}")
    key_names = ", ".join(name for name, _, _ in keys)
    return f"SELECT {', '.join(selects)} FROM bench.{rollup.name} GROUP BY {key_names}"


def _open(path: str):
    db = clickhouse_peer.session(path)
    db.query(clickhouse_peer.CREATE_DATABASE)
    db.query(CREATE_SOURCE)
    for rollup in ROLLUPS:
        for statement in create_statements(rollup):
            db.query(statement)
    return db


def ingest(path: str, workload: EventWorkload, progress=None) -> dict:
    """Insert every batch (the views fill the rollups), then read each rollup whole."""
    db = _open(path)
    elapsed = cpu = 0.0
    done = 0
    for batch in workload.batches():
        started, cpu_started = time.perf_counter(), time.process_time()
        _insert(db, pa.Table.from_batches([batch]))
        elapsed += time.perf_counter() - started
        cpu += time.process_time() - cpu_started
        done += batch.num_rows
        if progress:
            progress(done)
    started, cpu_started = time.perf_counter(), time.process_time()
    rollup_rows = {r.name: clickhouse_peer.arrow(db.query(read_statement(r), "Arrow")).num_rows
                   for r in ROLLUPS}
    read_seconds = time.perf_counter() - started
    cpu += time.process_time() - cpu_started
    db.close()
    return {"rows": done, "seconds": elapsed + read_seconds, "write_seconds": elapsed,
            "read_seconds": read_seconds, "cpu_seconds": cpu, "rollup_rows": rollup_rows}


def _insert(db, batch: pa.Table) -> None:
    db.query(INSERT)  # Python(batch) names this frame's local variable


def read_rollups(path: str) -> dict[str, dict[tuple, dict]]:
    """Each rollup's rows: key tuple (time buckets in epoch seconds) -> {column: value}."""
    db = _open(path)
    try:
        answers = {}
        for rollup in ROLLUPS:
            keys = [name for name, _, _ in rollup.key_parts()]
            rows = clickhouse_peer.arrow(db.query(read_statement(rollup), "Arrow")).to_pylist()
            answers[rollup.name] = {tuple(row[k] for k in keys):
                                    {c: row[c] for c, _, _ in rollup.column_parts()}
                                    for row in rows}
        return answers
    finally:
        db.close()


def source_rows(path: str) -> int:
    db = _open(path)
    try:
        return int(str(db.query("SELECT count() FROM bench.events", "CSV")).strip())
    finally:
        db.close()

"""The rollup benchmark's workload: a stream of click events and three rollups of it.

Events (event_id, ts, product, region, user, clicks, amount) arrive in time order with a jitter
of up to a minute, spread evenly over `hours` hours, like a real stream; each batch comes from
its own seeded generator (seed, batch index) so every process makes the same data one batch at
a time. `amount` is in cents (an integer), so every rollup's sums are exact on every side and
compared by equality. No column is ever null.

The three rollups (ROLLUPS) are written once here, in the terms of Tally's rollup definitions
(keys and columns as `RollupSpec.define` takes them); the ClickHouse side spells the same
definitions as materialized views, and `reference()` computes them with one pyarrow group-by
over the whole input, the answer both sides are checked against.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tally.bench.workload import key_ids

START_MS = 1_796_083_200_000  # 2026-12-01 00:00:00 UTC
JITTER_MS = 60_000
UNIT_MS = {"minute": 60_000, "hour": 3_600_000, "day": 86_400_000}

ARROW_SCHEMA = pa.schema([
    pa.field("event_id", pa.int64(), nullable=False),
    pa.field("ts", pa.timestamp("ms")),
    pa.field("product", pa.string()),
    pa.field("region", pa.string()),
    pa.field("user", pa.int64()),
    pa.field("clicks", pa.int64()),
    pa.field("amount", pa.int64()),
])


@dataclass(frozen=True)
class Rollup:
    """One rollup: its name, keys (`RollupSpec.define`'s key expressions, with the unit and
    source of each time bucket) and columns (name -> "function(source)")."""

    name: str
    keys: tuple[str, ...]
    columns: dict

    def key_parts(self) -> list[tuple[str, str, str | None]]:
        """(name, source column, time unit or None) per key."""
        parts = []
        for key in self.keys:
            if key.startswith("date_trunc("):
                inner, _, name = key.partition(" AS ")
                arguments = inner[len("date_trunc("):-1].split(",")
                unit, source = (part.strip(" '") for part in arguments)
                parts.append((name.strip(), source, unit))
            else:
                parts.append((key, key, None))
        return parts

    def column_parts(self) -> list[tuple[str, str, str | None]]:
        """(name, function, source column or None for count(*)) per column."""
        parts = []
        for name, expression in self.columns.items():
            function, _, rest = expression.partition("(")
            source = rest.rstrip(")").strip()
            parts.append((name, function, None if source == "*" else source))
        return parts


ROLLUPS = (
    Rollup("by_minute_product", ("date_trunc('minute', ts) AS minute", "product"),
           {"events": "count(*)", "clicks": "sum(clicks)", "amount": "sum(amount)"}),
    Rollup("by_hour_region", ("date_trunc('hour', ts) AS hour", "region"),
           {"events": "count(*)", "clicks": "sum(clicks)", "amount": "sum(amount)",
            "max_amount": "max(amount)"}),
    Rollup("by_day", ("date_trunc('day', ts) AS day",),
           {"events": "count(*)", "clicks": "sum(clicks)", "amount": "sum(amount)",
            "min_amount": "min(amount)", "max_amount": "max(amount)"}),
)

PRODUCTS = pa.array([f"p{i:03d}" for i in range(50)], pa.string())
REGIONS = pa.array([f"region-{i}" for i in range(10)], pa.string())


@dataclass(frozen=True)
class EventWorkload:
    """`rows` events in batches of `batch`, over `hours` hours."""

    rows: int
    batch: int = 100_000
    seed: int = 42
    hours: int = 48
    users: int = 100_000

    @property
    def label(self) -> str:
        return f"{self.rows:,} events over {self.hours} hours"

    def args(self) -> dict:
        return {"rows": self.rows, "batch": self.batch, "seed": self.seed, "hours": self.hours,
                "users": self.users}

    def batch_count(self) -> int:
        return -(-self.rows // self.batch)

    def batches(self) -> Iterator[pa.RecordBatch]:
        for index in range(self.batch_count()):
            yield self.make_batch(index)

    def make_batch(self, index: int) -> pa.RecordBatch:
        start = index * self.batch
        n = min(self.batch, self.rows - start)
        rng = np.random.default_rng([self.seed, 7, index])
        position = np.arange(start, start + n, dtype=np.int64)
        span_ms = self.hours * 3_600_000 - JITTER_MS
        ts = START_MS + position * span_ms // max(1, self.rows) + rng.integers(0, JITTER_MS, n)
        return pa.RecordBatch.from_arrays([
            pa.array(key_ids(position), pa.int64()),
            pa.array(ts, pa.timestamp("ms")),
            pc.take(PRODUCTS, pa.array(rng.integers(0, len(PRODUCTS), n))),
            pc.take(REGIONS, pa.array(rng.integers(0, len(REGIONS), n))),
            pa.array(rng.integers(0, self.users, n), pa.int64()),
            pa.array(rng.integers(0, 6, n), pa.int64()),
            pa.array(rng.integers(0, 100_000, n), pa.int64()),
        ], schema=ARROW_SCHEMA)


def source_schema():
    """Tally's events table: keyed by event_id, the default merge engine (a key's last row)."""
    from merge_engine import Schema

    builder = Schema.builder()
    for field in ARROW_SCHEMA:
        builder = builder.column(field.name, field.type, nullable=field.nullable)
    return builder.primary_key("event_id").build()


def source_descriptor():
    from merge_engine import TableDescriptor

    return TableDescriptor(source_schema())


def _bucketed(table: pa.Table, rollup: Rollup) -> tuple[pa.Table, list[str]]:
    """`table` with a column per key of `rollup` (time buckets as epoch seconds)."""
    names = []
    for name, source, unit in rollup.key_parts():
        if unit is None:
            if name != source:
                table = table.append_column(name, table[source])
        else:
            ms = pc.cast(table[source], pa.int64())
            bucket = pc.multiply(pc.divide(ms, UNIT_MS[unit]), UNIT_MS[unit] // 1000)
            table = table.append_column(name, bucket)
        names.append(name)
    return table, names


def reference(workload: EventWorkload) -> dict[str, dict[tuple, dict]]:
    """Each rollup's rows, computed with one pyarrow group-by of the whole input: per rollup a
    dict of key tuple (time buckets in epoch seconds) -> {column: value}."""
    table = pa.Table.from_batches(list(workload.batches()))
    answers = {}
    for rollup in ROLLUPS:
        bucketed, keys = _bucketed(table, rollup)
        aggregations = []
        for _, function, source in rollup.column_parts():
            if function == "count":
                aggregations.append(("event_id", "count"))
            else:
                aggregations.append((source, function))
        grouped = bucketed.group_by(keys).aggregate(aggregations)
        names = [name for name, _, _ in rollup.column_parts()]
        out_names = [f"{c}_{f}" for c, f in aggregations]
        rows = {}
        for row in grouped.to_pylist():
            rows[tuple(row[k] for k in keys)] = {n: row[o] for n, o in zip(names, out_names)}
        answers[rollup.name] = rows
    return answers


def sample_keys(keys: list[tuple], count: int, seed: int) -> list[tuple]:
    """`count` of `keys` (all of them when fewer), the same in every process."""
    ordered = sorted(keys)
    if len(ordered) <= count:
        return ordered
    rng = np.random.default_rng([seed, 1_000_033])
    return [ordered[i] for i in sorted(rng.choice(len(ordered), size=count, replace=False))]

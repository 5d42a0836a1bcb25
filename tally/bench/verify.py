"""Check that a side of the ingest benchmark (the engine, the floor, DuckDB, ClickHouse) computed
the same table as the naive loop.

Both stores are read back after the timed runs, on a fixed sample of keys, and compared exactly:
integers and strings by equality, floats bit for bit. The side's row count is also checked
against the number of distinct ids in the input, which catches lost or duplicated keys that a
sample could miss.
"""

from __future__ import annotations

import importlib

import numpy as np

from tally.bench import naive
from tally.bench.workload import Workload

# The sides compared with the naive loop, by job name: each module has read_rows and count_rows.
SIDES = {"engine": "tally.bench.engine", "floor": "tally.bench.floor",
         "duckdb": "tally.bench.duckdb_peer", "clickhouse": "tally.bench.clickhouse_peer"}

COLUMNS = ("id", "qty", "price", "tag", "status")


def same_value(a, b) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        return a.hex() == b.hex()  # bitwise: 0.0 vs -0.0 and NaN payloads count
    return type(a) is type(b) and a == b


def compare(ids: list[int], side_rows: dict, naive_rows: dict, side: str = "engine") -> list[str]:
    """A message per disagreeing key (empty when all agree)."""
    problems = []
    for key_id in ids:
        got, want = side_rows[key_id], naive_rows[key_id]
        if got is None or want is None:
            if got is not want:
                problems.append(f"id {key_id}: {side} {got!r}, naive {want!r}")
            continue
        bad = [c for c in COLUMNS if not same_value(got.get(c), want.get(c))]
        if bad:
            detail = ", ".join(f"{c}: {side} {got.get(c)!r} naive {want.get(c)!r}" for c in bad)
            problems.append(f"id {key_id}: {detail}")
    return problems


def distinct_ids(workload: Workload) -> int:
    ids = [batch.column(0).to_numpy() for batch in workload.batches()]
    return int(np.unique(np.concatenate(ids)).size)


def verify(side_path: str, naive_path: str, workload: Workload, samples: int = 1000,
           side: str = "engine") -> dict:
    module = importlib.import_module(SIDES[side])
    ids = workload.sample_ids(samples)
    side_rows = module.read_rows(side_path, ids)
    naive_rows = naive.read_rows(naive_path, ids)
    problems = compare(ids, side_rows, naive_rows, side)
    expected_rows = distinct_ids(workload)
    count = module.count_rows(side_path)
    if count != expected_rows:
        problems.append(f"{side} holds {count:,} rows, the input has {expected_rows:,} keys")
    return {
        "sampled": len(ids),
        "present": sum(1 for r in naive_rows.values() if r is not None),
        "table_rows": count,
        "ok": not problems,
        "problems": problems[:10],
    }

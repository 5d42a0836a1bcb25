"""Check that the engine and the naive loop computed the same table.

Both stores are read back after the timed runs, on a fixed sample of keys, and compared exactly:
integers and strings by equality, floats bit for bit. The engine's row count is also checked
against the number of distinct ids in the input, which catches lost or duplicated keys that a
sample could miss.
"""

from __future__ import annotations

import numpy as np

from tally.bench import engine, naive
from tally.bench.workload import Workload

COLUMNS = ("id", "qty", "price", "tag", "status")


def same_value(a, b) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        return a.hex() == b.hex()  # bitwise: 0.0 vs -0.0 and NaN payloads count
    return type(a) is type(b) and a == b


def compare(ids: list[int], engine_rows: dict, naive_rows: dict) -> list[str]:
    """A message per disagreeing key (empty when all agree)."""
    problems = []
    for key_id in ids:
        got, want = engine_rows[key_id], naive_rows[key_id]
        if got is None or want is None:
            if got is not want:
                problems.append(f"id {key_id}: engine {got!r}, naive {want!r}")
            continue
        bad = [c for c in COLUMNS if not same_value(got.get(c), want.get(c))]
        if bad:
            detail = ", ".join(f"{c}: engine {got.get(c)!r} naive {want.get(c)!r}" for c in bad)
            problems.append(f"id {key_id}: {detail}")
    return problems


def distinct_ids(workload: Workload) -> int:
    ids = [batch.column(0).to_numpy() for batch in workload.batches()]
    return int(np.unique(np.concatenate(ids)).size)


def verify(engine_path: str, naive_path: str, workload: Workload, samples: int = 1000) -> dict:
    ids = workload.sample_ids(samples)
    engine_rows = engine.read_rows(engine_path, ids)
    naive_rows = naive.read_rows(naive_path, ids)
    problems = compare(ids, engine_rows, naive_rows)
    expected_rows = distinct_ids(workload)
    engine_count = engine.count_rows(engine_path)
    if engine_count != expected_rows:
        problems.append(f"engine holds {engine_count:,} rows, the input has {expected_rows:,} keys")
    return {
        "sampled": len(ids),
        "present": sum(1 for r in naive_rows.values() if r is not None),
        "table_rows": engine_count,
        "ok": not problems,
        "problems": problems[:10],
    }

"""DuckDB as a peer of the ingest benchmark: an embedded database file, a batch at a time.

Per 100k-row batch, one transaction: the batch (an Arrow table with each row's position `seq`)
is aggregated per id into a temporary table (sum, max, `string_agg(tag, ',' ORDER BY seq)` and
`last(status ORDER BY seq) FILTER (WHERE status IS NOT NULL)`), whose rows then update the keys
the table holds (`UPDATE ... FROM`, folding stored and new values with the same null rule as
the engine) and are inserted for the others (an anti join); then COMMIT, which makes the
batch durable. Two threads, the machine's cores.

Why not `INSERT ... ON CONFLICT (id) DO UPDATE`: in DuckDB 2.0.1 it is the same statement in
one, but each batch that updates string columns of existing keys takes longer than the one
before (0.7 s, 9 s, 16 s for the first three batches of case a on the bench machine), so the
two-statement form is DuckDB at its fastest on this workload, not a handicap.

DuckDB is not a dependency of Tally: it is taken from the environment when importable (the
`bench` and `test` extras list it), else installed once with pip into a directory of its own
beside the venv's packages (`peers_dir()`), which only the DuckDB measurement process imports.
"""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

from tally.bench.workload import Workload

REQUIREMENT = "duckdb>=2,<3"
THREADS = 2
COLUMNS = ("id", "qty", "price", "tag", "status")

CREATE = ("CREATE TABLE IF NOT EXISTS t (id BIGINT PRIMARY KEY, qty BIGINT, price DOUBLE, "
          "tag VARCHAR, status VARCHAR)")
AGGREGATE = """
CREATE TEMP TABLE g AS
SELECT id, sum(qty) AS qty, max(price) AS price, string_agg(tag, ',' ORDER BY seq) AS tag,
       last(status ORDER BY seq) FILTER (WHERE status IS NOT NULL) AS status
FROM batch GROUP BY id
"""
# The engine's null rule: a null contributes nothing, so one side's null leaves the other.
UPDATE = """
UPDATE t SET
  qty = CASE WHEN t.qty IS NULL THEN g.qty WHEN g.qty IS NULL THEN t.qty ELSE t.qty + g.qty END,
  price = CASE WHEN t.price IS NULL OR g.price > t.price THEN g.price ELSE t.price END,
  tag = CASE WHEN t.tag IS NULL THEN g.tag WHEN g.tag IS NULL THEN t.tag
             ELSE t.tag || ',' || g.tag END,
  status = coalesce(g.status, t.status)
FROM g WHERE t.id = g.id
"""
INSERT = "INSERT INTO t SELECT g.* FROM g ANTI JOIN t ON t.id = g.id"


def peers_dir() -> Path:
    """Where the benchmark installs peers the environment lacks: inside the venv (or
    interpreter prefix), apart from its site-packages."""
    return Path(sys.prefix) / "bench-peers"


def _import():
    try:
        return importlib.import_module("duckdb")
    except ImportError:
        directory = str(peers_dir())
        if directory not in sys.path:
            sys.path.insert(0, directory)
        importlib.invalidate_caches()
        return importlib.import_module("duckdb")


def ensure_installed() -> str:
    """DuckDB's version, installing it into peers_dir() first when it cannot be imported.
    Run by the parent before any measurement, so no measured process installs anything."""
    try:
        return _import().__version__
    except ImportError:
        pass
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check",
                    "--target", str(peers_dir()), REQUIREMENT], check=True)
    return _import().__version__


def connect(path: str):
    duckdb = _import()
    os.makedirs(path, exist_ok=True)
    con = duckdb.connect(os.path.join(path, "table.duckdb"))
    con.execute(f"SET threads = {THREADS}")
    con.execute(CREATE)
    return con


def ingest(path: str, workload: Workload, progress=None) -> dict:
    """One transaction per batch; time only the transactions (data generation excluded)."""
    con = connect(path)
    elapsed = cpu = 0.0
    done = 0
    for batch in workload.batches():
        started, cpu_started = time.perf_counter(), time.process_time()
        seq = pa.array(np.arange(batch.num_rows, dtype=np.int64))
        table = pa.Table.from_batches([batch]).append_column("seq", seq)
        con.execute("BEGIN")
        con.register("batch", table)
        con.execute(AGGREGATE)
        con.execute(UPDATE)
        con.execute(INSERT)
        con.execute("DROP TABLE g")
        con.unregister("batch")
        con.execute("COMMIT")
        elapsed += time.perf_counter() - started
        cpu += time.process_time() - cpu_started
        done += batch.num_rows
        if progress:
            progress(done)
    con.close()
    return {"rows": done, "seconds": elapsed, "cpu_seconds": cpu}


def read_rows(path: str, ids: list[int]) -> dict[int, dict | None]:
    """The stored rows of `ids`, shaped like the engine's lookup()."""
    con = connect(path)
    try:
        found: dict[int, dict | None] = {key_id: None for key_id in ids}
        con.register("wanted", pa.table({"id": pa.array(ids, pa.int64())}))
        rows = con.execute("SELECT t.* FROM t JOIN wanted USING (id)").fetchall()
        for row in rows:
            found[row[0]] = dict(zip(COLUMNS, row))
        return found
    finally:
        con.close()


def count_rows(path: str) -> int:
    con = connect(path)
    try:
        return con.execute("SELECT count(*) FROM t").fetchone()[0]
    finally:
        con.close()

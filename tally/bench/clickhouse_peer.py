"""ClickHouse (chdb, in process) as a peer of the ingest benchmark: an AggregatingMergeTree.

ClickHouse keeps per-key aggregates as parts of aggregate states that background merges fold
together and reads finish merging. Per batch one `INSERT ... SELECT ... FROM Python(batch)
GROUP BY id`, pre-aggregating the batch into one state row per key:
  - qty    `SimpleAggregateFunction(sum, Nullable(Int64))`   (null with x gives x, all null null)
  - price  `SimpleAggregateFunction(max, Nullable(Float64))`
  - tag    `SimpleAggregateFunction(groupArrayArray, Array(String))`, the batch's tags in input
           order (groupArray skips nulls; the pre-aggregation runs on one thread so that its
           order is the input's), joined with ',' when read
  - status `AggregateFunction(argMax, Tuple(Nullable(String)), UInt64)`: the last non-null
           status by the row's position in the whole input (`argMaxIf(tuple(status), seq,
           status IS NOT NULL)`; the tuple because `-If` drops a Nullable argument's null, so
           an empty state would read as '' rather than null)
AggregatingMergeTree, not SummingMergeTree: a summing table sums numbers only and keeps any
one value of the other columns, so max, the tag list and the last status would be wrong.

Two measures per run: "insert" times the inserts alone (the parts left unmerged are merged by
every read, as ClickHouse users read such tables: the table is readable when the last insert
returns); "merged" adds `OPTIMIZE TABLE ... FINAL`, until one row per key is stored.

chdb is not a dependency of Tally: it is taken from the environment when importable (the
`bench` and `test` extras list it), else installed once beside the venv's packages like DuckDB.
"""

from __future__ import annotations

import importlib
import subprocess
import sys
import time

import numpy as np
import pyarrow as pa

from tally.bench.duckdb_peer import peers_dir
from tally.bench.workload import Workload

REQUIREMENT = "chdb>=4,<5"
COLUMNS = ("id", "qty", "price", "tag", "status")

CREATE_DATABASE = "CREATE DATABASE IF NOT EXISTS bench"
CREATE = """
CREATE TABLE IF NOT EXISTS bench.t (
  id Int64,
  qty SimpleAggregateFunction(sum, Nullable(Int64)),
  price SimpleAggregateFunction(max, Nullable(Float64)),
  tag SimpleAggregateFunction(groupArrayArray, Array(String)),
  status AggregateFunction(argMax, Tuple(Nullable(String)), UInt64)
) ENGINE = AggregatingMergeTree ORDER BY id
"""
INSERT = """
INSERT INTO bench.t
SELECT id, sum(qty), max(price), groupArray(tag),
       argMaxStateIf(tuple(status), assumeNotNull(seq), status IS NOT NULL)
FROM Python(batch) GROUP BY id
SETTINGS max_threads = 1
"""
MERGE = "OPTIMIZE TABLE bench.t FINAL"
# A read merges what the parts still hold per key; one thread keeps the tag lists in part order.
READ = """
SELECT id, sum(qty) AS qty, max(price) AS price, groupArrayArray(tag) AS tag,
       argMaxMerge(status).1 AS status
FROM bench.t WHERE id IN (SELECT id FROM Python(wanted)) GROUP BY id
SETTINGS max_threads = 1
"""
COUNT = "SELECT uniqExact(id) FROM bench.t"


def _import():
    try:
        return importlib.import_module("chdb")
    except ImportError:
        directory = str(peers_dir())
        if directory not in sys.path:
            sys.path.insert(0, directory)
        importlib.invalidate_caches()
        return importlib.import_module("chdb")


def ensure_installed() -> str:
    """chdb's version and its ClickHouse's, installing chdb into peers_dir() first when it
    cannot be imported. Run by the parent before any measurement."""
    try:
        chdb = _import()
    except ImportError:
        subprocess.run([sys.executable, "-m", "pip", "install", "-q",
                        "--disable-pip-version-check", "--target", str(peers_dir()),
                        REQUIREMENT], check=True)
        chdb = _import()
    engine = str(chdb.query("SELECT version()", "CSV")).strip().strip('"')
    return f"chdb {chdb.__version__} (ClickHouse {engine})"


def available() -> bool:
    try:
        _import()
        return True
    except ImportError:
        return False


def session(path: str):
    """A persistent chdb session on `path` (one per process: chdb allows no second)."""
    _import()
    from chdb import session as chdb_session

    return chdb_session.Session(path)


def ingest(path: str, workload: Workload, progress=None) -> dict:
    """One pre-aggregating insert per batch, then OPTIMIZE FINAL; the inserts are "seconds",
    the inserts and the final merge together "merged_seconds" (data generation excluded)."""
    db = session(path)
    db.query(CREATE_DATABASE)
    db.query(CREATE)
    elapsed = cpu = 0.0
    done = 0
    for index, batch in enumerate(workload.batches()):
        started, cpu_started = time.perf_counter(), time.process_time()
        seq = np.arange(done, done + batch.num_rows, dtype=np.uint64)
        table = pa.Table.from_batches([batch]).append_column("seq", pa.array(seq))
        _insert(db, table)
        elapsed += time.perf_counter() - started
        cpu += time.process_time() - cpu_started
        done += batch.num_rows
        if progress:
            progress(done)
    started, cpu_started = time.perf_counter(), time.process_time()
    db.query(MERGE)
    merge_seconds = time.perf_counter() - started
    merge_cpu = time.process_time() - cpu_started
    db.close()
    return {"rows": done, "seconds": elapsed, "cpu_seconds": cpu,
            "merged_seconds": elapsed + merge_seconds, "merged_cpu_seconds": cpu + merge_cpu}


def _insert(db, batch: pa.Table) -> None:
    # Python(batch) names this frame's local variable
    db.query(INSERT)


def arrow(result) -> pa.Table:
    """A chdb query result in the Arrow format as a pyarrow Table."""
    return pa.ipc.open_file(pa.BufferReader(result.bytes())).read_all()


def read_rows(path: str, ids: list[int]) -> dict[int, dict | None]:
    """The merged rows of `ids`, shaped like the engine's lookup() (tags joined with ',')."""
    db = session(path)
    try:
        wanted = pa.table({"id": pa.array(ids, pa.int64())})  # noqa: F841 - read by Python()
        rows = arrow(db.query(READ, "Arrow")).to_pylist()
        found: dict[int, dict | None] = {key_id: None for key_id in ids}
        for row in rows:
            row["tag"] = ",".join(row["tag"]) if row["tag"] else None
            found[row["id"]] = {c: row[c] for c in COLUMNS}
        return found
    finally:
        db.close()


def count_rows(path: str) -> int:
    db = session(path)
    try:
        return int(str(db.query(COUNT, "CSV")).strip())
    finally:
        db.close()

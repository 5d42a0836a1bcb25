"""`tally demo`: a single-node cluster, a Spark streaming job aggregating orders, a crash in the
middle of a micro-batch, a restart that undoes the half-written batch, and a check that every row
equals the exactly-once result.

The job runs as a subprocess (demo/job.py) so it can really be killed: the kill comes from inside
a write task, after it wrote half of its rows, and takes the driver and the JVM down with it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from decimal import Decimal

import pyarrow as pa

from demo.crash import CRASH_EPOCH, JOB_PIDS
from demo.orders import expected_totals, write_orders

TABLE = "shop.product_totals"
FILES, PER_FILE, CRASH_IN = 6, 400, 3


class Steps:
    def __init__(self, total: int):
        self.total, self.n, self.started = total, 0, time.monotonic()

    def __call__(self, text: str) -> None:
        self.n += 1
        print(f"\n[{self.n}/{self.total}] {text}  (t+{time.monotonic() - self.started:.0f}s)",
              flush=True)


def product_totals_descriptor():
    from aggfuncs import AggFunction
    from merge_engine import Schema, TableDescriptor

    schema = (Schema.builder()
              .column("product", pa.string())
              .agg_column("revenue", pa.decimal128(18, 2), AggFunction.SUM)
              .agg_column("orders", pa.int64(), AggFunction.COUNT)
              .agg_column("max_price", pa.decimal128(10, 2), AggFunction.MAX)
              .agg_column("tags", pa.string(), AggFunction.STRING_AGG, distinct=True)
              .agg_column("order_ids", pa.list_(pa.int64()), AggFunction.ARRAY_AGG)
              .agg_column("status", pa.string(), AggFunction.LAST_VALUE_IGNORE_NULLS)
              .primary_key("product")
              .build())
    return TableDescriptor(schema, bucket_count=4, properties={"table.merge-engine": "aggregation"})


def run_job(url: str, source: str, checkpoint: str, crash_epoch: int | None, work: str) -> int:
    env = dict(os.environ)
    env.setdefault("PYSPARK_PYTHON", sys.executable)
    env.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    if crash_epoch is not None:
        env[CRASH_EPOCH] = str(crash_epoch)
        env[JOB_PIDS] = os.path.join(work, "job.pids")
    command = [sys.executable, "-m", "demo.job", url, TABLE, source, checkpoint]
    with subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True) as proc:
        for line in proc.stdout:
            line = line.rstrip()
            if line.startswith("tally sink"):
                print(f"   job | {_shorten(line)}", flush=True)
            elif "Error" in line or "error" in line:
                print(f"   job | {line[:300]}", flush=True)
        return proc.wait()


def _shorten(line: str) -> str:
    """A sink log line with the (long) owner id cut to its query id."""
    import re

    line = re.sub(r"spark-query:([0-9a-f]{8})[0-9a-f-]*/[^ :]*", r"query \1…", line)
    return re.sub(r", offsets=\{.*\}\)", ")", line)[:400]


def show_state(conn, expected_orders: int) -> None:
    rows = conn.table(TABLE).to_arrow().to_pylist()
    counted = sum(r["orders"] for r in rows)
    print(f"   table now counts {counted} orders in {len(rows)} products "
          f"(the source holds {expected_orders})")
    for lock in conn.locks.describe(TABLE):
        print(f"   lock: owner {lock['owner_id']}, token {lock['token']}, "
              f"expires in {lock['expires_in']:.0f}s")


def verify(conn, orders: list[dict]) -> tuple[bool, list[dict]]:
    expected = expected_totals(orders)
    rows = {r["product"]: r for r in conn.table(TABLE).to_arrow().to_pylist()}
    problems = []
    for product in sorted(set(expected) | set(rows)):
        got, want = rows.get(product), expected.get(product)
        if got != want:
            problems.append(f"{product}: table {got} != expected {want}")
    for p in problems[:5]:
        print(f"   MISMATCH {p}")
    return not problems, sorted(rows.values(), key=lambda r: r["revenue"], reverse=True)


def print_top(rows: list[dict], n: int = 8) -> None:
    header = f"   {'product':<10} {'revenue':>12} {'orders':>7} {'max price':>10}  {'status':<8} tags"
    print(header)
    print("   " + "-" * (len(header) - 3))
    for r in rows[:n]:
        print(f"   {r['product']:<10} {r['revenue']:>12} {r['orders']:>7} {r['max_price']:>10}  "
              f"{str(r['status']):<8} {r['tags']}")


def run(zookeeper: str | None = None) -> int:
    import client
    from server import LocalCluster

    step = Steps(7)
    work = tempfile.mkdtemp(prefix="tally-demo-")
    source, checkpoint = os.path.join(work, "orders"), os.path.join(work, "checkpoint")
    step("start a single-node Tally cluster" + (f" on ZooKeeper {zookeeper}" if zookeeper else
                                                " (embedded metadata store)"))
    with LocalCluster(os.path.join(work, "cluster"), tablet_servers=1, zookeeper=zookeeper) as cluster, \
            client.connect(cluster.url) as conn:
        print(f"   coordinator at {cluster.url}, data in {work}")
        step(f"create {TABLE} with the schema builder")
        conn.admin.create_database("shop", ignore_if_exists=True)
        descriptor = product_totals_descriptor()
        conn.admin.create_table(TABLE, descriptor)
        for c in descriptor.schema.columns:
            print(f"   {c.name:<10} {str(c.type):<16} {c.agg.value if c.agg else 'primary key'}")
        step(f"generate {FILES * PER_FILE} orders in {FILES} files (one micro-batch each)")
        orders = write_orders(source, FILES, PER_FILE)
        step(f"run the Spark streaming job; it is killed (SIGKILL) inside micro-batch {CRASH_IN}")
        code = run_job(cluster.url, source, checkpoint, CRASH_IN, work)
        print(f"   the job died with exit code {code} in the middle of micro-batch {CRASH_IN}")
        show_state(conn, len(orders))
        step("restart the job from the same checkpoint: it undoes the half-written batch")
        code = run_job(cluster.url, source, checkpoint, None, work)
        if code != 0:
            print(f"   the restarted job failed with exit code {code}")
            return 1
        show_state(conn, len(orders))
        step("verify every row against the exactly-once result")
        ok, rows = verify(conn, orders)
        print(f"   {'every row is exact' if ok else 'VERIFICATION FAILED'}: {len(rows)} products, "
              f"{sum(r['orders'] for r in rows)} orders, revenue "
              f"{sum((r['revenue'] for r in rows), Decimal(0))}")
        step("top products")
        print_top(rows)
        return 0 if ok else 1

"""`tally demo`: a single-node cluster, a Spark streaming job aggregating orders, a crash in the
middle of a micro-batch, a restart that undoes the half-written batch, and a check that every row
equals the exactly-once result.

The job runs as a subprocess (tally.demo.orders_job) so it can really be killed: the kill comes
from inside a write task, after it wrote half of its rows, and takes the driver and the JVM down
with it.

The check is deterministic (docs/guide.md, "The demo"): each run works in a new temporary
directory (source files, checkpoint, cluster; with --zookeeper, a new chroot of its own), the
source files have strictly increasing modification times so Spark reads file i in micro-batch i,
the model folds exactly the batches Spark recorded in its checkpoint in the sink's order
(tally.demo.orders), the crash is checked to have happened in the planned batch, and no process of
the killed job is left when the job restarts.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from decimal import Decimal

import pyarrow as pa

from tally.demo.crash import CRASH_EPOCH, JOB_MARKER, JOB_PIDS, end_job_processes
from tally.demo.orders import (expected_totals, file_name, orders_of_batches, spark_batches,
                               write_orders)

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


# How the job's lines from the sink's logger begin (the job's logging format names the logger).
SINK_LINE = "tally.sink: "


def run_job(url: str, source: str, checkpoint: str, crash_epoch: int | None, work: str,
            marker: str) -> int:
    """Run tally.demo.orders_job to its end (or its crash); when it returns, no process of it is
    left."""
    env = dict(os.environ)
    env.setdefault("PYSPARK_PYTHON", sys.executable)
    env.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    env[JOB_MARKER] = marker
    env.pop(CRASH_EPOCH, None)
    env.pop(JOB_PIDS, None)
    if crash_epoch is not None:
        env[CRASH_EPOCH] = str(crash_epoch)
        env[JOB_PIDS] = os.path.join(work, "job.pids")
    command = [sys.executable, "-m", "tally.demo.orders_job", url, TABLE, source, checkpoint]
    try:
        with subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              stdin=subprocess.DEVNULL, text=True) as proc:
            for line in proc.stdout:
                line = line.rstrip()
                if line.startswith(SINK_LINE):
                    print(f"   job | {_shorten(line.removeprefix(SINK_LINE))}", flush=True)
                elif "Error" in line or "error" in line:
                    print(f"   job | {line[:300]}", flush=True)
            return proc.wait()
    finally:
        left = end_job_processes(marker)
        if left:
            print(f"   ended what was left of the job: {', '.join(left)}", flush=True)


def _shorten(line: str) -> str:
    """A sink log line with the (long) owner and query ids cut to the query id's start."""
    import re

    line = re.sub(r"spark-query:([0-9a-f]{8})[0-9a-f-]*/[^ :]*", r"query \1…", line)
    return re.sub(r"query ([0-9a-f]{8})[0-9a-f-]{28}\b", r"query \1…", line)[:400]


def show_state(conn, expected_orders: int) -> None:
    rows = conn.table(TABLE).to_arrow().to_pylist()
    counted = sum(r["orders"] for r in rows)
    print(f"   table now counts {counted} orders in {len(rows)} products "
          f"(the source holds {expected_orders})")
    for lock in conn.locks.describe(TABLE):
        print(f"   lock: owner {lock['owner_id']}, token {lock['token']}, "
              f"expires in {lock['expires_in']:.0f}s")


def crashed_in(checkpoint: str, epoch: int) -> bool:
    """Whether Spark planned micro-batch `epoch` (offsets/<epoch>) and never finished it."""
    return (os.path.exists(os.path.join(checkpoint, "offsets", str(epoch)))
            and not os.path.exists(os.path.join(checkpoint, "commits", str(epoch))))


def check_schedule(checkpoint: str, files: int) -> tuple[bool, list[tuple[int, list[str]]]]:
    """Spark's record of which files each batch read, and whether it is the planned one:
    file i alone in batch i."""
    schedule = spark_batches(checkpoint)
    planned = [(i, [file_name(i)]) for i in range(files)]
    read = " ".join(f"{b}:{','.join(n.removesuffix('.json') for n in names)}"
                    for b, names in schedule)
    ok = schedule == planned
    print(f"   Spark's source log (batch:files): {read}"
          f"{'  (one file per batch, in file order)' if ok else '  NOT THE PLANNED ORDER'}")
    return ok, schedule


def verify(conn, batches: list[list[dict]]) -> tuple[bool, list[dict]]:
    expected = expected_totals(batches)
    rows = {r["product"]: r for r in conn.table(TABLE).to_arrow().to_pylist()}
    problems = []
    for product in sorted(set(expected) | set(rows)):
        got, want = rows.get(product), expected.get(product)
        if got != want:
            problems.append(f"{product}: table {got} != expected {want}")
    for p in problems[:5]:
        print(f"   MISMATCH {p}")
    return not problems, sorted(rows.values(), key=lambda r: r["revenue"], reverse=True)


def demo_zookeeper(zookeeper: str, tag: str) -> tuple[str, str, str]:
    """(connect string of this run's own chroot, parent connect string, node under the parent):
    a chroot of its own keeps the run clear of any earlier run's metadata in that ZooKeeper."""
    hosts, _, chroot = zookeeper.partition("/")
    parent = "/" + chroot.strip("/") if chroot.strip("/") else "/tally"
    node = f"demo-{tag}"
    return f"{hosts}{parent}/{node}", f"{hosts}{parent}", node


def drop_zookeeper_chroot(parent: str, node: str) -> None:
    from tally.meta import open_store

    try:
        with open_store(zookeeper=parent) as store:
            store.delete("/" + node, recursive=True)
    except Exception as e:  # noqa: BLE001 - cleaning up is best effort
        print(f"   (could not remove the demo's metadata {parent}/{node}: {e})")


def print_top(rows: list[dict], n: int = 8) -> None:
    header = f"   {'product':<10} {'revenue':>12} {'orders':>7} {'max price':>10}  {'status':<8} tags"
    print(header)
    print("   " + "-" * (len(header) - 3))
    for r in rows[:n]:
        print(f"   {r['product']:<10} {r['revenue']:>12} {r['orders']:>7} {r['max_price']:>10}  "
              f"{str(r['status']):<8} {r['tags']}")


def run(zookeeper: str | None = None) -> int:
    step = Steps(7)
    work = tempfile.mkdtemp(prefix="tally-demo-")  # new and empty: nothing of an earlier run
    zookeeper_chroot = None
    if zookeeper:
        zookeeper, *zookeeper_chroot = demo_zookeeper(zookeeper, os.path.basename(work))
    try:
        return _run(step, work, zookeeper)
    finally:
        if zookeeper_chroot:
            drop_zookeeper_chroot(*zookeeper_chroot)


def _run(step: Steps, work: str, zookeeper: str | None) -> int:
    from tally import client
    from tally.server import LocalCluster

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
        by_file = write_orders(source, FILES, PER_FILE)
        orders = [o for batch in by_file for o in batch]
        print(f"   {file_name(0)} .. {file_name(FILES - 1)}, modification times strictly "
              f"increasing in file order")
        step(f"run the Spark streaming job; it is killed (SIGKILL) inside micro-batch {CRASH_IN}")
        code = run_job(cluster.url, source, checkpoint, CRASH_IN, work, f"{work}:crashing")
        unfinished = crashed_in(checkpoint, CRASH_IN)
        if code == 0 or not unfinished:
            print(f"   CRASH NOT AS PLANNED: the job exited with code {code}, and Spark's "
                  f"checkpoint {'shows' if unfinished else 'does not show'} micro-batch "
                  f"{CRASH_IN} begun and unfinished")
            return 1
        print(f"   the job died with exit code {code} in the middle of micro-batch {CRASH_IN}")
        show_state(conn, len(orders))
        step("restart the job from the same checkpoint: it undoes the half-written batch")
        code = run_job(cluster.url, source, checkpoint, None, work, f"{work}:restarted")
        if code != 0:
            print(f"   the restarted job failed with exit code {code}")
            return 1
        show_state(conn, len(orders))
        step("verify every row against the exactly-once result")
        in_order, schedule = check_schedule(checkpoint, FILES)
        exact, rows = verify(conn, orders_of_batches(by_file, schedule))
        ok = exact and in_order
        print(f"   {'every row is exact' if ok else 'VERIFICATION FAILED'}: {len(rows)} products, "
              f"{sum(r['orders'] for r in rows)} orders, revenue "
              f"{sum((r['revenue'] for r in rows), Decimal(0))}"
              f"{'' if in_order or not exact else ' (rows exact for the batches Spark recorded)'}")
        step("top products")
        print_top(rows)
        return 0 if ok else 1

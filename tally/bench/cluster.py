"""Cluster benchmark: the ingest workload through the client against a LocalCluster, side by
side in the same run with in-process KvTablet puts, then single-key lookup latency over Flight.

Sides (same generated data, tally.bench.workload, case (a) of the ingest benchmark by default):
  in-process   KvTablet.put of every batch in a fresh process (bench.engine, as `tally bench`)
  cluster      a client in this process writes every batch with one upsert writer to a
               LocalCluster (`tablet_servers` processes, `buckets` buckets, embedded metadata)
               and flushes; timed from the first upsert to the flush that acknowledges all
               (every row durable and readable). Data generation is not timed on either side.
Then `lookups` single-key lookups of random existing keys give p50/p99 latency, each followed by
a no-op Flight round trip to a tablet server (the floor, measured in turn with the lookups so
both see the same load); then `lookup_many` of 1,000 random existing keys, 20 times, gives its
keys/s against the single lookups' keys/s. Sampled keys are compared between the cluster and
the in-process tablet (the run fails on a difference).

`run()` returns a dict of results; `python -m tally.bench.cluster` prints them as a table.
Targets: cluster >= 0.7x in-process throughput; lookup p99 < 2 ms (issue 3); lookup p99 <=
1.5x the no-op round trip's p99 and lookup_many >= 20x single lookups' keys/s (issue 22).
"""

from __future__ import annotations

import argparse
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

from tally.bench.proc import run_job
from tally.bench.client_ingest import timed_upserts
from tally.bench.progress import Progress
from tally.bench.workload import Workload, table_descriptor

THROUGHPUT_TARGET = 0.7
P99_TARGET_MS = 2.0
P99_VS_NOOP_TARGET = 1.5  # lookup p99 at most this many times a no-op round trip's (issue 22)
MANY_KEYS = 1_000
MANY_ROUNDS = 20
MANY_TARGET = 20.0  # lookup_many keys/s at least this many times single lookups' (issue 22)
TABLE = "default.bench"


def _in_process(path: Path, workload: Workload, progress: Progress) -> dict:
    progress.step("in-process KvTablet.put")
    result = run_job("engine", {"path": str(path), "workload": {
        "rows": workload.rows, "keys": workload.keys, "batch": workload.batch,
        "seed": workload.seed}}, on_progress=lambda done: progress.rows(done, workload.rows))
    rate = result["rows"] / result["seconds"]
    progress.done(f"{rate:,.0f} rows/s")
    return {"rows": result["rows"], "seconds": result["seconds"], "rows_per_s": rate}


def _through_cluster(conn, workload: Workload, buckets: int, progress: Progress) -> dict:
    descriptor = table_descriptor()
    descriptor.bucket_count = buckets
    conn.admin.create_table(TABLE, descriptor)
    batches = list(workload.batches())  # generated before the clock starts
    progress.step(f"client upserts to the cluster ({buckets} buckets)")
    return timed_upserts(conn, TABLE, batches, workload.rows, progress)


def _lookups(conn, workload: Workload, count: int, progress: Progress) -> dict:
    progress.step(f"{count:,} single-key lookups, each beside a no-op round trip")
    table = conn.table(TABLE)
    ids = workload.sample_ids(min(count, workload.distinct_keys))
    rng = random.Random(workload.seed)
    # The floor on this machine: a no-op Flight round trip to a tablet server of the table.
    route = conn.table_meta(TABLE).route(None, 0)
    channel = conn.server(route.address)
    for key_id in ids[:100]:  # warm up channels and caches
        table.lookup({"id": key_id})
        channel.action("ping")
    latencies, floor = [], []
    # One lookup then one no-op, in turn: both see the same moments of a busy machine.
    for _ in range(count):
        key = {"id": rng.choice(ids)}
        started = time.perf_counter()
        found = table.lookup(key)
        latencies.append(time.perf_counter() - started)
        assert found is not None
        started = time.perf_counter()
        channel.action("ping")
        floor.append(time.perf_counter() - started)
    p50, p99 = _percentiles(latencies)
    floor50, floor99 = _percentiles(floor)
    single_rate = count / sum(latencies)
    progress.done(f"p50 {p50:.3f} ms, p99 {p99:.3f} ms (no-op round trip: p50 {floor50:.3f} ms, "
                  f"p99 {floor99:.3f} ms; {p99 / floor99:.2f}x)")
    return {"count": count, "p50_ms": p50, "p99_ms": p99, "max_ms": max(latencies) * 1e3,
            "noop_p50_ms": floor50, "noop_p99_ms": floor99, "p99_vs_noop": p99 / floor99,
            "single_keys_per_s": single_rate}


def _lookup_many(conn, workload: Workload, single_rate: float, progress: Progress) -> dict:
    """Keys/s of `lookup_many` of MANY_KEYS random existing keys, against single lookups."""
    rounds = MANY_ROUNDS
    progress.step(f"{rounds} lookup_many calls of {MANY_KEYS:,} keys")
    table = conn.table(TABLE)
    ids = workload.sample_ids(min(MANY_KEYS * 4, workload.distinct_keys))
    rng = random.Random(workload.seed + 1)
    table.lookup_many([{"id": i} for i in ids[:MANY_KEYS]])  # warm up
    seconds = 0.0
    for _ in range(rounds):
        keys = [{"id": rng.choice(ids)} for _ in range(MANY_KEYS)]
        started = time.perf_counter()
        rows = table.lookup_many(keys)
        seconds += time.perf_counter() - started
        assert len(rows) == len(keys)
    rate = rounds * MANY_KEYS / seconds
    progress.done(f"{rate:,.0f} keys/s ({rate / single_rate:.1f}x single lookups' "
                  f"{single_rate:,.0f} keys/s)")
    return {"keys": MANY_KEYS, "rounds": rounds, "keys_per_s": rate,
            "single_keys_per_s": single_rate, "ratio": rate / single_rate}


def _percentiles(seconds: list[float]) -> tuple[float, float]:
    ordered = sorted(seconds)
    return (ordered[len(ordered) // 2] * 1e3,
            ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))] * 1e3)


def _verify(conn, engine_path: Path, workload: Workload, samples: int,
            progress: Progress) -> dict:
    from tally.bench.engine import read_rows

    progress.step(f"verify {samples} sampled keys: cluster == in-process")
    ids = workload.sample_ids(samples)
    expected = read_rows(str(engine_path), ids)
    table = conn.table(TABLE)
    wrong = [i for i in ids if table.lookup({"id": i}) != expected[i]]
    progress.done("ok" if not wrong else f"{len(wrong)} keys differ, e.g. id {wrong[0]}")
    return {"samples": len(ids), "mismatches": len(wrong)}


def run(rows: int = 1_000_000, keys: int | None = 100_000, batch: int = 100_000, seed: int = 42,
        tablet_servers: int = 2, buckets: int = 4, lookups: int = 5_000,
        samples: int = 200, stream=sys.stdout) -> dict:
    """Run both sides and the lookups; the results as a dict (see `format_text`)."""
    from tally import client
    from tally.server import LocalCluster

    workload = Workload(rows=rows, keys=keys, batch=batch, seed=seed)
    progress = Progress(5, stream)
    workdir = Path(tempfile.mkdtemp(prefix="tally-bench-cluster-"))
    try:
        in_process = _in_process(workdir / "tablet", workload, progress)
        with LocalCluster(str(workdir / "cluster"), tablet_servers=tablet_servers) as cluster:
            with client.connect(cluster.url) as conn:
                through = _through_cluster(conn, workload, buckets, progress)
                latency = _lookups(conn, workload, lookups, progress)
                many = _lookup_many(conn, workload, latency["single_keys_per_s"], progress)
                check = _verify(conn, workdir / "tablet", workload, samples, progress)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    ratio = through["rows_per_s"] / in_process["rows_per_s"]
    return {"workload": workload.label, "tablet_servers": tablet_servers, "buckets": buckets,
            "in_process": in_process, "cluster": through, "ratio": ratio,
            "throughput_target": THROUGHPUT_TARGET, "lookup": latency,
            "p99_target_ms": P99_TARGET_MS, "p99_vs_noop_target": P99_VS_NOOP_TARGET,
            "lookup_many": many, "many_target": MANY_TARGET, "verify": check,
            "ok": check["mismatches"] == 0}


def format_text(result: dict) -> str:
    from tabulate import tabulate

    ip, cl, lk = result["in_process"], result["cluster"], result["lookup"]
    many = result["lookup_many"]
    mark = lambda good: "ok" if good else "MISSED"  # noqa: E731
    lines = [
        f"cluster benchmark: {result['workload']}, {result['tablet_servers']} tablet servers, "
        f"{result['buckets']} buckets",
        tabulate([["in-process KvTablet.put", f"{ip['rows_per_s']:,.0f}", f"{ip['seconds']:.2f}"],
                  ["client -> LocalCluster (Flight)", f"{cl['rows_per_s']:,.0f}",
                   f"{cl['seconds']:.2f}"]],
                 ["side", "rows/s", "seconds"], colalign=["left", "right", "right"],
                 disable_numparse=True),
        f"ratio cluster / in-process: {result['ratio']:.2f}x "
        f"(target >= {result['throughput_target']}x: {mark(result['ratio'] >= 0.7)})",
        f"lookup latency over Flight ({lk['count']:,} lookups): p50 {lk['p50_ms']:.3f} ms, "
        f"p99 {lk['p99_ms']:.3f} ms, max {lk['max_ms']:.1f} ms "
        f"(target p99 < {result['p99_target_ms']} ms: {mark(lk['p99_ms'] < 2.0)})",
        f"  no-op Flight round trip on this machine (in turn with the lookups): p50 "
        f"{lk['noop_p50_ms']:.3f} ms, p99 {lk['noop_p99_ms']:.3f} ms; lookup p99 / no-op p99 "
        f"{lk['p99_vs_noop']:.2f}x (target <= {result['p99_vs_noop_target']}x: "
        f"{mark(lk['p99_vs_noop'] <= result['p99_vs_noop_target'])})",
        f"lookup_many of {many['keys']:,} keys: {many['keys_per_s']:,.0f} keys/s vs single "
        f"lookups {many['single_keys_per_s']:,.0f} keys/s: {many['ratio']:.1f}x (target >= "
        f"{result['many_target']:g}x: {mark(many['ratio'] >= result['many_target'])})",
        f"verification: {result['verify']['samples']} sampled keys, "
        f"{result['verify']['mismatches']} mismatches",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tally.bench.cluster", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--keys", type=int, default=100_000, help="0 for unique keys")
    parser.add_argument("--batch", type=int, default=100_000)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--tablet-servers", type=int, default=2)
    parser.add_argument("--buckets", type=int, default=4)
    parser.add_argument("--lookups", type=int, default=5_000)
    args = parser.parse_args(argv)
    result = run(rows=args.rows, keys=args.keys or None, batch=args.batch, seed=args.seed,
                 tablet_servers=args.tablet_servers, buckets=args.buckets, lookups=args.lookups)
    print()
    print(format_text(result))
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())

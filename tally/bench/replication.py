"""Replication benchmark: what three copies cost on ingest, and how long a failover takes.

One LocalCluster of three tablet-server processes (embedded metadata), two tables of the same
shape in the same run:
  RF 1    `table.replication.factor` 1: a write is acknowledged once its leader has it
  RF 3    factor 3, min.insync.replicas 2: acknowledged once every in-sync copy has it
The ingest workload (case a) goes through one client upsert writer into each, timed from the
first upsert to the flush that acknowledges every row; the ratio RF 3 / RF 1 is the cost of
replication (target >= 0.5x). One such write takes a second or two, so a single pair swings with
whatever else the machine does: `rounds` pairs run, each into fresh tables, alternating which
factor goes first, and each factor counts its median round.

Failover: `kills` times, kill -9 the leader of bucket 0 of the RF 3 table and time until the
first write of a key of that bucket is acknowledged by the new leader (the session timeout,
the election, the new leader's start and the client's retry, all included); then restart the
killed server and wait until every copy is in sync again before the next kill. p50 and p99.
Both tables are verified against each other on sampled keys.

Restore: in a second cluster with a remote dir, one bucket of `restore_rows` rows gets a
remote snapshot, its leader's log is truncated to the snapshot (so the log alone cannot
rebuild a copy), and a follower's disk is wiped; timed from the moment the coordinator places
the new copy on the restarted (new identity) server to every copy in sync again, and reported
as seconds per GB of the snapshot (the time to notice the server and place the copy is shown
apart: it is the session timeout and --replica-replace-after, not the restore).
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

from tally.bench.client_ingest import timed_upserts
from tally.bench.progress import Progress
from tally.bench.workload import Workload, table_descriptor

RATIO_TARGET = 0.5
FAILOVER_P99_TARGET_S = 10.0
FACTORS = (1, 3)


def table_name(factor: int, round_: int) -> str:
    return f"default.rf{factor}_{round_}"


def _ingest(conn, name: str, factor: int, batches, total: int, progress: Progress) -> dict:
    descriptor = table_descriptor()
    descriptor.bucket_count = 4
    descriptor.properties["table.replication.factor"] = str(factor)
    conn.admin.create_table(name, descriptor)
    progress.step(f"client upserts, replication factor {factor} ({name})")
    return timed_upserts(conn, name, batches, total, progress)


def _ingest_rounds(conn, batches, total: int, rounds: int, progress: Progress) -> dict:
    """{factor: the median round's result, with every round's rows/s under "rounds"}."""
    runs: dict[int, list[dict]] = {f: [] for f in FACTORS}
    for r in range(rounds):
        for factor in (FACTORS if r % 2 == 0 else FACTORS[::-1]):
            runs[factor].append(_ingest(conn, table_name(factor, r), factor, batches, total,
                                        progress))
    sides = {}
    for factor, results in runs.items():
        ordered = sorted(results, key=lambda x: x["rows_per_s"])
        sides[factor] = {**ordered[len(ordered) // 2],
                         "rounds": [x["rows_per_s"] for x in results]}
    return sides


def _failovers(cluster, conn, name: str, kills: int, progress: Progress) -> dict:
    import pyarrow as pa

    from tally.wire.bucket_hash import bucket_ids

    routing = conn.table_meta(name).routing
    key = next(k for k in range(10_000) if int(bucket_ids(
        pa.table({"id": pa.array([k], pa.int64())}), ["id"], routing.bucket_count)[0]) == 0)
    row = conn.table(name).lookup({"id": key})
    progress.step(f"{kills} kill -9 failovers of a leader")
    seconds = []
    for i in range(kills):
        leader = conn.admin.bucket_replicas(name)[(None, 0)]["leader"]
        victim = next(j for j, h in enumerate(cluster.tablet_servers)
                      if h.info.get("server_id") == leader)
        writer = conn.table(name).upsert_writer()
        cluster.kill_tablet_server(victim)
        started = time.perf_counter()
        writer.upsert(pa.Table.from_pylist([row], schema=routing.arrow_schema))
        writer.flush()
        seconds.append(time.perf_counter() - started)
        writer.close()
        cluster.start_tablet_server(victim)
        _wait_in_sync(conn, name)
        progress.rows(i + 1, kills)
    ordered = sorted(seconds)
    p50 = ordered[len(ordered) // 2]
    p99 = ordered[min(len(ordered) - 1, int(round(0.99 * (len(ordered) - 1))))]
    progress.done(f"p50 {p50:.2f} s, p99 {p99:.2f} s")
    return {"kills": kills, "p50_s": p50, "p99_s": p99, "max_s": ordered[-1],
            "seconds": seconds}


def _wait_in_sync(conn, name: str, deadline: float = 300.0) -> None:
    stop = time.monotonic() + deadline
    while time.monotonic() < stop:
        replicas = conn.admin.bucket_replicas(name)
        if all(r["leader"] and sorted(r["isr"]) == sorted(r["replicas"])
               for r in replicas.values()):
            return
        time.sleep(0.1)
    raise RuntimeError(f"{name} did not get back in sync within {deadline:.0f} s")


def _restore(root: Path, rows: int, progress: Progress) -> dict:
    """Seconds to rebuild a wiped follower from the newest remote snapshot, per GB of it."""
    import tally
    from tally.server import LocalCluster
    from tally.server.remote.snapshots import BucketPath, RemoteSnapshots

    remote = str(root / "remote")
    progress.step(f"restore of a wiped replica ({rows:,} rows, one bucket)")
    with LocalCluster(str(root / "restore"), tablet_servers=3, session_timeout=3.0,
                      replica_replace_after=1.0, remote_dir=remote,
                      snapshot_interval=3600, segment_interval=3600) as cluster, \
            tally.connect(cluster.url, retry_timeout=300) as conn:
        descriptor = table_descriptor()
        descriptor.bucket_count = 1
        name = "default.restore"
        conn.admin.create_table(name, descriptor)
        writer = conn.table(name).upsert_writer()
        workload = Workload(rows=rows, keys=None, batch=min(rows, 100_000), seed=7)
        for batch in workload.batches():
            writer.upsert(batch)
        end = writer.flush()
        writer.close()
        before = conn.admin.bucket_replicas(name)[(None, 0)]
        leader = next(h for h in cluster.tablet_servers
                      if h.info.get("server_id") == before["leader"])
        from tally.wire.channel import FlightChannel
        channel = FlightChannel(leader.address, cluster.cluster_token, timeout=600)
        try:
            channel.action("upload_snapshots", {})
        finally:
            channel.close()
        offset = max(end.values()) if isinstance(end, dict) else None
        table_id = conn.table_meta(name).table_id
        snapshot = RemoteSnapshots(remote).latest(BucketPath(table_id, 0, 0))
        conn.admin.truncate_log(name, 0, snapshot.offset, force=True)
        victim = next(i for i, h in enumerate(cluster.tablet_servers)
                      if h.info.get("server_id") in before["replicas"]
                      and h.info.get("server_id") != before["leader"])
        cluster.kill_tablet_server(victim)
        shutil.rmtree(cluster.tablet_servers[victim].data_dir)
        started = time.perf_counter()
        cluster.start_tablet_server(victim)
        newcomer = cluster.tablet_servers[victim].info["server_id"]
        placed = None
        stop = time.monotonic() + 900
        while time.monotonic() < stop:
            r = conn.admin.bucket_replicas(name)[(None, 0)]
            if placed is None and newcomer in r["replicas"]:
                placed = time.perf_counter()  # the copy exists: its rebuild starts
            if newcomer in r["isr"] and sorted(r["isr"]) == sorted(r["replicas"]):
                break
            time.sleep(0.05)
        else:
            raise RuntimeError("the wiped replica was not rebuilt within 900 s")
        done = time.perf_counter()
        seconds = done - (placed or started)
        placing = (placed or started) - started
    gigabytes = snapshot.total_bytes / 1e9
    progress.done(f"{seconds:.1f} s for {snapshot.total_bytes / 1e6:,.0f} MB "
                  f"(after {placing:.1f} s to notice the wiped server and place its copy)")
    return {"rows": rows, "snapshot_bytes": snapshot.total_bytes, "seconds": seconds,
            "placing_seconds": placing,
            "seconds_per_gb": seconds / gigabytes if gigabytes else None,
            "log_end": offset}


def _verify(conn, workload: Workload, samples: int) -> dict:
    import random

    ids = random.Random(workload.seed).sample(range(workload.keys), min(samples, workload.keys))
    one, three = conn.table(table_name(1, 0)), conn.table(table_name(3, 0))
    wrong = [i for i in ids if one.lookup({"id": i}) != three.lookup({"id": i})]
    return {"samples": len(ids), "mismatches": len(wrong)}


def run(rows: int = 500_000, keys: int = 50_000, batch: int = 50_000, seed: int = 42,
        kills: int = 20, samples: int = 200, session_timeout: float | None = None,
        restore_rows: int = 1_000_000, workdir: str | None = None, rounds: int = 5,
        stream=sys.stdout) -> dict:
    import tally
    from tally.server import LocalCluster

    workload = Workload(rows=rows, keys=keys, batch=batch, seed=seed)
    progress = Progress(2 * rounds + (2 if restore_rows else 1), stream)
    root = Path(workdir or tempfile.mkdtemp(prefix="tally-bench-replication-"))
    try:
        with LocalCluster(str(root / "cluster"), tablet_servers=3,
                          session_timeout=session_timeout) as cluster:
            with tally.connect(cluster.url, retry_timeout=300) as conn:
                batches = list(workload.batches())
                sides = _ingest_rounds(conn, batches, workload.rows, rounds, progress)
                check = _verify(conn, workload, samples)
                failover = _failovers(cluster, conn, table_name(3, 0), kills, progress)
        restore = _restore(root, restore_rows, progress) if restore_rows else None
    finally:
        if workdir is None:
            shutil.rmtree(root, ignore_errors=True)
    ratio = sides[3]["rows_per_s"] / sides[1]["rows_per_s"]
    return {"workload": workload.label, "rf1": sides[1], "rf3": sides[3], "ratio": ratio,
            "ratio_target": RATIO_TARGET, "rounds": rounds, "failover": failover,
            "failover_target_s": FAILOVER_P99_TARGET_S,
            "session_timeout": session_timeout, "verify": check, "restore": restore,
            "ok": check["mismatches"] == 0}


def format_text(result: dict) -> str:
    f = result["failover"]
    lines = [
        f"replication benchmark: {result['workload']}, 3 tablet servers, 4 buckets, "
        f"median of {result.get('rounds', 1)} rounds per factor",
        f"  RF 1   {result['rf1']['rows_per_s']:>12,.0f} rows/s  ({result['rf1']['seconds']:.2f} s)",
        f"  RF 3   {result['rf3']['rows_per_s']:>12,.0f} rows/s  ({result['rf3']['seconds']:.2f} s)",
        f"  RF 3 / RF 1: {result['ratio']:.2f}x (target >= {result['ratio_target']}x)",
        f"  failover over {f['kills']} kill -9 of a leader: p50 {f['p50_s']:.2f} s, "
        f"p99 {f['p99_s']:.2f} s, max {f['max_s']:.2f} s "
        f"(target p99 <= {result['failover_target_s']:g} s)",
        f"  verified: {result['verify']['samples']} sampled keys, "
        f"{result['verify']['mismatches']} mismatches",
    ]
    r = result.get("restore")
    if r:
        lines.append(f"  restore of a wiped replica from a remote snapshot: {r['seconds']:.1f} s "
                     f"for {r['snapshot_bytes'] / 1e6:,.0f} MB ({r['rows']:,} rows): "
                     f"{r['seconds_per_gb']:.0f} s per GB")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tally.bench.replication",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=500_000)
    parser.add_argument("--keys", type=int, default=50_000)
    parser.add_argument("--batch", type=int, default=50_000)
    parser.add_argument("--kills", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=5,
                        help="ingest rounds per replication factor; the median counts")
    parser.add_argument("--session-timeout", type=float, default=None)
    parser.add_argument("--restore-rows", type=int, default=1_000_000,
                        help="rows of the bucket whose wiped replica is restored (0: skip)")
    args = parser.parse_args(argv)
    result = run(rows=args.rows, keys=args.keys, batch=args.batch, kills=args.kills,
                 session_timeout=args.session_timeout, restore_rows=args.restore_rows,
                 rounds=args.rounds)
    print()
    print(format_text(result))
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())

"""How long writes to a bucket stop when its leader is gone: kill -9 of the leader, its process
paused (SIGSTOP, what a host that is gone looks like: connects are not refused, nothing
answers), and kill -9 with a coordinator restart (kill -9, start) right after.

A LocalCluster of three tablet servers, a one-bucket table at replication factor 3. Each trial
warms a writer (its routing names the leader), makes the fault, and times from the fault until
that writer's next write is acknowledged (the client re-routes by itself, so this includes
its per-attempt deadline on a paused server), and until the coordinator names another leader;
then the victim comes back and every copy gets in sync before the next trial. Prints p50 and
p99 of both per fault.

    .venv/bin/python scripts/failover_times.py --trials 10
    .venv/bin/python scripts/failover_times.py --faults stop --session-timeout 6 --request-timeout 2
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import tempfile
import threading
import time

import pyarrow as pa

import tally
from tally.server import LocalCluster

FAULTS = ("kill", "stop", "kill+coordinator")
NAME = "default.failover"


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def _in_sync(conn, deadline: float = 300.0) -> str:
    stop = time.monotonic() + deadline
    while time.monotonic() < stop:
        try:
            r = conn.admin.bucket_replicas(NAME)[(None, 0)]
            if r["leader"] and sorted(r["isr"]) == sorted(r["replicas"]):
                return r["leader"]
        except tally.TallyError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"{NAME} did not get back in sync within {deadline:.0f} s")


def _row() -> pa.Table:
    return pa.table({"k": pa.array([1], pa.int64()), "n": pa.array([1], pa.int64())})


def _elected(url: str, leader: str, started: float, until: threading.Event) -> list[float]:
    """Seconds from `started` until the coordinator names a leader other than `leader`."""
    out: list[float] = []

    def poll() -> None:
        with tally.connect(url, retry_timeout=120) as watcher:
            while not until.is_set():
                try:
                    now = watcher.admin.bucket_replicas(NAME)[(None, 0)]["leader"]
                except tally.TallyError:
                    now = None  # the coordinator restarting
                if now not in (None, leader):
                    out.append(time.perf_counter() - started)
                    return
                time.sleep(0.02)

    threading.Thread(target=poll, daemon=True).start()
    return out


def trial(cluster: LocalCluster, conn, fault: str) -> tuple[float, float | None]:
    leader = _in_sync(conn)
    victim = next(i for i, h in enumerate(cluster.tablet_servers)
                  if h.info.get("server_id") == leader)
    writer = conn.table(NAME).upsert_writer()
    writer.upsert(_row())
    writer.flush()  # its routing now names the leader
    done = threading.Event()
    errors: list[BaseException] = []

    def write() -> None:
        try:
            writer.upsert(_row())
            writer.flush()
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)
        done.set()

    pid = cluster.tablet_servers[victim].proc.pid
    until = threading.Event()
    started = time.perf_counter()
    elected = _elected(cluster.url, leader, started, until)
    if fault == "stop":
        os.kill(pid, signal.SIGSTOP)
    else:
        cluster.kill_tablet_server(victim)
    thread = threading.Thread(target=write, daemon=True)
    thread.start()
    if fault == "kill+coordinator":
        cluster.kill_coordinator()
        cluster.start_coordinator()
    done.wait()
    elapsed = time.perf_counter() - started
    deadline = time.monotonic() + 60
    while not elected and time.monotonic() < deadline:
        time.sleep(0.05)
    until.set()
    writer.close()
    if fault == "stop":
        os.kill(pid, signal.SIGCONT)
    else:
        cluster.start_tablet_server(victim)
    if errors:
        raise errors[0]
    return elapsed, (elected[0] if elected else None)


def _summary(values: list[float]) -> str:
    return (f"p50 {_percentile(values, 0.5):.2f} s, p99 {_percentile(values, 0.99):.2f} s, "
            f"max {max(values):.2f} s")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=10)
    parser.add_argument("--faults", default=",".join(FAULTS),
                        help=f"comma-separated, of {', '.join(FAULTS)}")
    parser.add_argument("--session-timeout", type=float, default=None,
                        help="the coordinator's --session-timeout (default: the server's)")
    parser.add_argument("--request-timeout", type=float, default=None,
                        help="the writer's per-attempt deadline (default: the client's)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.ERROR)  # not the client's warning per retry
    faults = [f for f in args.faults.split(",") if f]
    unknown = set(faults) - set(FAULTS)
    if unknown:
        parser.error(f"unknown faults {sorted(unknown)}")
    with tempfile.TemporaryDirectory() as data_dir, \
            LocalCluster(data_dir, tablet_servers=3, session_timeout=args.session_timeout) \
            as cluster, tally.connect(cluster.url, retry_timeout=120, **(
                {} if args.request_timeout is None else
                {"request_timeout": args.request_timeout})) as conn:
        schema = (tally.Schema.builder().column("k", pa.int64())
                  .agg_column("n", pa.int64(), tally.AggFunction.SUM).primary_key("k").build())
        conn.admin.create_table(NAME, tally.TableDescriptor(
            schema, bucket_count=1, properties={"table.merge-engine": "aggregation"}))
        for fault in faults:
            back, elected = [], []
            for i in range(args.trials):
                written, named = trial(cluster, conn, fault)
                back.append(written)
                if named is not None:
                    elected.append(named)
                print(f"  {fault} {i + 1}/{args.trials}: writes back {written:.2f} s, new "
                      f"leader named {'-' if named is None else f'{named:.2f} s'}", flush=True)
            print(f"{fault}: writes back {_summary(back)}; new leader named "
                  f"{_summary(elected) if elected else '-'} ({len(back)} trials)", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Fault benchmark: how long writes stop when one server is sick, per kind of fault, and what
three copies cost on ingest.

A FaultCluster (tally.bench.fault_cluster: 3 tablet-server processes at replication factor 3,
min in-sync replicas 2, tablet server 2 in its own network namespace; default session
timeout) and one table of 3 buckets. A prober writes one key of bucket 0 over and over, each
write flushed (acknowledged) before the next. For each fault kind, `trials` times:

| fault | done to |
| --- | --- |
| kill -9 of a leader | bucket 0's leader: SIGKILL |
| pause of a leader | bucket 0's leader: SIGSTOP, SIGCONT once writes are back |
| partition of a leader | bucket 0 moved to server 2, whose packets are then all dropped |
| follower disk full | a follower of bucket 0 that leads nothing: RLIMIT_FSIZE of 1 byte |
| coordinator restart during failover | bucket 0's leader killed, then the coordinator |

Measured per trial, from the fault's start: **recovery**, until the first write begun once
the fault is in force is acknowledged; **unavailability**, the longest gap between two acknowledged
writes from the last one before the fault to that first one after it. Then the fault is
undone and every copy must be back in sync before the next trial. p50 and p99 over the
trials (with few trials the p99 is the worst). Verification: the probe key counts every
acknowledged write, and at most the ambiguous ones besides.

Ingest: RF 3 against RF 1 through one client upsert writer, as in the replication benchmark
(tally.bench.replication), median of `rounds` alternating rounds (target RF 3 >= 0.6x RF 1).
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

from tally.bench.progress import Progress

RATIO_TARGET = 0.6
RECOVERY_P99_TARGET_S = 5.0
GIVE_UP_S = 120.0       # a fault whose writes are not back by then counts as this long
KINDS = ("kill -9 of a leader", "pause of a leader", "partition of a leader",
         "follower disk full", "coordinator restart during failover")
TABLE = "default.fault_probe"


class Prober(threading.Thread):
    """Writes +1 to one key of bucket 0, one flushed write after another, timing each."""

    def __init__(self, url: str, key: int) -> None:
        super().__init__(name="fault prober", daemon=True)
        self.url, self.key = url, key
        self.acks: list[tuple[float, float]] = []   # (began, acknowledged), monotonic
        self.ambiguous = 0
        self.errors: dict[str, int] = {}   # the kinds of error the ambiguous writes met
        self.stopping = threading.Event()
        self._lock = threading.Lock()

    def run(self) -> None:
        import tally
        from tally.errors import TallyError

        with tally.connect(self.url, retry_timeout=GIVE_UP_S) as conn:
            table = conn.table(TABLE)
            while not self.stopping.is_set():
                began = time.monotonic()
                writer = table.upsert_writer()
                try:
                    writer.upsert([{"id": self.key, "v": 1}])
                    writer.flush()
                    with self._lock:
                        self.acks.append((began, time.monotonic()))
                except TallyError as e:
                    self.ambiguous += 1
                    what = f"{type(e).__name__}: {str(e)[:100]}"
                    self.errors[what] = self.errors.get(what, 0) + 1
                finally:
                    writer.close()
                self.stopping.wait(0.01)

    def last_ack_before(self, moment: float) -> float | None:
        with self._lock:
            done = [a for _, a in self.acks if a <= moment]
        return done[-1] if done else None

    def first_ack_begun_after(self, moment: float) -> float | None:
        with self._lock:
            return next((a for b, a in self.acks if b >= moment), None)

    def longest_gap(self, start: float, end: float) -> float:
        with self._lock:
            times = [a for _, a in self.acks if start <= a <= end]
        return max((b - a for a, b in zip(times, times[1:])), default=end - start)


def _wait(condition, what: str, deadline: float) -> None:
    stop = time.monotonic() + deadline
    while not condition():
        if time.monotonic() > stop:
            raise RuntimeError(f"{what} did not happen within {deadline:.0f} s")
        time.sleep(0.05)


class Faults:
    """The fault kinds, each a pair of inject and undo on a FaultCluster."""

    def __init__(self, fc, conn) -> None:
        self.fc, self.conn = fc, conn

    def replicas(self) -> dict:
        return self.conn.admin.bucket_replicas(TABLE)[(None, 0)]

    def leader(self) -> int:
        _wait(lambda: self.replicas()["leader"], "a leader of bucket 0", 120)
        return self.fc.index_of(self.replicas()["leader"])

    def in_sync(self) -> None:
        self.fc.heal_all()

        def done():
            running = {h.info.get("server_id") for h in self.fc.servers if h.running}
            return all(r["leader"] and sorted(r["isr"]) == sorted(r["replicas"])
                       and set(r["replicas"]) <= running
                       for r in self.conn.admin.bucket_replicas(TABLE).values())
        _wait(done, "every copy back in sync", 300)

    def prepare(self, kind: str):
        """Put the cluster in the shape the fault needs; returns (inject, undo)."""
        from tally.bench.fault_cluster import ISOLATED

        fc = self.fc
        if kind == "partition of a leader":
            target = fc.server_id(ISOLATED)
            if self.replicas()["leader"] != target:
                self.conn.admin.move_leader(TABLE, 0, to=target)
            _wait(lambda: self.replicas()["leader"] == target, "server 2 leading bucket 0", 60)
            return fc.net.partition, fc.net.heal
        if kind == "follower disk full":
            r = self.replicas()
            victim = next(s for s in r["replicas"] if s != r["leader"])
            for (_, bucket), other in self.conn.admin.bucket_replicas(TABLE).items():
                if other["leader"] == victim:
                    self.conn.admin.move_leader(TABLE, bucket,
                                                to=next(s for s in other["isr"] if s != victim))
            i = fc.index_of(victim)
            return (lambda: fc.fill_disk(i)), (lambda: fc.free_disk(i))
        victim = self.leader()
        if kind == "kill -9 of a leader":
            return (lambda: fc.kill(victim)), (lambda: fc.start_server(victim))
        if kind == "pause of a leader":
            return (lambda: fc.pause(victim)), (lambda: fc.resume(victim))
        if kind == "coordinator restart during failover":
            def inject():
                fc.kill(victim)
                fc.restart_coordinator()
            return inject, (lambda: fc.start_server(victim))
        raise ValueError(f"unknown fault kind {kind!r}")


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def _fault_trials(fc, conn, kind: str, trials: int, prober: Prober, faults: Faults,
                  progress: Progress) -> dict:
    progress.step(f"{trials} x {kind}")
    recovery, unavailable, given_up = [], [], 0
    ambiguous, errors = prober.ambiguous, dict(prober.errors)
    for i in range(trials):
        inject, undo = faults.prepare(kind)
        _wait(lambda: prober.first_ack_begun_after(time.monotonic() - 0.5) is not None,
              "the prober writing before the fault", 120)
        started = time.monotonic()
        inject()
        # timed from the start of the fault, but only a write begun once it is in force (an
        # iptables rule or a coordinator restart takes a while to be done) counts as back
        in_force = time.monotonic()
        try:
            stop = started + GIVE_UP_S
            while prober.first_ack_begun_after(in_force) is None and time.monotonic() < stop:
                time.sleep(0.02)
        finally:
            undo()
        back = prober.first_ack_begun_after(in_force)
        if back is None:
            given_up += 1
            back = started + GIVE_UP_S
        recovery.append(back - started)
        before = prober.last_ack_before(started) or started
        unavailable.append(prober.longest_gap(before, back))
        faults.in_sync()
        progress.rows(i + 1, trials)
    met = {what: n - errors.get(what, 0) for what, n in prober.errors.items()
           if n > errors.get(what, 0)}
    result = {"kind": kind, "trials": trials, "recovery_s": recovery,
              "ambiguous": prober.ambiguous - ambiguous,
              "errors": sorted(met.items(), key=lambda kv: -kv[1])[:3],
              "unavailable_s": unavailable, "given_up": given_up,
              "recovery_p50_s": _percentile(recovery, 0.5),
              "recovery_p99_s": _percentile(recovery, 0.99),
              "unavailable_p50_s": _percentile(unavailable, 0.5),
              "unavailable_p99_s": _percentile(unavailable, 0.99)}
    progress.done(f"recovery p50 {result['recovery_p50_s']:.2f} s, p99 "
                  f"{result['recovery_p99_s']:.2f} s; unavailable p50 "
                  f"{result['unavailable_p50_s']:.2f} s, p99 {result['unavailable_p99_s']:.2f} s"
                  + (f"; {given_up} never recovered within {GIVE_UP_S:.0f} s" if given_up else "")
                  + (f"; {result['ambiguous']} writes failed, most with "
                     f"{result['errors'][0][0]}" if result["ambiguous"] else ""))
    return result


def _probe_key(conn) -> int:
    import pyarrow as pa

    from tally.wire.bucket_hash import bucket_ids

    routing = conn.table_meta(TABLE).routing
    return next(k for k in range(10_000) if int(bucket_ids(
        pa.table({"id": pa.array([k], pa.int64())}), ["id"], routing.bucket_count)[0]) == 0)


def run(trials: int = 5, rows: int = 200_000, keys: int = 20_000, batch: int = 20_000,
        seed: int = 42, rounds: int = 3, kinds=KINDS, workdir: str | None = None,
        stream=sys.stdout) -> dict:
    import pyarrow as pa

    import tally
    from tally.bench.fault_cluster import FaultCluster
    from tally.bench.replication import _ingest_rounds
    from tally.bench.workload import Workload
    from tally.server import LocalCluster

    progress = Progress(2 * rounds + len(kinds), stream)
    root = Path(workdir or tempfile.mkdtemp(prefix="tally-bench-faults-"))
    workload = Workload(rows=rows, keys=keys, batch=batch, seed=seed)
    try:
        with LocalCluster(str(root / "ingest"), tablet_servers=3) as cluster, \
                tally.connect(cluster.url, retry_timeout=300) as conn:
            sides = _ingest_rounds(conn, list(workload.batches()), workload.rows, rounds,
                                   progress)
        with FaultCluster(str(root / "faults")) as fc, \
                tally.connect(fc.url, retry_timeout=300) as conn:
            schema = (tally.Schema.builder().column("id", pa.int64())
                      .agg_column("v", pa.int64(), tally.AggFunction.SUM)
                      .primary_key("id").build())
            conn.admin.create_table(TABLE, tally.TableDescriptor(
                schema, bucket_count=3, properties={"table.merge-engine": "aggregation"}))
            key = _probe_key(conn)
            prober = Prober(fc.url, key)
            prober.start()
            faults = Faults(fc, conn)
            try:
                results = [_fault_trials(fc, conn, kind, trials, prober, faults, progress)
                           for kind in kinds]
            finally:
                prober.stopping.set()
                prober.join(GIVE_UP_S + 60)
            faults.in_sync()
            row = conn.table(TABLE).lookup({"id": key})
            counted = row["v"] if row else 0
            acked = len(prober.acks)
    finally:
        if workdir is None:
            shutil.rmtree(root, ignore_errors=True)
    ratio = sides[3]["rows_per_s"] / sides[1]["rows_per_s"]
    verify = {"acknowledged": acked, "ambiguous": prober.ambiguous, "counted": counted,
              "errors": sorted(prober.errors.items(), key=lambda kv: -kv[1])[:5],
              "ok": acked <= counted <= acked + prober.ambiguous}
    return {"workload": workload.label, "rf1": sides[1], "rf3": sides[3], "ratio": ratio,
            "ratio_target": RATIO_TARGET, "rounds": rounds, "faults": results,
            "recovery_target_s": RECOVERY_P99_TARGET_S, "trials": trials, "verify": verify,
            "ok": verify["ok"]}


def _rows(result: dict) -> list[list[str]]:
    return [[f["kind"], str(f["trials"]), f"{f['recovery_p50_s']:.2f}",
             f"{f['recovery_p99_s']:.2f}", f"{f['unavailable_p50_s']:.2f}",
             f"{f['unavailable_p99_s']:.2f}", str(f["given_up"]), f"{f.get('ambiguous', 0):,}"]
            for f in result["faults"]]


HEADERS = ["fault", "trials", "recovery p50 s", "recovery p99 s", "unavailable p50 s",
           "unavailable p99 s", "not back in 120 s", "failed writes"]


def _verification(result: dict) -> str:
    v = result["verify"]
    return (f"verified: the probe key counts {v['counted']} writes: {v['acknowledged']} "
            f"acknowledged, {v['ambiguous']} ambiguous "
            f"({'ok' if v['ok'] else 'WRONG: acknowledged writes lost or counted twice'})")


def format_text(result: dict) -> str:
    from tabulate import tabulate

    return "\n".join([
        f"fault benchmark: 3 tablet servers at RF 3 (min in-sync 2), {result['trials']} "
        "trials per fault, one probe key written back to back",
        tabulate(_rows(result), HEADERS, disable_numparse=True,
                 colalign=["left"] + ["right"] * 7),
        f"  recovery p99 target after a leader's fault <= {result['recovery_target_s']:g} s "
        "(a follower's full disk waits out the replica lag time)",
        f"  ingest {result['workload']}: RF 1 {result['rf1']['rows_per_s']:,.0f} rows/s, RF 3 "
        f"{result['rf3']['rows_per_s']:,.0f} rows/s: {result['ratio']:.2f}x "
        f"(target >= {result['ratio_target']}x)",
        "  " + _verification(result),
    ])


def markdown(result: dict) -> str:
    from tally.bench.markdown import table

    def mark(good: bool) -> str:
        return "met" if good else "MISSED"

    # the target is the failover's: a follower's full disk waits out the replica lag time
    worst = max((f["recovery_p99_s"] for f in result["faults"]
                 if f["kind"] != "follower disk full"), default=0.0)
    return "\n\n".join([
        f"3 tablet servers at replication factor 3 (min in-sync replicas 2), default session "
        f"timeout, {result['trials']} trials per fault; recovery is the time from the fault to "
        "the acknowledgement of the first write begun once it is in force, unavailability the longest gap between "
        "two acknowledged writes of the probe key around the fault.",
        table(HEADERS, _rows(result)),
        f"Recovery p99 target after a leader's fault <= {result['recovery_target_s']:g} s: "
        f"{mark(worst <= result['recovery_target_s'])} (worst p99 {worst:.2f} s; a follower's "
        "full disk stops writes for the replica lag time instead).",
        f"Ingest ({result['workload']}), median of {result['rounds']} rounds: RF 1 "
        f"{result['rf1']['rows_per_s']:,.0f} rows/s, RF 3 {result['rf3']['rows_per_s']:,.0f} "
        f"rows/s, **{result['ratio']:.2f}x** (target >= {result['ratio_target']}x: "
        f"{mark(result['ratio'] >= result['ratio_target'])}).",
        _verification(result).capitalize() + ".",
    ] + [f"{f['kind']}: {f['ambiguous']:,} probe writes failed (each retried as a new write), "
         f"most with `{f['errors'][0][0]}`" for f in result["faults"] if f.get("errors")])


def chart(result: dict, directory: Path) -> list[Path]:
    """Recovery and unavailability per fault kind, p50 and p99."""
    from tally.bench.charts import _pyplot, _save

    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8.4, 3.6))
    kinds = [f["kind"].replace(" during ", "\nduring ").replace(" of a ", "\nof a ")
             for f in result["faults"]]
    x = range(len(kinds))
    for offset, field, label in ((-0.3, "recovery_p50_s", "recovery p50"),
                                 (-0.1, "recovery_p99_s", "recovery p99"),
                                 (0.1, "unavailable_p50_s", "unavailable p50"),
                                 (0.3, "unavailable_p99_s", "unavailable p99")):
        ax.bar([i + offset for i in x], [f[field] for f in result["faults"]], width=0.2,
               label=label)
    ax.axhline(result["recovery_target_s"], color="tab:red", linestyle="--", linewidth=1,
               label=f"target {result['recovery_target_s']:g} s")
    ax.set_xticks(list(x), kinds, fontsize=7)
    ax.set_ylabel("seconds")
    ax.set_title("Writes after one sick server")
    ax.legend(fontsize=7)
    return [_save(fig, directory / "faults.png")]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tally.bench.faults",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=5, help="trials per fault kind")
    parser.add_argument("--rows", type=int, default=200_000, help="ingest rows per round")
    parser.add_argument("--rounds", type=int, default=3, help="ingest rounds per factor")
    parser.add_argument("--kind", action="append", choices=KINDS,
                        help="only this fault kind (repeatable)")
    args = parser.parse_args(argv)
    result = run(trials=args.trials, rows=args.rows, keys=max(1_000, args.rows // 10),
                 batch=max(1_000, args.rows // 10), rounds=args.rounds,
                 kinds=tuple(args.kind or KINDS))
    print()
    print(format_text(result))
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())

"""One fault trial: a fresh table, the workloads started, fault steps one after another, the
cluster healed, the workloads stopped, and the oracle's verdict.

A step (tests/faults/steps.py) injects its fault, waits for what must still happen while it
lasts (a new leader, writes acknowledged again), and undoes it; after every step the trial
waits until every bucket is back in sync on running servers, so the next step starts healthy.
At the end, besides the oracle: every copy of every bucket holds the same rows and changelog
as the others (a restored copy that kept its old rows would differ).
"""

from __future__ import annotations

import itertools

from tally import client
from tally.errors import TallyError
from tests.cluster.replica_checks import replica_rows_equal
from tests.faults import oracle
from tests.faults.workload import BUCKETS, KEYS, LeaderWatcher, LockFreeWriter, LockOwners, \
    Reader, descriptor
from tests.waiting import wait_until

_tables = itertools.count()
LIVENESS_S = 90.0       # what must happen during a fault happens within this, or the step fails


class Trial:
    def __init__(self, faults, clock, seed: int) -> None:
        self.faults = faults            # a tally.bench.fault_cluster.FaultCluster
        self.clock = clock
        self.seed = seed
        self.name = f"default.faults_{next(_tables)}"
        self.conn = client.connect(faults.url, retry_timeout=60)
        self.conn.admin.create_table(self.name, descriptor())
        self.history = oracle.History()
        self.reads = oracle.ReadWatch()
        self.epochs = oracle.EpochWatch()
        self.writer = LockFreeWriter(faults.url, self.name, self.history, seed)
        self.reader = Reader(faults.url, self.name, self.history, self.reads, seed + 1)
        self.watcher = LeaderWatcher(faults.url, self.name, self.epochs)
        self.owners = LockOwners(faults.url, self.name, clock)
        self.workers = [self.writer, self.reader, self.watcher, self.owners]
        self.log: list[str] = []

    # --- what steps ask ---------------------------------------------------------------------

    def replicas(self) -> dict:
        return self.conn.admin.bucket_replicas(self.name)

    def leader(self, bucket: int = 0) -> int:
        """The index of the server leading `bucket` now."""
        r = wait_until(lambda: self.replicas()[(None, bucket)]["leader"],
                       f"bucket {bucket} of {self.name} has a leader")
        return self.faults.index_of(r)

    def follower(self, bucket: int = 0) -> int:
        r = self.replicas()[(None, bucket)]
        return next(self.faults.index_of(s) for s in r["replicas"] if s != r["leader"])

    def make_leader(self, i: int, bucket: int = 0) -> None:
        """Server i leads `bucket` (moved there if it does not)."""
        target = self.faults.server_id(i)
        if self.replicas()[(None, bucket)]["leader"] != target:
            self.conn.admin.move_leader(self.name, bucket, to=target)
        wait_until(lambda: self.replicas()[(None, bucket)]["leader"] == target,
                   f"server {i} leads bucket {bucket}")

    def lead_nothing(self, i: int) -> None:
        """Every bucket server i leads moved to another in-sync copy."""
        me = self.faults.server_id(i)
        for (partition, bucket), r in self.replicas().items():
            if r["leader"] == me:
                other = next(s for s in r["isr"] if s != me)
                self.conn.admin.move_leader(self.name, bucket, to=other)
        wait_until(lambda: all(r["leader"] not in (None, me) for r in self.replicas().values()),
                   f"server {i} leads no bucket of {self.name}")

    def mark(self) -> int:
        return len(self.history)

    def wait_acks(self, since: int, count: int, what: str) -> None:
        wait_until(lambda: self.history.acked_since(since) >= count,
                   f"{count} writes acknowledged {what}", deadline=LIVENESS_S)

    def wait_new_leader(self, bucket: int, old: int, what: str) -> None:
        gone = self.faults.server_id(old)
        wait_until(lambda: self.replicas()[(None, bucket)]["leader"] not in (None, gone),
                   f"a new leader of bucket {bucket} {what}", deadline=LIVENESS_S)

    def wait_owner(self, attribute: str, before: int, what: str) -> None:
        commits = self.owners.commits
        wait_until(lambda: getattr(self.owners, attribute) > before
                   and self.owners.commits > commits, what, deadline=LIVENESS_S)

    def healthy(self) -> None:
        """Every fault undone, every server running, every bucket fully in sync."""
        self.faults.heal_all()
        running = lambda: {h.info.get("server_id") for h in self.faults.servers if h.running}  # noqa: E731

        def in_sync():
            try:
                replicas = self.replicas()
            except TallyError:
                return False
            return all(r["leader"] is not None and sorted(r["isr"]) == sorted(r["replicas"])
                       and set(r["replicas"]) <= running() for r in replicas.values())

        wait_until(in_sync, f"every bucket of {self.name} fully in sync", deadline=180)

    # --- the run ----------------------------------------------------------------------------

    def run(self, steps) -> oracle.Verdict:
        for worker in self.workers:
            worker.start()
        try:
            self.wait_acks(0, 5, "before the first fault")
            wait_until(lambda: self.owners.commits >= 1, "the lock owner's first commit")
            for step in steps:
                self.log.append(step.name)
                try:
                    step(self)
                finally:
                    self.healthy()
            self.wait_acks(self.mark(), 3, "after the last fault")
        finally:
            failures = []
            for worker in self.workers:
                try:
                    worker.stop()
                except BaseException as e:  # noqa: BLE001 - every worker stopped first
                    failures.append(f"{worker.name}: {type(e).__name__}: {e}")
            self.healthy()
        assert not failures, failures
        return self.judge()

    def judge(self) -> oracle.Verdict:
        try:
            self.conn.admin.list_offsets(self.name, settle=True)
        except TypeError:
            pass  # a server without settled offsets: the scan below reads the high watermark
        rows = self.conn.table(self.name).to_arrow().to_pylist()
        free = {r["k"]: (r["free"] or 0, r["free_n"] or 0) for r in rows
                if r["free"] is not None or r["free_n"] is not None}
        verdict = oracle.count_problems(self.history, free)
        locked = {r["k"]: (r["locked"], r["locked_n"]) for r in rows
                  if r["locked"] is not None and r["locked_n"]}
        committed = self.owners.committed(self.conn)
        want = oracle.expected_locked(committed, KEYS)
        if locked != want:
            wrong = sorted(k for k in set(locked) | set(want) if locked.get(k) != want.get(k))
            verdict.problems.append(
                f"column-lock owners: keys {wrong[:8]} hold {[locked.get(k) for k in wrong[:8]]}"
                f", want {[want.get(k) for k in wrong[:8]]} (committed epochs {committed}, "
                f"each exactly once)")
        verdict.problems += self.reads.problems[:20] + self.epochs.problems[:20]
        for bucket in range(BUCKETS):
            addresses = [h.address for h in self.faults.servers]
            replica_rows_equal(self.faults.cluster, self.conn, self.name, bucket, addresses)
        return verdict

    def summary(self, verdict: oracle.Verdict) -> str:
        return (f"{self.name} steps {self.log}: {verdict.acknowledged} acknowledged, "
                f"{verdict.ambiguous} ambiguous, {self.history.count(oracle.REFUSED)} refused, "
                f"{verdict.lost} lost, {verdict.duplicated} duplicated; {self.reads.reads} "
                f"reads; {self.epochs.epochs()} leader epochs seen; owners: "
                f"{self.owners.commits} commits, {self.owners.restarts} restarts, "
                f"{self.owners.takeovers} takeovers, {len(self.owners.errors)} errors")

    def close(self) -> None:
        for worker in self.workers:
            worker.stopping.set()
        self.conn.close()


"""Exactly-once across owners, crashes, expiries and takeovers: a model-based test on a cluster.

A hypothesis state machine drives four lock owners of one aggregate table on a real
LocalCluster (coordinator and two tablet servers as processes, the embedded metadata store,
RocksDB): a full-row owner F (a, b, c), and partial owners A (a), AB (a, b) and C (c), so
owners overlap (F with all, A with AB) and are disjoint (A and C). Each owner writes epochs the
way the Spark sink does (epoch baseline, part or all of the epoch, commit), crashes (stops
renewing; its stale lease may still write as a zombie), restarts (re-acquire and recover) or is
taken over by another owner, releases, and is discarded by an operator. Lease-less writes,
retention passes and the lock clock moving forward (every server reads it from one file, so
expiry needs no sleeping) are interleaved.

The model keeps, per key and column, the final contributions (committed epochs, lease-less
writes, what a discard kept) and each owner's pending ones (written in its tenure since its last
commit). After every step the table must equal final + pending, every refusal must be the one
the rules call for, and a refused call must change nothing. So every committed epoch is applied
exactly once, no undo reaches another owner's data or across a tenure boundary, and retention
never removes what a recoverable tenure needs.

The default run replays a fixed-seed share; TALLY_SLOW_TESTS=1 runs many random examples.
"""

from __future__ import annotations

import dataclasses
import os

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from tally import client
import recovery
from merge_engine import Schema, TableDescriptor
from tally.errors import ColumnLockConflict, LeaseLostError, RecoveryError, UnrecoveredLockError
from tally.server import LocalCluster
from tally.server.clock import SkewedClock
from tally.wire.channel import FlightChannel

TTL = 1500.0          # lock ttl, in seconds of the lock clock
TICK = 1000.0         # how far one tick moves the lock clock: two ticks expire a silent lease
HOLD = 3500.0         # expired-lock retention: recoverable for 4 ticks after the last renewal
KEYS = 10
OWNERS = {"F": ("a", "b", "c"), "A": ("a",), "AB": ("a", "b"), "C": ("c",)}
FULL_ROW = {"F"}
SHIFT = {"F": 0, "A": 3, "AB": 6, "C": 1}
COLUMN_SETS = [("a",), ("b",), ("c",), ("a", "b", "c")]


def epoch_rows(owner: str, epoch: int) -> list[dict]:
    """The rows of an owner's epoch: the same every time the epoch is (re)written."""
    keys = sorted({(epoch * 5 + j * 3 + SHIFT[owner]) % KEYS for j in range(4)})
    return [{"k": k, **{c: (epoch + 1) * (j + 1) for c in OWNERS[owner]}}
            for j, k in enumerate(keys)]


@dataclasses.dataclass
class Owner:
    """The model of one owner: its lock, tenure, epochs and uncommitted contributions."""

    name: str
    state: str = "down"           # down (no lock) | running | crashed (lock left, not renewed)
    tenure: int = 0               # model numbering; a new tenure starts at a fresh acquisition
    committed: int = -1           # last committed epoch (counts across tenures)
    written: int = 0              # rows of the current epoch written: 0, half, all
    pending: dict = dataclasses.field(default_factory=dict)   # {(k, col): sum}
    baseline_keys: frozenset = frozenset()                     # keys at the undo baseline
    epoch_keys: dict = dataclasses.field(default_factory=dict)  # {(tenure, epoch): keys}
    silent_ticks: int = 0         # ticks since the lease was last renewed (crashed owners)
    lease: object = None
    attempt: int | None = None    # the task attempt its writes carry (see fence)
    zombie: object = None         # the lease a crashed owner's paused process still holds
    conn: object = None

    @property
    def columns(self) -> tuple:
        return OWNERS[self.name]

    @property
    def epoch(self) -> int:
        return self.committed + 1

    @property
    def rows(self) -> list[dict]:
        return epoch_rows(self.name, self.epoch)

    def expired(self) -> bool:
        return self.state == "crashed" and self.silent_ticks * TICK > TTL

    def recoverable(self) -> bool:
        return self.silent_ticks * TICK < TTL + HOLD


class OwnersMachine(RuleBasedStateMachine):
    cluster: LocalCluster = None
    clock: SkewedClock = None
    tables = iter(range(10**9))

    def __init__(self):
        super().__init__()
        self.conn = client.connect(self.cluster.url, retry_timeout=60)
        self.name = f"default.owners_{next(self.tables)}_{os.getpid()}"
        self.owners = {name: Owner(name) for name in OWNERS}
        self.final: dict = {}       # {(k, col): sum}
        self.exists: set = set()    # keys with a row

    @initialize()
    def create_table(self):
        schema = (Schema.builder().column("k", pa.int64())
                  .agg_column("a", pa.int64(), "sum").agg_column("b", pa.int64(), "sum")
                  .agg_column("c", pa.int64(), "sum").primary_key("k").build())
        self.conn.admin.create_table(self.name, TableDescriptor(schema, bucket_count=2, properties={
            "table.merge-engine": "aggregation", "table.log.retention.offsets": "0",
            "table.log.retention.expired-lock-ms": str(int(HOLD * 1000))}))
        self.table = self.conn.table(self.name)

    def teardown(self):
        for owner in self.owners.values():
            if owner.conn is not None:
                owner.conn.close()
        self.conn.close()

    # --- helpers ---------------------------------------------------------------------------

    def some(self, predicate) -> bool:
        return any(predicate(o) for o in self.owners.values())

    def pick(self, data, predicate) -> str:
        """One of the owners a rule applies to (rules draw only owners they can act on)."""
        return data.draw(st.sampled_from(sorted(n for n, o in self.owners.items()
                                                if predicate(o))), label="owner")

    def target(self, owner: Owner):
        return None if owner.name in FULL_ROW else ["k", *owner.columns]

    def holders(self, columns) -> list[Owner]:
        """Owners whose lock (live or expired, not yet recovered) covers any of `columns`."""
        return [o for o in self.owners.values()
                if o.state != "down" and set(o.columns) & set(columns)]

    def write(self, owner: Owner, lease, rows: list[dict], attempt=None) -> None:
        with self.table.upsert_writer(target_columns=self.target(owner), lease=lease,
                                      attempt=attempt) as w:
            w.upsert(rows)
        self.add(owner.pending, rows, owner.columns)

    def fence(self, owner: Owner) -> None:
        """Register a new task attempt on both buckets, as a (re)started task does: the
        owner's earlier attempts (its zombie) may no longer write there."""
        owner.attempt = max(owner.conn.locks.register_attempt(owner.lease, b) for b in (0, 1))

    def add(self, into: dict, rows: list[dict], columns) -> None:
        for row in rows:
            self.exists.add(row["k"])
            for c in columns:
                into[(row["k"], c)] = into.get((row["k"], c), 0) + row[c]

    def undo(self, owner: Owner, baseline_keys) -> None:
        """The model of an undo: the owner's pending contributions go; a row it created goes
        too unless another column of it was ever written."""
        keys = {k for k, _ in owner.pending}
        owner.pending = {}
        for k in keys - set(baseline_keys):
            if not any(key == k for key, _ in self.contributions()):
                self.exists.discard(k)

    def contributions(self) -> dict:
        total = dict(self.final)
        for owner in self.owners.values():
            for cell, value in owner.pending.items():
                total[cell] = total.get(cell, 0) + value
        return total

    def expect_unchanged(self, call, errors):
        before = self.snapshot()
        with pytest.raises(errors):
            call()
        assert self.snapshot() == before

    def snapshot(self) -> dict:
        return {r["k"]: (r["a"], r["b"], r["c"]) for r in self.table.to_arrow().to_pylist()}

    # --- rules -----------------------------------------------------------------------------

    @precondition(lambda self: self.some(lambda o: o.state != "running"))
    @rule(data=st.data())
    def start(self, data):
        """A (re)start: acquire (taking over expired locks in the way), recover, then write."""
        name = self.pick(data, lambda o: o.state != "running")
        owner = self.owners[name]
        in_way = [o for o in self.holders(owner.columns) if o is not owner]
        blocked = [o for o in in_way if not o.expired() or not o.recoverable()]
        if owner.state == "crashed" and not owner.recoverable():
            blocked.append(owner)
        conn = client.connect(self.cluster.url, retry_timeout=60)
        if blocked:
            errors = tuple({ColumnLockConflict if o.state == "running" or not o.expired()
                            else RecoveryError for o in blocked})
            self.expect_unchanged(
                lambda: recovery.acquire(conn, self.name, name, owner.columns, ttl=TTL), errors)
            conn.close()
            event(f"start refused: {sorted(e.__name__ for e in errors)}")
            return
        event("start after a crash" if owner.state == "crashed" else "start")
        if [o for o in in_way]:
            event("takeover of an expired lock")
        lease = recovery.acquire(conn, self.name, name, owner.columns, ttl=TTL)
        for other in in_way:  # taken over: its uncommitted writes undone, its tenure over
            self.undo(other, other.baseline_keys)
            other.state, other.zombie = "down", None
        recovery.recover(conn, self.name, lease, self.target(owner), skip_idempotent=False)
        if owner.state == "crashed":  # the same tenure goes on, back at its last commit
            self.undo(owner, owner.baseline_keys)
        else:
            owner.tenure += 1
            owner.baseline_keys = frozenset(self.exists)
        owner.state, owner.lease, owner.conn, owner.zombie = "running", lease, conn, None
        owner.written, owner.silent_ticks = 0, 0
        self.fence(owner)

    @precondition(lambda self: self.some(lambda o: o.state == "running" and o.written < len(o.rows)))
    @rule(data=st.data(), whole=st.booleans())
    def write_epoch(self, data, whole):
        """Write the next part of the current epoch (the first half, or all that is left)."""
        name = self.pick(data, lambda o: o.state == "running" and o.written < len(o.rows))
        owner = self.owners[name]
        rows = owner.rows
        if owner.written == 0:
            owner.conn.locks.epoch_baseline(owner.lease, owner.epoch)
            owner.epoch_keys.setdefault((owner.tenure, owner.epoch), frozenset(self.exists))
        upto = len(rows) if whole else max(owner.written, len(rows) // 2) or len(rows)
        self.write(owner, owner.lease, rows[owner.written:upto], owner.attempt)
        owner.written = upto

    @precondition(lambda self: self.some(lambda o: o.state == "running" and o.written == len(o.rows)))
    @rule(data=st.data())
    def commit(self, data):
        name = self.pick(data, lambda o: o.state == "running" and o.written == len(o.rows))
        owner = self.owners[name]
        event("commit")
        assert owner.conn.locks.commit(owner.lease, owner.epoch,
                                       self.conn.admin.list_offsets(self.name)) is True
        for cell, value in owner.pending.items():
            self.final[cell] = self.final.get(cell, 0) + value
        owner.pending, owner.committed, owner.written = {}, owner.epoch, 0
        owner.baseline_keys = frozenset(self.exists)

    @precondition(lambda self: self.some(lambda o: o.state == "running" and o.written > 0))
    @rule(data=st.data())
    def retry_epoch(self, data):
        """A retried epoch: undo back to the epoch's baseline, as a retried task does."""
        name = self.pick(data, lambda o: o.state == "running" and o.written > 0)
        owner = self.owners[name]
        baseline = owner.conn.locks.epoch_baseline(owner.lease, owner.epoch)
        recovery.undo_since(owner.conn, self.name, owner.lease, baseline, self.target(owner))
        event("epoch retried")
        self.undo(owner, owner.epoch_keys[(owner.tenure, owner.epoch)])
        owner.written = 0
        self.fence(owner)

    @precondition(lambda self: self.some(lambda o: o.state == "running"))
    @rule(data=st.data())
    def crash(self, data):
        """The owner's driver dies: no more renewals; its paused executor keeps the lease."""
        name = self.pick(data, lambda o: o.state == "running")
        owner = self.owners[name]
        owner.conn.close()
        owner.state, owner.zombie, owner.conn, owner.lease = \
            "crashed", (owner.lease, owner.attempt), None, None

    @precondition(lambda self: self.some(lambda o: o.state == "crashed" and o.zombie is not None))
    @rule(data=st.data())
    def zombie_write(self, data):
        """A crashed owner's paused task writes with its old lease: accepted only while that
        lease is still the newest and unexpired (and then undone by the recovery)."""
        name = self.pick(data, lambda o: o.state == "crashed" and o.zombie is not None)
        owner = self.owners[name]
        row = owner.rows[:1]
        if owner.expired():
            self.expect_unchanged(lambda: self.write(owner, *owner.zombie[:1], row,
                                                     owner.zombie[1]), LeaseLostError)
            event("zombie write refused")
            return
        event("zombie write accepted")
        self.write(owner, owner.zombie[0], row, owner.zombie[1])

    @precondition(lambda self: self.some(lambda o: o.state == "running" and not o.written))
    @rule(data=st.data())
    def release(self, data):
        """A clean stop between epochs."""
        name = self.pick(data, lambda o: o.state == "running" and not o.written)
        owner = self.owners[name]
        assert owner.conn.locks.release(owner.lease) is True
        owner.conn.close()
        owner.state, owner.conn, owner.lease = "down", None, None

    @precondition(lambda self: self.some(lambda o: o.expired()))
    @rule(data=st.data())
    def discard(self, data):
        """An operator drops an expired lock: its uncommitted writes stay as they are."""
        name = self.pick(data, lambda o: o.expired())
        owner = self.owners[name]
        assert self.conn.locks.discard(self.name, name) is True
        event("discard")
        for cell, value in owner.pending.items():
            self.final[cell] = self.final.get(cell, 0) + value
        owner.pending, owner.state, owner.zombie = {}, "down", None

    @rule(columns=st.sampled_from(COLUMN_SETS), k=st.integers(0, KEYS - 1),
          value=st.integers(1, 50))
    def leaseless_write(self, columns, k, value):
        row = [{"k": k, **{c: value for c in columns}}]

        def write():
            with self.table.upsert_writer(target_columns=["k", *columns]) as w:
                w.upsert(row)

        holders = self.holders(columns)
        if holders:
            errors = tuple({UnrecoveredLockError if o.expired() else ColumnLockConflict
                            for o in holders})
            self.expect_unchanged(write, errors)
            event(f"lease-less write refused: {sorted(e.__name__ for e in errors)}")
            return
        write()
        event("lease-less write")
        self.add(self.final, row, columns)

    @rule()
    def tick(self):
        """Move every server's lock clock forward, then running owners renew (a live lease
        always has more than a tick left, a silent one expires in its second tick)."""
        self.clock.advance(TICK)
        for owner in self.owners.values():
            if owner.state == "running":
                owner.lease = owner.conn.locks.renew(owner.lease)
            elif owner.state == "crashed":
                owner.silent_ticks += 1

    @rule()
    def retention_pass(self):
        """Every tablet server truncates as far as retention and the lock floors allow."""
        for handle in self.cluster.tablet_servers:
            FlightChannel(handle.address).action("enforce_retention", {})

    @invariant()
    def table_equals_model(self):
        if not hasattr(self, "table"):
            return
        total = self.contributions()
        expected = {k: tuple(total.get((k, c)) for c in ("a", "b", "c")) for k in self.exists}
        assert self.snapshot() == expected


@pytest.fixture(scope="module")
def owners_cluster(tmp_path_factory):
    data_dir = tmp_path_factory.mktemp("owners")
    clock_file = str(data_dir / "lock-clock")
    with LocalCluster(str(data_dir / "cluster"), tablet_servers=2, memory_budget="1mb",
                      lock_clock_file=clock_file) as cluster:
        yield cluster, SkewedClock(clock_file)


def run_machine(owners_cluster, **options):
    OwnersMachine.cluster, OwnersMachine.clock = owners_cluster
    OwnersMachine.TestCase.settings = settings(
        deadline=None, suppress_health_check=list(HealthCheck), **options)
    OwnersMachine.TestCase().runTest()


def test_owners_fixed_seed_share(owners_cluster):
    run_machine(owners_cluster, max_examples=20, stateful_step_count=50, derandomize=True)


@pytest.mark.slow
@pytest.mark.skipif(os.environ.get("TALLY_SLOW_TESTS") != "1",
                    reason="many examples: set TALLY_SLOW_TESTS=1")
def test_owners_many_examples(owners_cluster):
    run_machine(owners_cluster, max_examples=200, stateful_step_count=40)

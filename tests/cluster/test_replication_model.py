"""Replication against a model: writes, lock owners and server failures on a 3-server cluster.

A hypothesis state machine drives one aggregate table (3 buckets, 3 copies each, min.insync 2)
on a real LocalCluster (embedded metadata, a 3 s session so failovers take seconds): partial
and full upserts of SUM, MAX and LAST_VALUE columns and deletes through the client's upsert
writer; a lock owner of a fourth column that writes, commits, crashes (its lease expires by the
shared lock clock, without sleeping) and is undone by its recovery; kill -9 of any server, alone
or in the middle of a write; restarts; a SIGSTOP past the server's session, then SIGCONT; and
wiping a dead server's disk (it returns with a new identity and is filled again by
re-replication).

The model is the table's rows. Every write is retried by the client with the same writer
sequence until it is acknowledged, so it must be there exactly once; a write that still fails
may or may not be applied (per bucket), and the read after it decides, within those two. After
every step the table read through the client equals the model; whenever every server is up,
every bucket is fully in sync and every copy holds the same rows and changelog as its leader,
with rows equal to the replay of its changelog. A crashed owner's uncommitted writes are gone
after its recovery, its committed ones stay.

The default run replays a fixed-seed share, 12 examples of 12 steps (about 5 minutes on a
quiet 2-core machine), and checks it reached every kind of failure;
TALLY_SLOW_TESTS=1 adds 40 random examples of 20 steps (about half an hour).
"""

from __future__ import annotations

import collections
import dataclasses
import os
import shutil
import signal
import threading

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, Phase, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import (RuleBasedStateMachine, initialize, invariant, precondition,
                                 rule)

import recovery
import tally
from tally.errors import InvalidInputError, TallyError
from tally.server import LocalCluster
from tally.server.clock import SkewedClock
from tally.wire.channel import FlightChannel
from tests.cluster.replica_checks import copies_of, replica_rows_equal, wait_fully_in_sync
from tests.waiting import wait_until

BUCKETS = 3
KEYS = 7
TTL = 1000.0            # the owner's lease, in seconds of the lock clock
OWNER_COLUMNS = ["k", "o"]
PLAIN = {"sum": ["k", "s"], "max": ["k", "m"], "last": ["k", "l"], "full": ["k", "s", "m", "l"]}
COLUMNS = ("s", "m", "l", "o")
STEPS_SEEN: collections.Counter = collections.Counter()   # which kinds of step a run reached


def note(what: str) -> None:
    STEPS_SEEN[what] += 1
    event(what)


@dataclasses.dataclass
class Owner:
    """The model of the lock owner of column `o`."""

    state: str = "down"           # down (no lock) | running | crashed (lock expired, unrecovered)
    conn: object = None
    lease: object = None
    attempt: int | None = None
    epoch: int = 0
    touched: set = dataclasses.field(default_factory=set)  # keys written since the baseline
    baseline: dict = dataclasses.field(default_factory=dict)  # {k: o} at the baseline


def merged(row: dict | None, columns: list[str], value: int, tag: str) -> dict:
    """The row after one aggregate write of `value` (and `tag`) to `columns`."""
    row = dict(row) if row else {c: None for c in COLUMNS}
    for c in columns:
        if c in ("s", "o"):
            row[c] = (row[c] or 0) + value
        elif c == "m":
            row[c] = value if row[c] is None else max(row[c], value)
        elif c == "l":
            row[c] = tag
    return row


class ReplicationMachine(RuleBasedStateMachine):
    cluster: LocalCluster = None
    clock: SkewedClock = None
    tables = iter(range(10**9))

    def __init__(self):
        super().__init__()
        self.conn = tally.connect(self.cluster.url, retry_timeout=180)
        self.name = f"default.rmodel_{next(self.tables)}"
        self.rows: dict[int, dict] = {}
        self.owner = Owner()
        self.ambiguous: list[tuple[dict, dict]] = []   # (rows if not applied, rows if applied)
        self.steps = 0
        self.up = set(range(len(self.cluster.tablet_servers)))

    @initialize()
    def create_table(self):
        restore_servers(self.cluster)
        schema = (tally.Schema.builder().column("k", pa.int64())
                  .agg_column("s", pa.int64(), tally.AggFunction.SUM)
                  .agg_column("m", pa.int64(), tally.AggFunction.MAX)
                  .agg_column("l", pa.string(), tally.AggFunction.LAST_VALUE)
                  .agg_column("o", pa.int64(), tally.AggFunction.SUM)
                  .primary_key("k").build())
        self.conn.admin.create_table(self.name, tally.TableDescriptor(
            schema, bucket_count=BUCKETS, properties={"table.merge-engine": "aggregation",
                                                      "table.delete.behavior": "allow",
                                                      "table.replication.factor": "3"}))
        self.table = self.conn.table(self.name)

    def teardown(self):
        if self.owner.state == "crashed" and hasattr(self, "table"):
            # an example that ends with its owner crashed is recovered here, so every crash
            # is followed by an undo that the model checks, whatever the example's length
            restore_servers(self.cluster)
            self.up = set(range(len(self.cluster.tablet_servers)))
            self.owner_start()
            self.table_equals_model()
        if self.owner.conn is not None:
            self.owner.conn.close()
        restore_servers(self.cluster)
        try:
            self.conn.admin.drop_table(self.name, ignore_if_not_exists=True)
        finally:
            self.conn.close()

    # --- helpers ---------------------------------------------------------------------------

    def running(self) -> list[int]:
        """Servers up in the model (the rules' choices never depend on the processes, so a
        replayed example draws the same steps)."""
        return sorted(self.up)

    def dead(self) -> list[int]:
        return sorted(set(range(len(self.cluster.tablet_servers))) - self.up)

    def settle(self) -> None:
        """Until every bucket is led by a running server and every running copy is in sync,
        so that losing any one server leaves each bucket an in-sync copy to lead it."""
        live = {self.cluster.tablet_servers[i].info["server_id"] for i in self.running()}

        def settled():
            replicas = self.conn.admin.bucket_replicas(self.name)
            return all(r["leader"] in live and set(r["replicas"]) & live <= set(r["isr"])
                       for r in replicas.values())

        wait_until(settled, f"every running copy of {self.name} in sync")

    def send(self, table, columns, op: str, keys: list[int], value: int, tag: str,
             lease=None, attempt=None) -> bool:
        """One write through the upsert writer; whether it was acknowledged. A failed one is
        kept as ambiguous for the next read to decide."""
        before = {k: self.rows.get(k) for k in keys}
        after = {}
        for k in keys:
            if op == "delete":
                after[k] = None
            else:
                after[k] = merged(self.rows.get(k), columns[1:], value, tag)
        data = {"k": pa.array(keys, pa.int64())}
        for c in (columns or ["k"])[1:]:
            data[c] = pa.array([tag if c == "l" else value] * len(keys),
                               pa.string() if c == "l" else pa.int64())
        try:
            with table.upsert_writer(target_columns=columns, lease=lease, attempt=attempt) as w:
                if op == "delete":
                    w.delete(pa.table({"k": data["k"]}))
                else:
                    w.upsert(pa.table(data))
        except TallyError as e:
            note(f"write failed: {type(e).__name__}")
            self.ambiguous.append((before, after))
            return False
        for k, row in after.items():
            self.set_row(k, row)
        return True

    def set_row(self, k: int, row: dict | None) -> None:
        if row is None:
            self.rows.pop(k, None)
        else:
            self.rows[k] = row

    def read(self) -> dict[int, dict]:
        return {r["k"]: {c: r[c] for c in COLUMNS} for r in self.table.to_arrow().to_pylist()}

    # --- plain writes ----------------------------------------------------------------------

    @precondition(lambda self: len(self.running()) >= 2)
    @rule(kind=st.sampled_from(sorted(PLAIN) + ["delete"]),
          keys=st.sets(st.integers(0, KEYS - 1), min_size=1, max_size=4),
          value=st.integers(1, 1000))
    def write(self, kind, keys, value):
        if kind == "delete" and self.owner.state != "down":
            kind = "sum"  # a delete would take the owner's column with it: not while it holds it
        self.steps += 1
        note(f"write {kind}")
        if kind == "delete":
            self.send(self.table, None, "delete", sorted(keys), value, "")
        else:
            self.send(self.table, PLAIN[kind], "put", sorted(keys), value, f"t{self.steps}")

    @precondition(lambda self: len(self.running()) == 3)
    @rule(data=st.data(), keys=st.sets(st.integers(0, KEYS - 1), min_size=2, max_size=5),
          value=st.integers(1, 1000))
    def kill_during_write(self, data, keys, value):
        """kill -9 of a server while a write is in flight: the client retries it on the new
        leader with the same writer sequence, so it lands exactly once."""
        self.settle()
        victim = data.draw(st.sampled_from(self.running()), label="victim")
        self.steps += 1
        outcome = {}
        thread = threading.Thread(target=lambda: outcome.setdefault(
            "ok", self.send(self.table, PLAIN["full"], "put", sorted(keys), value,
                            f"t{self.steps}")))
        thread.start()
        self.cluster.kill_tablet_server(victim)
        self.up.discard(victim)
        thread.join(timeout=600)
        assert not thread.is_alive(), "a write hung past every retry"
        note("kill during a write")

    # --- the lock owner ----------------------------------------------------------------------

    @precondition(lambda self: self.owner.state != "running" and len(self.running()) >= 2)
    @rule()
    def owner_start(self):
        """Acquire the lock of column o; after a crash, recovery undoes what the crashed run
        wrote since its last commit."""
        owner = self.owner
        owner.conn = tally.connect(self.cluster.url, retry_timeout=180)
        owner.lease = recovery.acquire(owner.conn, self.name, "owner-o", ["o"], ttl=TTL)
        if owner.state == "crashed":
            note("owner recovered")
            recovery.recover(owner.conn, self.name, owner.lease, OWNER_COLUMNS,
                             skip_idempotent=False)
            self.undo()
        else:
            note("owner started")
        owner.attempt = max(owner.conn.locks.register_attempt(owner.lease, b)
                            for b in range(BUCKETS))
        owner.state = "running"
        self.set_baseline()

    def set_baseline(self) -> None:
        self.owner.touched = set()
        self.owner.baseline = {k: row["o"] for k, row in self.rows.items()}

    def undo(self) -> None:
        """The model of an undo: column o of every key written since the baseline goes back
        to its baseline value; a row that then holds nothing is gone."""
        for k in self.owner.touched:
            row = self.rows.get(k)
            if row is None:
                continue
            row = dict(row, o=self.owner.baseline.get(k))
            self.set_row(k, row if any(row[c] is not None for c in COLUMNS) else None)
        self.owner.touched = set()

    @precondition(lambda self: self.owner.state == "running" and len(self.running()) >= 2)
    @rule(keys=st.sets(st.integers(0, KEYS - 1), min_size=1, max_size=4),
          value=st.integers(1, 1000))
    def owner_write(self, keys, value):
        owner = self.owner
        if not owner.touched:
            owner.conn.locks.epoch_baseline(owner.lease, owner.epoch)
        owner.touched |= set(keys)
        self.send(owner.conn.table(self.name), OWNER_COLUMNS, "put", sorted(keys), value, "",
                  lease=owner.lease, attempt=owner.attempt)

    @precondition(lambda self: self.owner.state == "running" and len(self.running()) >= 2)
    @rule()
    def owner_commit(self):
        owner = self.owner
        self.resolve()  # the offsets committed must cover what the model holds
        assert owner.conn.locks.commit(owner.lease, owner.epoch,
                                       self.conn.admin.list_offsets(self.name)) is True
        owner.epoch += 1
        self.set_baseline()
        note("owner committed")

    @precondition(lambda self: self.owner.state == "running" and not self.owner.touched)
    @rule()
    def owner_release(self):
        """A clean stop between epochs: the lock is gone, so whole rows may be deleted."""
        owner = self.owner
        assert owner.conn.locks.release(owner.lease) is True
        owner.conn.close()
        owner.conn, owner.lease, owner.attempt, owner.state = None, None, None, "down"
        note("owner released")

    @precondition(lambda self: self.owner.state == "running")
    @rule()
    def owner_crash(self):
        """The owner's process dies: no more renewals, and the lock clock moves past its
        lease, so the lock is expired and unrecovered."""
        owner = self.owner
        owner.conn.close()
        owner.conn, owner.lease, owner.attempt = None, None, None
        self.clock.advance(2 * TTL)
        owner.state = "crashed"
        note("owner crashed")

    # --- server failures -------------------------------------------------------------------

    @precondition(lambda self: len(self.running()) >= 2)
    @rule(data=st.data())
    def kill(self, data):
        self.settle()
        victim = data.draw(st.sampled_from(self.running()), label="victim")
        self.cluster.kill_tablet_server(victim)
        self.up.discard(victim)
        note("kill -9")

    @precondition(lambda self: self.dead())
    @rule(data=st.data())
    def restart(self, data):
        index = data.draw(st.sampled_from(self.dead()), label="dead")
        self.cluster.start_tablet_server(index)
        self.up.add(index)
        note("restart")

    @precondition(lambda self: len(self.running()) >= 2)
    @rule(data=st.data())
    def pause_past_session(self, data):
        """SIGSTOP a server until the coordinator counts it gone (and elects new leaders for
        what it led), then SIGCONT: it finds itself deposed and follows again."""
        self.settle()
        index = data.draw(st.sampled_from(self.running()), label="paused")
        handle = self.cluster.tablet_servers[index]
        server_id = handle.info["server_id"]
        os.kill(handle.proc.pid, signal.SIGSTOP)
        try:
            wait_until(lambda: not server_live(self.cluster, server_id),
                       f"the coordinator counting {server_id} gone")
            wait_until(lambda: all(r["leader"] != server_id for r in
                                   self.conn.admin.bucket_replicas(self.name).values()),
                       "new leaders for the paused server's buckets")
        finally:
            os.kill(handle.proc.pid, signal.SIGCONT)
        note("SIGSTOP past the session")

    @precondition(lambda self: len(self.running()) >= 2)
    @rule(data=st.data())
    def move_leader(self, data):
        """Hand a bucket's leadership to another live in-sync replica (the admin's move)."""
        bucket = data.draw(st.integers(0, BUCKETS - 1), label="bucket")
        r = self.conn.admin.bucket_replicas(self.name)[(None, bucket)]
        live = {self.cluster.tablet_servers[i].info["server_id"] for i in self.running()}
        candidates = sorted(s for s in r["isr"] if s in live and s != r["leader"])
        if not candidates or r["leader"] is None:
            return
        target = data.draw(st.sampled_from(candidates), label="new leader")
        try:
            moved = self.conn.admin.move_leader(self.name, bucket, to=target)
        except InvalidInputError:
            return  # it left the in-sync set meanwhile: nothing changed
        assert moved["leader"] == target
        note("leader moved")

    @precondition(lambda self: len(self.running()) == 3)
    @rule(data=st.data())
    def wipe(self, data):
        """Kill a server and delete its disk while the other two hold every acknowledged
        write: it returns with a new identity and re-replication fills it."""
        wait_fully_in_sync(self.conn, self.name, self.cluster)
        index = data.draw(st.sampled_from(self.running()), label="wiped")
        handle = self.cluster.tablet_servers[index]
        old = handle.info["server_id"]
        self.cluster.kill_tablet_server(index)
        shutil.rmtree(handle.data_dir)
        self.cluster.start_tablet_server(index)
        assert handle.info["server_id"] != old
        note("disk wiped")

    # --- checks ----------------------------------------------------------------------------

    def resolve(self) -> dict[int, dict]:
        """Read the table; every ambiguous write is decided per key by what is there."""
        found = self.read()
        for before, after in self.ambiguous:
            for k in before:
                assert found.get(k) in (self.rows.get(k), after[k]), \
                    (k, found.get(k), self.rows.get(k), after[k])
                self.set_row(k, found.get(k))
        self.ambiguous = []
        return found

    @invariant()
    def table_equals_model(self):
        if not hasattr(self, "table"):
            return
        found = self.resolve()
        assert found == self.rows

    @invariant()
    def copies_equal_when_all_up(self):
        if not hasattr(self, "table") or len(self.running()) < 3:
            return
        wait_fully_in_sync(self.conn, self.name, self.cluster)
        table_id = self.table.table_id
        for bucket in range(BUCKETS):
            copies = copies_of(self.cluster, table_id, 0, bucket, conn=self.conn,
                               name=self.name)
            assert len(copies) == 3
            replica_rows_equal(self.cluster, self.conn, self.name, bucket, copies)


def server_live(cluster: LocalCluster, server_id: str) -> bool:
    channel = FlightChannel(cluster.url, cluster.cluster_token, timeout=10, tls=cluster.tls)
    try:
        return any(s["server_id"] == server_id and s["live"]
                   for s in channel.action("list_servers"))
    finally:
        channel.close()


def restore_servers(cluster: LocalCluster) -> None:
    """Every tablet server running (an example starts and ends with all three up)."""
    for i, handle in enumerate(cluster.tablet_servers):
        if not handle.running:
            cluster.start_tablet_server(i)


@pytest.fixture(scope="module")
def replicated(tmp_path_factory):
    data_dir = tmp_path_factory.mktemp("rmodel")
    clock_file = str(data_dir / "lock-clock")
    with LocalCluster(str(data_dir / "cluster"), tablet_servers=3, session_timeout=3.0,
                      replica_replace_after=4.0, lock_clock_file=clock_file) as cluster:
        yield cluster, SkewedClock(clock_file)


def run_machine(replicated, **options):
    ReplicationMachine.cluster, ReplicationMachine.clock = replicated
    ReplicationMachine.TestCase.settings = settings(
        deadline=None, suppress_health_check=list(HealthCheck),
        phases=[Phase.explicit, Phase.generate], **options)  # no shrinking: steps take seconds
    ReplicationMachine.TestCase().runTest()


def test_replication_fixed_seed_share(replicated):
    STEPS_SEEN.clear()
    run_machine(replicated, max_examples=12, stateful_step_count=12, derandomize=True)
    print(dict(STEPS_SEEN))
    # the share must reach every kind of failure, or it would pass without testing them
    assert {"kill -9", "kill during a write", "restart", "SIGSTOP past the session", "leader moved",
            "disk wiped", "owner crashed", "owner recovered",
            "owner committed"} <= set(STEPS_SEEN), dict(STEPS_SEEN)


@pytest.mark.slow
@pytest.mark.skipif(os.environ.get("TALLY_SLOW_TESTS") != "1",
                    reason="many examples: set TALLY_SLOW_TESTS=1")
def test_replication_many_examples(replicated):
    run_machine(replicated, max_examples=40, stateful_step_count=20)

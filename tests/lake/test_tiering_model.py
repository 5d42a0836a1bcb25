"""Tiering against a model: the lake shows committed epochs only, each change exactly once.

A hypothesis state machine drives one partitioned aggregate table on a real cluster with a
lake root: lock-free writes of a last-value column and a list column (to rows of two
partitions), deletes, a lock owner that writes epochs of a sum column, commits them, crashes
(its uncommitted writes are undone by its restart) and releases, and tiering rounds run by an
in-process tiering service, interleaved. After every round:

- the Delta table equals the plain-Python replay of the table's changelog up to the lake's
  offsets (each key's last image, a delete removing it): every change is in the lake once, at
  the offsets the lake's commit names, none above them;
- the lake's offsets never pass the table's end offsets, and the owner's sum column equals the
  one the owner had at one of its commits, never an older one than the lake showed before: an
  uncommitted epoch (which a crash would undo) never reaches the lake;
- the Delta history is a chain: each Tally commit starts at the offsets the one before ended.

At the end the owner commits and releases; once the lake caught up it equals the live table.
The default run replays a fixed-seed share; TALLY_SLOW_TESTS=1 runs many random examples.
"""

from __future__ import annotations

import collections
import os

import deltalake
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, precondition, rule

import recovery
from merge_engine import Schema, TableDescriptor
from tally import client
from tally.lake import TierService
from tally.lake.delta_table import DeltaLakeTable
from tests.waiting import wait_until

PARTITIONS = ("east", "west")
KEYS = 4
OWNER = "owner-a"
SEEN: collections.Counter = collections.Counter()  # what the examples did, checked at the end


def lake_rows(path: str) -> dict:
    rows = deltalake.DeltaTable(path).to_pyarrow_table().to_pylist()
    return {(r["p"], r["k"]): r for r in rows}


class TieringMachine(RuleBasedStateMachine):
    cluster = None
    tables = iter(range(10**9))

    def __init__(self):
        super().__init__()
        self.conn = client.connect(self.cluster.url, retry_timeout=60)
        self.name = f"default.tiered_{next(self.tables)}_{os.getpid()}"
        self.service = TierService(self.conn, tier_id=f"model-{os.getpid()}")
        self.owner_conn = self.lease = self.attempt = None
        self.state = "down"                 # down | running | crashed
        self.committed: dict = {}           # {(p, k): a} of the owner's committed epochs
        self.pending: dict = {}             # {(p, k): a} written since its last commit
        self.history = [{}]                 # the committed sums after each commit (and delete)
        self.shown = 0                      # the newest history entry the lake showed
        self.epoch = 0
        self.rounds = 0

    @initialize()
    def create_table(self):
        schema = (Schema.builder().column("p", pa.string()).column("k", pa.int64())
                  .agg_column("a", pa.int64(), "sum")
                  .agg_column("b", pa.int64(), "last_value")
                  .agg_column("c", pa.list_(pa.string()), "array_agg")
                  .primary_key("p", "k").partition_key("p").build())
        self.conn.admin.create_table(self.name, TableDescriptor(schema, bucket_count=2, properties={
            "table.merge-engine": "aggregation", "table.delete.behavior": "allow",
            "table.partition.dynamic-creation.enabled": "true",
            "table.datalake.enabled": "true"}))
        self.table = self.conn.table(self.name)

    def teardown(self):
        try:
            if self.state == "crashed":
                self.start_owner()
            if self.state == "running":
                self.commit()
                self.owner_conn.locks.release(self.lease)
                self.owner_conn.close()
                self.state = "down"
            ends = self.conn.admin.list_offsets(self.name)
            self.catch_up(ends)
            live = {(r["p"], r["k"]): r for r in self.table.to_arrow().to_pylist()}
            assert lake_rows(self.path) == live
            assert {key: r["a"] for key, r in live.items() if r["a"] is not None} == \
                {key: a for key, a in self.committed.items() if a}
            event(f"rounds: {min(self.rounds, 5)}{'+' if self.rounds >= 5 else ''}")
        finally:
            self.conn.admin.drop_table(self.name, purge_lake=True)
            self.conn.close()

    # --- helpers -------------------------------------------------------------------------------

    @property
    def path(self) -> str:
        return self.service.holdings[self.table.table_id].assignment.path

    def holding(self):
        def found():
            self.service.heartbeat()
            return self.service.holdings.get(self.table.table_id)
        return wait_until(found, "the tiering service holding the table", deadline=60)

    def round(self):
        holding = self.holding()
        self.service.run_one(holding)
        assert holding.failures == 0, self.conn.admin.lake_status(self.name).error
        self.rounds += 1

    def catch_up(self, ends: dict) -> None:
        def caught_up():
            self.round()
            snapshot = self.conn.admin.lake_snapshot(self.name)
            return snapshot is not None and all(snapshot.offsets.get(key, 0) >= end
                                                for key, end in ends.items())
        wait_until(caught_up, "the lake catching up with the table", deadline=120)
        self.check_lake()

    def replay(self, offsets: dict) -> dict:
        """The table's rows at `offsets`, replayed from its changelog in plain Python."""
        rows = {}
        for (partition, bucket), end in offsets.items():
            records = self.table.changelog(bucket, 0, end, partition=partition).to_pylist()
            for record in sorted(records, key=lambda r: r["_offset"]):
                key = (record["p"], record["k"])
                if record["_change_type"] in ("+I", "+U"):
                    rows[key] = {c: record[c] for c in ("p", "k", "a", "b", "c")}
                elif record["_change_type"] == "-D":
                    rows.pop(key, None)
        return rows

    def check_lake(self) -> None:
        snapshot = self.conn.admin.lake_snapshot(self.name)
        if snapshot is None:
            return
        lake = DeltaLakeTable(snapshot.path, self.table.table_id, ["p", "k"], ["p"]).load()
        assert lake.version == snapshot.version or lake.version > snapshot.version
        offsets = lake.offsets()
        ends = self.conn.admin.list_offsets(self.name)
        assert all(offsets.get(key, 0) <= end for key, end in ends.items())
        rows = lake_rows(snapshot.path)
        assert rows == self.replay({key: offsets.get(key, 0) for key in ends})
        sums = {key: r["a"] for key, r in rows.items() if r["a"] is not None}
        matches = [i for i, h in enumerate(self.history) if h == sums]
        assert matches and max(matches) >= self.shown, \
            f"the lake shows sums {sums}, which no commit since #{self.shown} had: {self.history}"
        self.shown = max(matches)
        chain = lake.history()
        for before, after in zip(chain, chain[1:]):
            assert after.start == before.offsets, (before, after)

    def remember_commit(self) -> None:
        self.history.append({key: a for key, a in self.committed.items() if a})

    # --- rules ---------------------------------------------------------------------------------

    @rule(p=st.sampled_from(PARTITIONS), k=st.integers(0, KEYS - 1), b=st.integers(0, 99),
          tag=st.sampled_from(["x", "y", None]))
    def free_write(self, p, k, b, tag):
        with self.table.upsert_writer(target_columns=["p", "k", "b", "c"]) as w:
            w.upsert([{"p": p, "k": k, "b": b, "c": None if tag is None else [tag]}])

    @precondition(lambda self: self.state == "down")
    @rule(p=st.sampled_from(PARTITIONS), k=st.integers(0, KEYS - 1))
    def delete(self, p, k):
        with self.table.upsert_writer() as w:
            w.delete([{"p": p, "k": k}])
        if self.committed.pop((p, k), None):
            self.remember_commit()

    @precondition(lambda self: self.state != "running")
    @rule()
    def start_owner(self):
        """(Re)start the owner: acquire (its tenure goes on after a crash) and undo what it
        wrote since its last commit."""
        self.owner_conn = client.connect(self.cluster.url, retry_timeout=60)
        self.lease = recovery.acquire(self.owner_conn, self.name, OWNER, ["a"], ttl=600)
        recovery.recover(self.owner_conn, self.name, self.lease, ["p", "k", "a"],
                         skip_idempotent=False)
        # a restarted task registers a new attempt: its predecessor may no longer write
        self.attempt = max(self.owner_conn.locks.register_attempt(self.lease, b)
                           for b in (0, 1))
        if self.state == "crashed":
            event("owner restarted after a crash")
            SEEN["restart"] += 1
        self.pending, self.state = {}, "running"

    @precondition(lambda self: self.state == "running")
    @rule(keys=st.lists(st.tuples(st.sampled_from(PARTITIONS), st.integers(0, KEYS - 1)),
                        min_size=1, max_size=3, unique=True), amount=st.integers(1, 9))
    def owner_write(self, keys, amount):
        if not self.pending:
            self.owner_conn.locks.epoch_baseline(self.lease, self.epoch)
        with self.table.upsert_writer(target_columns=["p", "k", "a"], lease=self.lease,
                                      attempt=self.attempt) as w:
            w.upsert([{"p": p, "k": k, "a": amount} for p, k in keys])
        for key in keys:
            self.pending[key] = self.pending.get(key, 0) + amount

    @precondition(lambda self: self.state == "running")
    @rule()
    def commit(self):
        self.owner_conn.locks.commit(self.lease, self.epoch,
                                     self.conn.admin.list_offsets(self.name))
        self.epoch += 1
        for key, amount in self.pending.items():
            self.committed[key] = self.committed.get(key, 0) + amount
        self.pending = {}
        self.remember_commit()

    @precondition(lambda self: self.state == "running")
    @rule()
    def crash_owner(self):
        """The owner's process dies with its epoch half written: its lock stays."""
        self.owner_conn.close()
        self.owner_conn, self.lease, self.state = None, None, "crashed"
        if self.pending:
            event("owner crashed with uncommitted writes")
            SEEN["crash with uncommitted writes"] += 1

    @precondition(lambda self: self.state == "running" and self.pending)
    @rule()
    def crash_mid_epoch(self):
        """The case the guarantee is about, drawn on its own so every share reaches it."""
        self.crash_owner()

    @precondition(lambda self: self.state == "running" and not self.pending)
    @rule()
    def release(self):
        self.owner_conn.locks.release(self.lease)
        self.owner_conn.close()
        self.owner_conn, self.lease, self.state = None, None, "down"

    @precondition(lambda self: self.pending)
    @rule()
    def tier_round_mid_epoch(self):
        self.tier_round()

    @rule()
    def tier_round(self):
        self.round()
        self.check_lake()
        if self.pending:
            event("a round while an epoch is uncommitted")
            SEEN["uncommitted round"] += 1


def run_machine(cluster, **options) -> None:
    TieringMachine.cluster = cluster
    TieringMachine.TestCase.settings = settings(
        deadline=None, suppress_health_check=list(HealthCheck), **options)
    TieringMachine.TestCase().runTest()


def test_tiering_fixed_seed_share(lake_cluster):
    # no example database: the suite's other state machines share its key
    run_machine(lake_cluster, max_examples=10, stateful_step_count=30, derandomize=True,
                database=None)


def test_tiering_walks_the_cases_the_guarantee_is_about(lake_cluster):
    """The cases a drawn share may miss (it did, in full runs), walked in order: a round while
    an epoch is uncommitted, a crash with uncommitted writes, the restart's undo, then rounds
    that must show the committed sums only. Each step checks the lake as the machine does."""
    TieringMachine.cluster = lake_cluster

    @settings(max_examples=1, database=None, deadline=None,
              suppress_health_check=list(HealthCheck))
    @given(st.none())
    def walk(_):
        SEEN.clear()
        machine = TieringMachine()
        try:
            machine.create_table()
            machine.start_owner()
            machine.owner_write([("east", 0), ("west", 1)], 3)
            machine.commit()
            machine.tier_round()
            machine.owner_write([("east", 0), ("east", 2)], 5)
            machine.free_write("west", 1, 7, "x")
            machine.tier_round_mid_epoch()
            machine.crash_mid_epoch()
            machine.tier_round()          # the crashed epoch is still uncommitted
            machine.start_owner()
            machine.tier_round()
            machine.owner_write([("west", 3)], 2)
            machine.commit()
        finally:
            machine.teardown()
        assert SEEN == {"uncommitted round": 2, "crash with uncommitted writes": 1,
                        "restart": 1}, SEEN

    walk()


@pytest.mark.skipif(os.environ.get("TALLY_SLOW_TESTS") != "1",
                    reason="many examples: set TALLY_SLOW_TESTS=1")
def test_tiering_many_examples(lake_cluster):
    run_machine(lake_cluster, max_examples=200, stateful_step_count=40)

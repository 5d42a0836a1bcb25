"""The workloads a fault trial runs while faults come and go, each on its own thread and
connection, each recording what it saw for the oracle (tests/faults/oracle.py).

The table: key `k`, and four sums: `free`, `free_n` (the lock-free writer's value and count)
and `locked`, `locked_n` (the column-lock owners').

- `LockFreeWriter`: a write adds its own distinct value and 1 to four random keys; recorded as
  acknowledged, refused or ambiguous.
- `Reader`: point lookups of random keys and, every twentieth read, a scan of the table, each
  key checked against what was acknowledged before the read began.
- `LeaderWatcher`: `bucket_replicas` over and over, for the one-leader-per-epoch check.
- `LockOwners`: two owners, A and B, writing epochs the way the Spark sink does under a column
  lock on (`locked`, `locked_n`): begin the epoch (a new task attempt, the baseline), write it in
  two flushes, commit. Any error is a crash: the owner's connection is dropped without a
  release, and the owner restarts (re-acquire, recover: its uncommitted epoch undone) and
  replays. `crash()` makes it crash between its two flushes on purpose; `take_over()` crashes
  it, moves the lock clock past its ttl and lets the other owner take the lock over
  (`recovery.acquire`: the expired tenure undone first).
"""

from __future__ import annotations

import itertools
import random
import threading

import pyarrow as pa

import recovery
from merge_engine import Schema, TableDescriptor
from tally import client
from tally.errors import (ColumnLockConflict, InvalidInputError, LeaseLostError,
                          PermissionDeniedError, StorageWriteError, TallyError)
from tests.faults.oracle import ACKED, AMBIGUOUS, REFUSED, EpochWatch, History, ReadWatch, \
    epoch_rows

KEYS = 40
BUCKETS = 3
RETRY_S = 20.0          # a write's retry budget: long faults make ambiguous writes
LOCK_TTL = 30.0         # seconds of the lock clock
LOCKED = ("locked", "locked_n")
# Errors raised before anything of the write was applied.
REFUSALS = (ColumnLockConflict, LeaseLostError, PermissionDeniedError, InvalidInputError,
            StorageWriteError)


def descriptor() -> TableDescriptor:
    schema = (Schema.builder().column("k", pa.int64())
              .agg_column("free", pa.int64(), "sum").agg_column("free_n", pa.int64(), "sum")
              .agg_column("locked", pa.int64(), "sum").agg_column("locked_n", pa.int64(), "sum")
              .primary_key("k").build())
    return TableDescriptor(schema, bucket_count=BUCKETS,
                           properties={"table.merge-engine": "aggregation"})


class Worker(threading.Thread):
    """A daemon thread with a stop flag and the first unexpected exception it met."""

    def __init__(self, name: str) -> None:
        super().__init__(name=name, daemon=True)
        self.stopping = threading.Event()
        self.failure: BaseException | None = None

    def run(self) -> None:
        try:
            self.work()
        except BaseException as e:  # noqa: BLE001 - reported by stop()
            self.failure = e

    def work(self) -> None:
        raise NotImplementedError

    def stop(self, timeout: float = 180.0) -> None:
        self.stopping.set()
        self.join(timeout)
        assert not self.is_alive(), f"{self.name} did not stop within {timeout:.0f}s"
        if self.failure is not None:
            raise self.failure


class LockFreeWriter(Worker):
    def __init__(self, url: str, table: str, history: History, seed: int) -> None:
        super().__init__("lock-free writer")
        self.url, self.table, self.history = url, table, history
        self.rng = random.Random(seed)

    def work(self) -> None:
        with client.connect(self.url, retry_timeout=RETRY_S) as conn:
            table = conn.table(self.table)
            writer = None
            while not self.stopping.is_set():
                if writer is None:
                    # not atomic: the oracle asks that reads never go back, and an atomic
                    # flush refused in one bucket takes back the parts other buckets applied
                    # (and readers saw); that undo is tested on its own
                    writer = table.upsert_writer(target_columns=["k", "free", "free_n"],
                                                 atomic=False)
                keys = self.rng.sample(range(KEYS), 4)
                write = self.history.begin(keys, 0)
                write.value = 1000 + write.id
                try:
                    writer.upsert([{"k": k, "free": write.value, "free_n": 1} for k in keys])
                    writer.flush()
                    self.history.end(write, ACKED)
                except TallyError as e:
                    outcome = REFUSED if isinstance(e, REFUSALS) else AMBIGUOUS
                    self.history.end(write, outcome, f"{type(e).__name__}: {e}")
                    writer.close()
                    writer = None
                self.stopping.wait(0.02)
            if writer is not None:
                writer.close()


class Reader(Worker):
    def __init__(self, url: str, table: str, history: History, watch: ReadWatch,
                 seed: int) -> None:
        super().__init__("reader")
        self.url, self.table, self.history, self.watch = url, table, history, watch
        self.rng = random.Random(seed)
        self.errors = 0

    def work(self) -> None:
        with client.connect(self.url, retry_timeout=5.0) as conn:
            table = conn.table(self.table)
            for n in itertools.count():
                if self.stopping.is_set():
                    return
                if n % 20 == 19:
                    self._scan(table)
                else:
                    self._lookup(table)
                self.stopping.wait(0.02)

    def _lookup(self, table) -> None:
        key = self.rng.randrange(KEYS)
        floor = self.history.floor(key)
        try:
            row = table.lookup({"k": key})
        except TallyError:
            self.errors += 1
        else:
            self.watch.saw(key, None if row is None else (row["free"] or 0, row["free_n"] or 0),
                           floor)

    def _scan(self, table) -> None:
        """A whole-table scan: every key checked as a lookup would be."""
        floors = {k: self.history.floor(k) for k in range(KEYS)}
        try:
            rows = {r["k"]: (r["free"] or 0, r["free_n"] or 0)
                    for r in table.to_arrow().to_pylist()}
        except TallyError:
            self.errors += 1
            return
        for k in range(KEYS):
            self.watch.saw(k, rows.get(k), floors[k])


class LeaderWatcher(Worker):
    def __init__(self, url: str, table: str, watch: EpochWatch) -> None:
        super().__init__("leader watcher")
        self.url, self.table, self.watch = url, table, watch

    def work(self) -> None:
        with client.connect(self.url, retry_timeout=5.0) as conn:
            while not self.stopping.is_set():
                try:
                    self.watch.saw(conn.admin.bucket_replicas(self.table))
                except TallyError:
                    pass
                self.stopping.wait(0.1)


class LockOwners(Worker):
    """Owners A and B of the `locked` columns (see the module docstring)."""

    OWNERS = ("A", "B")

    def __init__(self, url: str, table: str, clock) -> None:
        super().__init__("lock owners")
        self.url, self.table, self.clock = url, table, clock
        self.active = "A"
        self.conn = None
        self.lease = None
        self.epoch = 0
        self.commits = 0        # epochs committed (by either owner)
        self.restarts = 0       # crashes followed by a successful restart
        self.takeovers = 0
        self.errors: list[str] = []
        self._order: str | None = None
        self._lock = threading.Lock()

    def crash(self) -> None:
        with self._lock:
            self._order = "crash"

    def take_over(self) -> None:
        with self._lock:
            self._order = "takeover"

    def _take_order(self) -> str | None:
        with self._lock:
            order, self._order = self._order, None
            return order

    def work(self) -> None:
        while not self.stopping.is_set() or self.lease is None or self._order:
            try:
                if self.lease is None:
                    self._start()
                self._one_epoch()
            except TallyError as e:
                self.errors.append(f"{type(e).__name__}: {e}")
                self._drop()
                self.stopping.wait(0.2)
        self._release()

    def _start(self) -> None:
        self.conn = client.connect(self.url, retry_timeout=RETRY_S)
        key = ["k", *LOCKED]
        self.lease = recovery.acquire(self.conn, self.table, self.active, LOCKED, ttl=LOCK_TTL)
        recovery.recover(self.conn, self.table, self.lease, key, skip_idempotent=False)
        last = self.conn.locks.last_commit(self.table, self.active)
        self.epoch = 0 if last is None else last.epoch + 1

    def _drop(self) -> None:
        """A crash: the connection goes, the lock stays (no release)."""
        if self.conn is not None:
            self.conn.close()
        self.conn, self.lease = None, None

    def _one_epoch(self) -> None:
        conn, lease = self.conn, self.lease
        rows = epoch_rows(self.active, self.epoch, KEYS)
        start = conn.locks.begin_epoch(lease, self.epoch, range(BUCKETS))
        attempt = max(start.attempts.values())
        writer = conn.table(self.table).upsert_writer(target_columns=["k", *LOCKED],
                                                      lease=lease, attempt=attempt)
        try:
            writer.upsert(rows[:len(rows) // 2])
            writer.flush()
            order = self._take_order()
            if order is not None:
                self._crash_on_purpose(order)
                return
            writer.upsert(rows[len(rows) // 2:])
            writer.flush()
        finally:
            writer.close()
        conn.locks.commit(lease, self.epoch, conn.admin.list_offsets(self.table))
        self.epoch += 1
        self.commits += 1
        self.stopping.wait(0.1)

    def _crash_on_purpose(self, order: str) -> None:
        self._drop()
        if order == "takeover":
            # the crashed owner's lock expires; the other owner must undo it to take it
            self.clock.advance(LOCK_TTL * 2)
            self.active = "B" if self.active == "A" else "A"
            self.takeovers += 1
        self.restarts += 1

    def _release(self) -> None:
        if self.lease is not None:
            try:
                self.conn.locks.release(self.lease)
            finally:
                self._drop()

    def committed(self, conn) -> dict[str, int]:
        """{owner: its last committed epoch}, asked of the coordinator."""
        out = {}
        for owner in self.OWNERS:
            last = conn.locks.last_commit(self.table, owner)
            if last is not None:
                out[owner] = last.epoch
        return out

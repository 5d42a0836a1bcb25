"""Lock view versions on both metadata stores (real ZooKeeper, real files): every lock change
gets a newer version, and a store opened again (a coordinator restarted, or another one taking
over) goes on from there, never back."""

from __future__ import annotations

import pyarrow as pa

from locks import ColumnLockService, LockTarget
from merge_engine import Schema
from tally.meta import open_store

SCHEMA = (Schema.builder().column("id", pa.int64()).agg_column("a", pa.int64(), "sum")
          .agg_column("b", pa.int64(), "sum").primary_key("id").build())
TABLE = LockTarget("db.t", 7, SCHEMA)


class Clock:
    def __init__(self):
        self.now = 1_000_000.0

    def __call__(self):
        return self.now


def offsets():
    return {(None, 0): 0}


def test_every_change_gets_a_newer_version_across_reopening(metadata_store, tmp_path):
    clock, seen, fenced = Clock(), [], []

    def opened():
        store = open_store(zookeeper=metadata_store, data_dir=str(tmp_path))
        return store, ColumnLockService(store, clock, on_change=lambda t, f: fenced.append(f))

    store, locks = opened()
    seen.append(locks.view_state(7)[0])
    a = locks.acquire(TABLE, "A", ["a"], 30, offsets)
    seen.append(locks.view_state(7)[0])
    a = locks.renew(a)
    seen.append(locks.view_state(7)[0])
    locks.register_attempts(a, [0, 1])
    seen.append(locks.view_state(7)[0])
    store.close()

    store, locks = opened()  # the next coordinator
    assert locks.view_state(7)[0] == seen[-1]
    b = locks.acquire(TABLE, "B", ["b"], 30, offsets)
    seen.append(locks.view_state(7)[0])
    clock.now += 31
    [taken] = locks.take_over(TABLE, "C", ["a"], 30)
    seen.append(locks.view_state(7)[0])
    assert locks.release(taken)
    seen.append(locks.view_state(7)[0])
    assert locks.discard(TABLE, "B")
    seen.append(locks.view_state(7)[0])
    version, records, tokens = locks.view_state(7)
    store.close()

    assert seen == sorted(set(seen)), f"versions went back or stood still: {seen}"
    assert records == [] and set(tokens.values()) == {b.token, taken.token}
    # only the renewal fences nobody; the attempts fence their buckets
    assert fenced == [True, False, frozenset({0, 1}), True, True, True, True]

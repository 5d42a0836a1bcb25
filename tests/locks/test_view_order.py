"""Lock views in any delivery order: versions only grow, and the newest view always wins.

Lock changes run on the real lock service over a real embedded metadata store; every change's
view (as the coordinator publishes it) is recorded. Hypothesis then delivers any selection of
those views, in any order and with repeats, to a tablet server's view holder: it must hold the
newest one delivered; a write under any lease that view's state superseded is refused, the
lease that state grants is accepted, and a lease granted after it is one the view knows it is
behind on (the server then fetches a fresh view before judging it).
"""

from __future__ import annotations

import tempfile

import pyarrow as pa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from locks import ColumnLockService, LockTarget, view_from_records
from locks.tablet_check import LockViews
from merge_engine import Schema
from tally.errors import (ColumnLockConflict, LeaseLostError, TallyError,
                          UnrecoveredLockError)
from tally.meta import open_store

SCHEMA = (Schema.builder().column("id", pa.int64()).agg_column("a", pa.int64(), "sum")
          .agg_column("b", pa.int64(), "sum").primary_key("id").build())
TABLE = LockTarget("db.t", 7, SCHEMA)
COLUMNS = {"a": {SCHEMA.column("a").id}, "b": {SCHEMA.column("b").id}}
REFUSED = (LeaseLostError, ColumnLockConflict, UnrecoveredLockError)


class Clock:
    def __init__(self):
        self.now = 1_000_000.0

    def __call__(self):
        return self.now


OPS = st.lists(st.tuples(st.sampled_from(["acquire", "renew", "attempt", "expire_and_take",
                                          "release"]),
                         st.sampled_from(["A", "B"]), st.sampled_from(["a", "b"])),
               min_size=1, max_size=12)


def run_changes(ops):
    """[(view, {owner: current lease})] after each change, and every lease ever granted."""
    clock = Clock()
    with tempfile.TemporaryDirectory() as data_dir:
        store = open_store(data_dir=data_dir)
        locks = ColumnLockService(store, clock)

        def view():
            version, records, tokens = locks.view_state(7)
            return view_from_records(7, records, tokens, version)

        held, granted, steps = {}, [], [(view(), {})]
        for op, owner, column in ops:
            try:
                if op == "acquire":
                    held[owner] = locks.acquire(TABLE, owner, [column], 30,
                                                lambda: {(None, 0): 0})
                    granted.append(held[owner])
                elif op == "renew" and owner in held:
                    held[owner] = locks.renew(held[owner])
                elif op == "attempt" and owner in held:
                    locks.register_attempts(held[owner], [0])
                elif op == "expire_and_take":
                    clock.now += 31
                    taker = "B" if owner == "A" else "A"
                    taken = locks.take_over(TABLE, taker, [column], 30)
                    if not taken:
                        continue  # nothing in the way: nothing changed
                    for lease in taken:
                        held[lease.owner_id] = lease
                        granted.append(lease)
                elif op == "release" and owner in held:
                    if not locks.release(held.pop(owner)):
                        continue
                else:
                    continue
            except TallyError:
                continue  # refused (a conflict, a lapsed lease): nothing changed
            steps.append((view(), dict(held)))
        store.close()
    return steps, granted, clock.now


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=OPS, data=st.data())
def test_the_newest_view_wins_in_any_delivery_order(ops, data):
    steps, granted, now = run_changes(ops)
    versions = [v.version for v, _ in steps]
    assert versions == sorted(set(versions)), "every change gets a newer version"
    order = data.draw(st.lists(st.integers(0, len(steps) - 1), min_size=1, max_size=20),
                      label="delivery order")
    views = LockViews()
    for i in order:
        views.offer(steps[i][0])
    newest = max(order)
    view, holders = steps[newest]
    assert views.get(7) is view, "the holder keeps the newest view delivered"
    current = {(lease.owner_id, lease.token) for lease in holders.values()}
    for lease in granted:
        if lease.token > view.newest_token:
            # granted after this view's state: a server fetches a fresh view before judging
            assert view.behind(lease.owner_id, lease.token, 0, None)
            continue
        columns = COLUMNS[lease.columns[0]]
        if (lease.owner_id, lease.token) in current:
            if holders[lease.owner_id].expires_at > now:
                # a takeover's lease writes only as an undo (OVERWRITE)
                view.check_write(columns, lease.owner_id, lease.token, now=now,
                                 secret=holders[lease.owner_id].secret,
                                 overwrite=holders[lease.owner_id].takeover)
            continue
        try:
            view.check_write(columns, lease.owner_id, lease.token, now=now, secret=lease.secret)
        except REFUSED:
            pass
        else:
            raise AssertionError(f"superseded {lease!r} accepted by view {view.version}")


def test_an_older_view_never_replaces_a_newer_one():
    steps, _, _ = run_changes([("acquire", "A", "a"), ("acquire", "A", "a")])
    (first, _), (second, _) = steps[1], steps[2]
    views = LockViews()
    assert views.offer(second) is second
    assert views.offer(first) is second  # arrived late: ignored
    assert views.offer(second) is second

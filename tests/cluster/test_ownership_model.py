"""Two principals interleave acquires, takeovers, commits, releases and consumer commits on one
table (a real secured cluster, its lock clock moved to expire leases): whatever one does, the
other's owner id keeps its last commit and undo baselines, its live lease keeps working, and
its consumer keeps its positions. Only a takeover of an expired lock touches the other's lock,
and only to undo and release it.

A few examples by default; TALLY_SLOW_TESTS=1 runs many more.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, given, settings, strategies as st

from recovery.recover import acquire as take_over_and_acquire
from tally.errors import (ColumnLockConflict, LeaseLostError, PermissionDeniedError,
                          TallyError)
from tests.cluster.test_ownership import make_table, owned  # noqa: F401 - the fixture

PRINCIPALS = ("alice", "bob")
OWNER = {"alice": "A", "bob": "B"}
CONSUMER = {"alice": "alice-reads", "bob": "bob-reads"}
EXAMPLES = 100 if os.environ.get("TALLY_SLOW_TESTS") == "1" else 12

step = st.tuples(st.sampled_from(PRINCIPALS), st.sampled_from(
    ["acquire", "acquire_other", "take_over", "recover", "commit", "release", "expire", "consume",
     "consume_other", "remove_other", "commit_taken"]), st.integers(0, 20))


def other(p: str) -> str:
    return "bob" if p == "alice" else "alice"


def seen_by(conn, table: str, q: str, lease) -> tuple:
    """What q's owner and consumer would read or undo from."""
    positions = [p.positions for p in conn.admin.consumer_positions(table)
                 if p.consumer == CONSUMER[q]]
    baselines = conn.locks.undo_baselines(lease) if lease is not None else None
    return conn.locks.last_commit(table, OWNER[q]), positions, baselines


@settings(max_examples=EXAMPLES, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(steps=st.lists(step, min_size=1, max_size=12))
def test_one_principal_never_changes_what_the_others_owner_reads(owned, steps):
    conns = owned.conns
    table = make_table(conns["boss"])
    leases: dict = {}  # principal -> its live lease (not known expired)
    taken: dict = {}  # principal -> leases it holds by a takeover
    epochs = {p: 0 for p in PRINCIPALS}
    for p in PRINCIPALS:  # each uses its owner id and its consumer first: both are its own
        conns[p].locks.release(conns[p].locks.acquire(table, OWNER[p], ["a"], ttl=60))
        conns[p].admin.commit_consumer(table, CONSUMER[p], [[None, 0, 0]])
    for p, op, n in steps:
        q, conn = other(p), conns[p]
        q_lease = leases.get(q)
        before = seen_by(conns[q], table, q, q_lease)
        try:
            if op == "acquire" and p not in leases:
                leases[p] = conn.locks.acquire(table, OWNER[p], ["a"], ttl=60)
            elif op == "acquire_other":
                try:
                    conn.locks.acquire(table, OWNER[q], ["a"], ttl=60)
                    raise AssertionError(f"{p} acquired {q}'s owner id")
                except PermissionDeniedError:
                    pass
            elif op == "take_over" and p not in leases:
                taken[p] = conn.locks.take_over(table, OWNER[p], ["a"], ttl=60)
                for lease in taken[p]:
                    assert lease.owner_id == OWNER[q] and lease.takeover
            elif op == "commit_taken" and taken.get(p):
                try:
                    conn.locks.commit(taken[p][0], 1000 + n, {(None, 0): n})
                    raise AssertionError(f"{p} committed in {q}'s name by a takeover")
                except PermissionDeniedError:
                    pass
            elif op == "commit" and p in leases:
                epochs[p] += 1
                conn.locks.commit(leases[p], epochs[p], conn.locks.epoch_baseline(
                    leases[p], epochs[p]))
            elif op == "release" and (p in leases or taken.get(p)):
                for lease in taken.pop(p, []):
                    conn.locks.release(lease)
                if p in leases:
                    conn.locks.release(leases.pop(p))
            elif op == "recover" and p not in leases and not taken.get(p):
                # take over (undo, release) whatever expired lock is in the way, then acquire
                leases[p] = take_over_and_acquire(conn, table, OWNER[p], ["a"], ttl=60)
            elif op == "expire":
                owned.clock.advance(120)
                leases.clear()
                taken.clear()
            elif op == "consume":
                conn.admin.commit_consumer(table, CONSUMER[p], [[None, 0, n]])
            elif op in ("consume_other", "remove_other"):
                try:
                    if op == "consume_other":
                        conn.admin.commit_consumer(table, CONSUMER[q], [[None, 0, n]])
                    else:
                        conn.admin.remove_consumer(table, CONSUMER[q])
                    raise AssertionError(f"{p}'s {op} was not refused")
                except PermissionDeniedError:
                    pass
        except (ColumnLockConflict, LeaseLostError):
            pass  # the other's lock is in the way, or this one's lease lapsed: refused
        if op == "expire":
            continue
        try:
            after = seen_by(conns[q], table, q, q_lease)
        except LeaseLostError:
            after = None
        if q_lease is not None:
            assert after is not None, f"{p}'s {op} fenced {q}'s live lease"
            assert after == before, f"{p}'s {op} changed what {q} reads or undoes"
        else:
            assert after is None or after[:2] == before[:2], \
                f"{p}'s {op} changed {q}'s last commit or consumer"
    for p in PRINCIPALS:
        for lease in [*taken.get(p, []), *([leases[p]] if p in leases else [])]:
            try:
                conns[p].locks.release(lease)
            except TallyError:
                pass

"""The lock service and commit log on both metadata stores (real ZooKeeper, real files)."""

import threading

import pyarrow as pa
import pytest

from locks import ColumnLockService, CommitLog, LockTarget, view_from_records
from merge_engine import Schema
from tally.errors import (ColumnLockConflict, InvalidInputError, LeaseLostError,
                          PermissionDeniedError, RecoveryError,
                          TakeoverLeaseError, UnrecoveredLockError)
from tally.meta import open_store


class Clock:
    """The coordinator's clock, moved by hand so expiry is tested without sleeping."""

    def __init__(self):
        self.now = 1_000_000.0

    def __call__(self):
        return self.now


SCHEMA = (
    Schema.builder().column("id", pa.int64()).agg_column("a", pa.int64(), "sum")
    .agg_column("b", pa.int64(), "sum").agg_column("c", pa.string(), "max").primary_key("id").build()
)
TABLE = LockTarget("db.t", 7, SCHEMA)


@pytest.fixture
def store(metadata_store, tmp_path):
    s = open_store(zookeeper=metadata_store, data_dir=str(tmp_path))
    yield s
    s.close()


@pytest.fixture
def clock():
    return Clock()


def offsets(value=5):
    return lambda: {(None, 0): value, (None, 1): value + 1}


def test_conflict_names_holder_columns_and_expiry(store, clock):
    locks = ColumnLockService(store, clock)
    first = locks.acquire(TABLE, "job-1", ["id", "a", "b"], 30, offsets())
    assert first.columns == ("a", "b") and first.initial_offsets == {(None, 0): 5, (None, 1): 6}
    with pytest.raises(ColumnLockConflict, match=r"Columns \['b'\] of table db.t are locked by owner 'job-1'.*30.0s"):
        locks.acquire(TABLE, "job-2", ["b", "c"], 30, offsets())
    other = locks.acquire(TABLE, "job-2", ["c"], 30, offsets(9))  # disjoint: coexists
    assert other.token > first.token
    assert [d["owner_id"] for d in locks.describe(TABLE)] == ["job-1", "job-2"]


def test_only_key_columns_is_an_error(store, clock):
    with pytest.raises(InvalidInputError, match="primary-key"):
        ColumnLockService(store, clock).acquire(TABLE, "o", ["id"], 10, offsets())
    with pytest.raises(InvalidInputError, match="unknown columns"):
        ColumnLockService(store, clock).acquire(TABLE, "o", ["zz"], 10, offsets())


def test_reacquire_keeps_initial_offsets_and_fences_the_old_lease(store, clock):
    locks = ColumnLockService(store, clock)
    old = locks.acquire(TABLE, "job", ["a"], 30, offsets(5))
    new = locks.acquire(TABLE, "job", ["a"], 30, offsets(50))
    assert new.initial_offsets == old.initial_offsets and new.token > old.token
    with pytest.raises(LeaseLostError, match="superseded"):
        locks.renew(old)
    assert locks.release(old) is False  # a dead lease releases nothing
    assert locks.describe(TABLE)[0]["token"] == new.token
    with pytest.raises(ColumnLockConflict, match="already holds a live lock"):
        locks.acquire(TABLE, "job", ["a", "b"], 30, offsets())
    assert locks.release(new) is True and locks.describe(TABLE) == []


def test_expired_lock_blocks_until_taken_over_then_everyone_starts_a_new_tenure(store, clock):
    locks = ColumnLockService(store, clock)
    a = locks.acquire(TABLE, "A", ["a", "b"], 10, offsets(5))
    assert a.tenure == a.token
    clock.now += 5
    a = locks.renew(a)
    clock.now += 9
    assert locks.renew(a).expires_at == clock.now + 10  # renewed in time
    clock.now += 11
    with pytest.raises(LeaseLostError, match="expired"):
        locks.renew(a)
    # Expiry does not end the tenure: its uncommitted writes may still have to be undone.
    with pytest.raises(UnrecoveredLockError, match=r"expired lock of owner 'A' \(tenure"):
        locks.acquire(TABLE, "B", ["b"], 10, offsets(70))
    assert [d["owner_id"] for d in locks.describe(TABLE, include_expired=True)] == ["A"]
    [revived] = locks.take_over(TABLE, "B", ["b"], 10)
    assert (revived.owner_id, revived.tenure, revived.initial_offsets) == ("A", a.tenure, a.initial_offsets)
    assert revived.token > a.token  # the zombie is fenced
    with pytest.raises(ColumnLockConflict, match="locked by owner 'A'"):  # held for the undo
        locks.acquire(TABLE, "B", ["b"], 10, offsets(70))
    assert locks.release(revived) is True
    b = locks.acquire(TABLE, "B", ["b"], 10, offsets(70))
    assert b.initial_offsets == {(None, 0): 70, (None, 1): 71} and b.tenure == b.token > revived.token
    # A's lock is gone, so A starts a new tenure with fresh offsets.
    a2 = locks.acquire(TABLE, "A", ["a"], 10, offsets(80))
    assert a2.initial_offsets[(None, 0)] == 80 and a2.tenure == a2.token


def test_same_owner_continues_its_tenure_after_expiry_but_not_after_release(store, clock):
    locks = ColumnLockService(store, clock)
    first = locks.acquire(TABLE, "job", ["a"], 10, offsets(5))
    clock.now += 60
    again = locks.acquire(TABLE, "job", ["a"], 10, offsets(50))  # a restart after expiry
    assert (again.tenure, again.initial_offsets) == (first.tenure, first.initial_offsets)
    # Other columns while the expired-then-continued lock is live: a conflict; once expired,
    # the old tenure must be recovered or taken over first.
    clock.now += 60
    with pytest.raises(UnrecoveredLockError, match="expired, unrecovered lock"):
        locks.acquire(TABLE, "job", ["a", "b"], 10, offsets(60))
    assert locks.take_over(TABLE, "job", ["a"], 10) == []  # its own tenure: it recovers it
    [own] = locks.take_over(TABLE, "job", ["a", "b"], 10)
    assert own.tenure == first.tenure and locks.release(own)
    fresh = locks.acquire(TABLE, "job", ["a", "b"], 10, offsets(60))
    assert fresh.tenure == fresh.token and fresh.initial_offsets[(None, 0)] == 60


def test_discard_drops_only_expired_locks(store, clock):
    locks = ColumnLockService(store, clock)
    locks.acquire(TABLE, "A", ["a"], 10, offsets())
    with pytest.raises(ColumnLockConflict, match="only an expired lock"):
        locks.discard(TABLE, "A")
    clock.now += 11
    assert locks.discard(TABLE, "A") is True and locks.discard(TABLE, "A") is False
    assert locks.acquire(TABLE, "B", ["a"], 10, offsets()).owner_id == "B"


@pytest.mark.parametrize("ttl", [0, -1, float("nan"), float("inf"), True, "10"])
def test_ttl_must_be_finite_and_positive(store, clock, ttl):
    with pytest.raises(InvalidInputError, match="ttl"):
        ColumnLockService(store, clock).acquire(TABLE, "o", ["a"], ttl, offsets())


def test_lock_view_fences_zombies(store, clock):
    locks = ColumnLockService(store, clock)
    a = locks.acquire(TABLE, "A", ["a"], 10, offsets())
    view = lambda: view_from_records(7, [r for r, _ in locks.records(7).values()], locks.column_tokens(7))
    a_col, b_col = {SCHEMA.column("a").id}, {SCHEMA.column("b").id}
    view().check_write(a_col, "A", a.token, now=clock.now, secret=a.secret)
    view().check_write(b_col, None, None, now=clock.now)  # unlocked columns are free
    with pytest.raises(PermissionDeniedError, match="secret"):  # the token alone is public
        view().check_write(a_col, "A", a.token, now=clock.now, secret="guessed")
    with pytest.raises(PermissionDeniedError, match="secret"):
        view().check_write(a_col, "A", a.token, now=clock.now)
    with pytest.raises(ColumnLockConflict, match="locked by owner 'A'"):
        view().check_write(a_col | b_col, None, None, now=clock.now)
    with pytest.raises(ColumnLockConflict, match="locked by owner 'A'"):
        view().check_write(a_col, "A", None, now=clock.now)  # an owner id without a lease
    clock.now += 11
    with pytest.raises(LeaseLostError, match="expired"):
        view().check_write(a_col, "A", a.token, now=clock.now, secret=a.secret)
    with pytest.raises(UnrecoveredLockError, match="expired lock of owner 'A'"):
        view().check_write(a_col, None, None, now=clock.now)  # no lease-less write slips in
    [revived] = locks.take_over(TABLE, "B", ["a"], 10)
    with pytest.raises(LeaseLostError):
        view().check_write(a_col, "A", a.token, now=clock.now, secret=a.secret)
    # the takeover's undo (OVERWRITE writes), and nothing else
    view().check_write(a_col, "A", revived.token, now=clock.now, secret=revived.secret,
                       overwrite=True)
    with pytest.raises(TakeoverLeaseError, match="takeover"):
        view().check_write(a_col, "A", revived.token, now=clock.now, secret=revived.secret)
    locks.release(revived)
    b = locks.acquire(TABLE, "B", ["a"], 10, offsets())
    with pytest.raises((LeaseLostError, ColumnLockConflict)):
        view().check_write(a_col, "A", a.token, now=clock.now, secret=a.secret)
    view().check_write(a_col, "B", b.token, now=clock.now, secret=b.secret)


def test_locks_survive_reopening_the_store(metadata_store, tmp_path, clock):
    s = open_store(zookeeper=metadata_store, data_dir=str(tmp_path))
    lease = ColumnLockService(s, clock).acquire(TABLE, "job", ["a"], 30, offsets(3))
    s.close()
    s = open_store(zookeeper=metadata_store, data_dir=str(tmp_path))
    try:
        locks = ColumnLockService(s, clock)
        assert locks.renew(lease).token == lease.token
        again = locks.acquire(TABLE, "job", ["a"], 30, offsets(99))
        assert again.initial_offsets == lease.initial_offsets
    finally:
        s.close()


def test_ten_concurrent_acquirers_exactly_one_wins(metadata_store, tmp_path, clock):
    shared = open_store(zookeeper=metadata_store, data_dir=str(tmp_path))
    # ZooKeeper: one client per acquirer, as separate coordinators would race. Embedded: one
    # process owns the store, so acquirers share it (threads).
    stores = [open_store(zookeeper=metadata_store) if metadata_store else shared for _ in range(10)]
    wins, conflicts = [], []
    barrier = threading.Barrier(10)

    def run(i):
        barrier.wait()
        try:
            wins.append(ColumnLockService(stores[i], clock).acquire(TABLE, f"o{i}", ["a", "b"], 30, offsets()))
        except ColumnLockConflict:
            conflicts.append(i)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(10)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    try:
        assert len(wins) == 1 and len(conflicts) == 9
        assert [d["owner_id"] for d in ColumnLockService(shared, clock).describe(TABLE)] == [wins[0].owner_id]
    finally:
        for s in stores:
            if s is not shared:
                s.close()
        shared.close()


def test_commits_move_forward_and_baselines_are_insert_if_absent(store, clock):
    locks = ColumnLockService(store, clock)
    commits = CommitLog(store, locks)
    lease = locks.acquire(TABLE, "job", ["a"], 30, offsets())
    assert commits.last_commit(7, "job") is None
    assert commits.epoch_baseline(lease, 0, offsets(10)) == {(None, 0): 10, (None, 1): 11}
    assert commits.epoch_baseline(lease, 0, offsets(20)) == {(None, 0): 10, (None, 1): 11}
    assert commits.pending_baselines(7, "job", lease.tenure).keys() == {0}
    assert commits.commit(lease, 0, {(None, 0): 12, (None, 1): 11}) is True
    assert commits.last_commit(7, "job") == (0, {(None, 0): 12, (None, 1): 11}, lease.tenure)
    assert commits.pending_baselines(7, "job", lease.tenure) == {}
    assert commits.commit(lease, 0, {(None, 0): 99}) is False  # replay of the same epoch
    assert commits.commit(lease, 1, {(None, 0): 13}) is True
    with pytest.raises(InvalidInputError, match="only move forward"):
        commits.commit(lease, 0, {})
    newer = locks.acquire(TABLE, "job", ["a"], 30, offsets())
    with pytest.raises(LeaseLostError, match="superseded"):
        commits.commit(lease, 5, {})
    assert commits.commit(newer, 5, {(None, 0): 1}) is True


def test_commits_and_baselines_belong_to_their_tenure(store, clock):
    locks = ColumnLockService(store, clock)
    commits = CommitLog(store, locks)
    first = locks.acquire(TABLE, "job", ["a"], 30, offsets(5))
    assert commits.undo_baselines(7, "job", first.tenure, first.initial_offsets)[0] == \
        {(None, 0): 5, (None, 1): 6}
    commits.commit(first, 0, {(None, 0): 9, (None, 1): 6})
    assert commits.epoch_baseline(first, 1, offsets(9)) == {(None, 0): 9, (None, 1): 10}
    baselines, why = commits.undo_baselines(7, "job", first.tenure, first.initial_offsets)
    assert baselines == {(None, 0): 9, (None, 1): 6} and "epoch 0" in why
    locks.release(first)
    # Another owner wrote in between; the job's next tenure must not reach back before it.
    second = locks.acquire(TABLE, "job", ["a"], 30, offsets(40))
    assert second.tenure != first.tenure
    baselines, why = commits.undo_baselines(7, "job", second.tenure, second.initial_offsets)
    assert baselines == {(None, 0): 40, (None, 1): 41} and f"tenure {second.tenure}" in why
    assert commits.last_commit(7, "job").epoch == 0  # epochs still count across tenures
    assert commits.pending_baselines(7, "job", second.tenure) == {}
    # The epoch baseline stored by the first tenure is replaced, not reused.
    assert commits.epoch_baseline(second, 1, offsets(40)) == {(None, 0): 40, (None, 1): 41}
    assert commits.epoch_baseline(second, 1, offsets(50)) == {(None, 0): 40, (None, 1): 41}


def test_an_expired_lock_past_its_retention_hold_is_refused_until_discarded(store, clock):
    locks = ColumnLockService(store, clock)
    held = LockTarget("db.t", 7, SCHEMA, expired_hold=100.0)
    locks.acquire(held, "A", ["a"], 10, offsets())
    clock.now += 10 + 99
    assert locks.acquire(held, "A", ["a"], 10, offsets()).owner_id == "A"  # within the hold
    clock.now += 10 + 100
    with pytest.raises(RecoveryError, match="expired-lock-ms"):
        locks.acquire(held, "A", ["a"], 10, offsets())
    with pytest.raises(RecoveryError, match="Nothing was changed"):
        locks.take_over(held, "B", ["a"], 10)
    assert [r.token for r, _ in locks.records(7).values()] == [2]
    assert locks.discard(held, "A")
    assert locks.acquire(held, "B", ["a"], 10, offsets()).owner_id == "B"

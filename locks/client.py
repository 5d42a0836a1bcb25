"""`conn.locks`: column locks, their renewal, commits and epoch baselines, through the coordinator.

`acquire` starts a LeaseKeeper that renews the lease until `release(lease)` or `conn.close()`;
a writer bound to a lease its keeper found lost raises LeaseLostError on its next write or
flush. The connection is passed in (anything with `coordinator_action` and `on_close`), so
this module sits below the client package that assembles it.
"""

from __future__ import annotations

import threading

from locks.commits import Commit, EpochStart
from locks.keeper import LeaseKeeper
from locks.lease import Lease, offsets_from_json, offsets_to_json
from tally.wire.messages import SETTLE_WAIT

# calls the coordinator answers from settled offsets, which may wait on replication
_SETTLING = frozenset({"lock_acquire", "epoch_baseline", "epoch_begin"})


class Locks:
    """The lock calls of one connection and the keepers of the leases it acquired."""

    def __init__(self, connection) -> None:
        self._conn = connection
        self._keepers: dict[tuple[int, str, int], LeaseKeeper] = {}
        self._lock = threading.Lock()
        connection.on_close(self._stop_all)

    def _call(self, action: str, **body):
        timeout = SETTLE_WAIT if action in _SETTLING else None
        return self._conn.coordinator_action(action, body, timeout=timeout)

    # --- locks --------------------------------------------------------------------------

    def acquire(self, table: str, owner_id: str, columns, ttl: float = 60) -> Lease:
        """Lock `columns` of `table` for `owner_id` and keep the lease renewed. An expired,
        unrecovered lock of another owner in the way raises UnrecoveredLockError
        (`recovery.acquire` takes such locks over)."""
        lease = Lease.from_json(self._call("lock_acquire", table=table, owner_id=owner_id,
                                           columns=list(columns), ttl=ttl))
        self._keep(lease)
        return lease

    def _keep(self, lease: Lease) -> None:
        keeper = LeaseKeeper(self.renew, lease)
        with self._lock:
            self._keepers[_key(lease)] = keeper

    def renew(self, lease: Lease) -> Lease:
        return Lease.from_json(self._call("lock_renew", lease=lease.to_json()))

    def release(self, lease: Lease) -> bool:
        """Stop renewing and drop the lock (a superseded lease releases nothing)."""
        with self._lock:
            keeper = self._keepers.pop(_key(lease), None)
        if keeper is not None:
            keeper.stop()
        return bool(self._call("lock_release", lease=lease.to_json()))

    def take_over(self, table: str, owner_id: str, columns, ttl: float = 60) -> list[Lease]:
        """Leases on the expired, unrecovered locks in the way of `owner_id` locking `columns`
        (each under its original owner id and tenure, with a new token that fences its
        zombie). Undo each one's tenure, then release it; `recovery.acquire` does all that.
        Renewed in the background like any lease."""
        leases = [Lease.from_json(d) for d in self._call(
            "lock_take_over", table=table, owner_id=owner_id, columns=list(columns), ttl=ttl)]
        for lease in leases:
            self._keep(lease)
        return leases

    def discard(self, table: str, owner_id: str) -> bool:
        """Drop an expired lock without undoing its uncommitted writes (they stay as they are).
        For the operator whose owner will never come back and whose writes can no longer be
        undone; a live lock is refused."""
        return bool(self._call("lock_discard", table=table, owner_id=owner_id))

    def reassign(self, table: str, owner_id: str, principal: str) -> dict:
        """Make `principal` (a client name of the auth file) the owner id's principal on
        `table` (admin): from then on only it may lock, commit and release under the id.
        {"owner_id", "principal", "before"}."""
        return self._call("lock_reassign", table=table, owner_id=owner_id, principal=principal)

    def undo_baselines(self, lease: Lease):
        """({(partition, bucket): offset}, why): where an undo of the lease's tenure starts."""
        offsets, source = self._call("undo_baselines", lease=lease.to_json())
        return offsets_from_json(offsets), source

    def register_attempt(self, lease: Lease, bucket: int) -> int:
        """A new attempt number for this owner's writes to `bucket` (in every partition). When
        it returns, tablet servers reject the owner's writes to that bucket from any earlier
        attempt (or without one): a retried task fences the attempt it replaces."""
        self.check(lease)
        return int(self._call("register_attempt", lease=lease.to_json(), bucket=bucket))

    def register_attempts(self, lease: Lease, buckets) -> dict[int, int]:
        """`register_attempt` for several buckets at once: {bucket: attempt number}."""
        self.check(lease)
        found = self._call("register_attempts", lease=lease.to_json(),
                           buckets=[int(b) for b in buckets])
        return {int(b): int(n) for b, n in found}

    def describe(self, table: str, include_expired: bool = False) -> list[dict]:
        return self._call("lock_describe", table=table, include_expired=include_expired)

    def check(self, lease: Lease) -> None:
        """Raise LeaseLostError if this connection's keeper found the lease lost."""
        with self._lock:
            keeper = self._keepers.get(_key(lease))
        if keeper is not None:
            keeper.check()

    # --- commits and baselines ----------------------------------------------------------

    def commit(self, lease: Lease, epoch: int, offsets) -> bool:
        """Record `epoch` as fully written with these end offsets (moves only forward)."""
        self.check(lease)
        return bool(self._call("commit", lease=lease.to_json(), epoch=epoch,
                               offsets=offsets_to_json(offsets)))

    def commit_together(self, commits, epoch: int) -> list[bool]:
        """`commit` of one epoch for several leases at once, recorded all or none (a source
        and its rollups): `commits` is [(lease, offsets)]."""
        for lease, _ in commits:
            self.check(lease)
        found = self._call("commit_together", epoch=epoch, commits=[
            {"lease": lease.to_json(), "offsets": offsets_to_json(offsets)}
            for lease, offsets in commits])
        return [bool(moved) for moved in found]

    def last_commit(self, table: str, owner_id: str) -> Commit | None:
        """The owner's last commit (epoch, {(partition, bucket): end offset}, tenure), or None.
        The epoch counts across tenures; the offsets are an undo baseline only in its tenure."""
        found = self._call("last_commit", table=table, owner_id=owner_id)
        return None if found is None else Commit(int(found[0]), offsets_from_json(found[1]),
                                                 int(found[2]))

    def epoch_baseline(self, lease: Lease, epoch: int):
        """Every bucket's end offset before `epoch`'s first write (stored on the first call)."""
        return offsets_from_json(self._call("epoch_baseline", lease=lease.to_json(), epoch=epoch))

    def begin_epoch(self, lease: Lease, epoch: int, buckets, run: int | None = None) -> EpochStart:
        """One call before an epoch's first write: a new attempt for each of `buckets` (every
        earlier attempt of the owner on them fenced when it returns), every bucket's end offset
        after that fencing, and the epoch's baseline (stored on the first call, as
        `epoch_baseline`). A task passes the `run` its driver's start returned: its attempt is
        then registered only while that run was not aborted (EpochAbortedError)."""
        self.check(lease)
        extra = {} if run is None else {"run": int(run)}
        found = self._call("epoch_begin", lease=lease.to_json(), epoch=epoch,
                           buckets=[int(b) for b in buckets], **extra)
        return EpochStart(offsets_from_json(found["baseline"]), offsets_from_json(found["offsets"]),
                          {int(b): int(n) for b, n in found["attempts"]},
                          int(found.get("run", 0)))

    def abort_epoch(self, lease: Lease, epoch: int) -> int:
        """Abort the epoch's current run before rolling it back: no task that began under it
        can register an attempt from now on. Returns the epoch's new run."""
        self.check(lease)
        return int(self._call("epoch_abort", lease=lease.to_json(), epoch=epoch))

    def _stop_all(self) -> None:
        with self._lock:
            keepers, self._keepers = list(self._keepers.values()), {}
        for keeper in keepers:
            keeper.stop()


def _key(lease: Lease) -> tuple[int, str, int]:
    return lease.table_id, lease.owner_id, lease.token

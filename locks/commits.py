"""Commits and epoch baselines: where an owner's undo starts after a crash.

Layout in the metadata store:

    /commits/<table_id>/<owner>                  {"epoch", "offsets", "tenure", "token",
                                                  "committed_at"}
    /commits/<table_id>/<owner>/epochs/<epoch>   {"offsets", "tenure", "run"}
                                                 (the epoch's baseline, and its run: see below)

A commit moves only forward and is checked against the owner's lock in the same metadata
transaction, so a fenced lease can never commit. Commits and baselines belong to the lock
tenure they were made in: the epoch number goes on across tenures (a committed epoch is never
written again), but the offsets are undo baselines only within their own tenure, because
another owner may have written the columns between two tenures. A baseline is stored
insert-if-absent within its tenure: a replayed epoch keeps the offsets it had before its first
write, and a baseline left by an earlier tenure is replaced.

An epoch's *run* counts the rollbacks of the epoch within the tenure. A writer's rollback
aborts the run (adds one) before it fences and undoes the buckets; a task carries the run its
driver began, and the coordinator registers its attempt only in the same metadata transaction
that checks the run still stands. So a straggling task of a failed job, which Spark cancels
without waiting for it, can never write after the rollback that removed its epoch.
"""

from __future__ import annotations

import time
from typing import NamedTuple

from locks.lease import Lease, Offsets, offsets_from_json, offsets_to_json
from locks.service import ColumnLockService, lock_path
from tally.errors import EpochAbortedError, InvalidInputError, TakeoverLeaseError
from tally.meta import MetadataStore, join_path, node_name


def _owner_node(owner_id: str) -> str:
    return node_name(owner_id, "lock owner id")


def commit_path(table_id: int, owner_id: str) -> str:
    return join_path("commits", str(table_id), _owner_node(owner_id))


def baseline_path(table_id: int, owner_id: str, epoch: int) -> str:
    return join_path("commits", str(table_id), _owner_node(owner_id), "epochs", str(epoch))


def check_epoch(epoch) -> int:
    if not isinstance(epoch, int) or isinstance(epoch, bool) or epoch < 0:
        raise InvalidInputError(f"An epoch is a non-negative integer (a batch id), got {epoch!r}")
    return epoch


class Commit(NamedTuple):
    """An owner's last commit: the epoch, every bucket's end offset then, and its tenure."""

    epoch: int
    offsets: Offsets
    tenure: int


class EpochStart(NamedTuple):
    """What a writer learns before an epoch's first write (`conn.locks.begin_epoch`): the
    epoch's baseline, every bucket's end offset once the new attempts fenced the older ones,
    and those attempts' numbers by bucket."""

    baseline: Offsets
    offsets: Offsets
    attempts: dict
    run: int = 0  # the epoch's run this start belongs to (its tasks carry it)


def refuse_takeover(record, lease: Lease, doing: str) -> None:
    """A takeover's lease undoes and releases only: acting as the owner is refused to it
    (whoever holds it, with or without credentials)."""
    if record.takeover:
        raise TakeoverLeaseError(
            f"The lease of owner '{lease.owner_id}' on {lease.table} (token {lease.token}) was "
            f"granted by a takeover of its expired lock: it may undo that owner's uncommitted "
            f"writes and release the lock, never {doing} in its name; nothing was changed")


class CommitLog:
    def __init__(self, store: MetadataStore, locks: ColumnLockService):
        self.store = store
        self.locks = locks

    def acting(self, lease: Lease, doing: str):
        """`locks.current(lease)`, refused to a takeover's lease (see refuse_takeover)."""
        record, version = self.locks.current(lease)
        refuse_takeover(record, lease, doing)
        return record, version

    def last_commit(self, table_id: int, owner_id: str) -> Commit | None:
        node = self.store.get(commit_path(table_id, owner_id))
        if node is None or "epoch" not in node.value:
            return None
        return Commit(int(node.value["epoch"]), offsets_from_json(node.value["offsets"]),
                      int(node.value["tenure"]))

    def undo_baselines(self, table_id: int, owner_id: str, tenure: int,
                       tenure_start: Offsets) -> tuple[Offsets, str]:
        """Where an undo of the owner's tenure starts, per bucket, and why: its last commit in
        this tenure, else the offsets the tenure began at (a bucket in neither: from 0, since
        its partition was created during the tenure)."""
        last = self.last_commit(table_id, owner_id)
        if last is not None and last.tenure == tenure:
            return {**tenure_start, **last.offsets}, f"commit of epoch {last.epoch}"
        return dict(tenure_start), f"the start of lock tenure {tenure} (no commit in it)"

    def commit(self, lease: Lease, epoch: int, offsets: Offsets) -> bool:
        """Record that `epoch` is fully written with these end offsets.

        Returns False for a repeat of the last committed epoch (a replay), raises for an older
        one, and raises LeaseLostError for a lease that is expired or superseded.
        """
        return self.commit_together([(lease, offsets)], check_epoch(epoch))[0]

    def commit_together(self, commits: list[tuple[Lease, Offsets]], epoch: int) -> list[bool]:
        """`commit` of one epoch for several owners (a source table and its rollups) in one
        metadata transaction: every commit is recorded, or none, so a crash can never leave
        one table's owner at the epoch and another's before it. Each lease is checked as
        `commit` checks it; an owner already at the epoch is left as it is (False)."""
        epoch = check_epoch(epoch)
        if not commits:
            return []

        def attempt() -> tuple[list[tuple], list[bool]]:
            ops, changed = [], []
            for lease, offsets in commits:
                own, moved = self._commit_ops(lease, epoch, offsets)
                ops += own
                changed.append(moved)
            return ops, changed

        names = ", ".join(f"'{lease.owner_id}'" for lease, _ in commits)
        tables = ", ".join(sorted({lease.table for lease, _ in commits}))
        changed = self.store.transact(
            attempt, what=f"the locks and the last commits of owner(s) {names}",
            doing=f"commit epoch {epoch} on {tables}")
        for (lease, _), moved in zip(commits, changed):
            if moved:
                self.forget_baselines(lease.table_id, lease.owner_id, epoch)
        return changed

    def _commit_ops(self, lease: Lease, epoch: int, offsets: Offsets) -> tuple[list[tuple], bool]:
        """The ops recording one owner's commit of `epoch` (none for a repeat), read fresh."""
        path = commit_path(lease.table_id, lease.owner_id)
        record, lock_version = self.acting(lease, f"commit epoch {epoch}")
        node = self.store.get(path)
        # no "epoch": the node is only the parent of baselines stored before a first commit
        if node is not None and "epoch" in node.value:
            last = int(node.value["epoch"])
            if epoch == last:
                return [], False
            if epoch < last:
                raise InvalidInputError(
                    f"Epoch {epoch} is older than the last commit {last} of owner "
                    f"'{lease.owner_id}' on {lease.table}: commits only move forward")
        value = {"epoch": epoch, "offsets": offsets_to_json(offsets),
                 "tenure": record.tenure, "token": lease.token, "committed_at": time.time()}
        write = ("set", path, value, node.version) if node is not None else \
            ("create", path, value)
        return [("check", lock_path(lease.table_id, lease.owner_id), lock_version), write], True

    def epoch_baseline(self, lease: Lease, epoch: int, current_offsets) -> Offsets:
        """The end offsets before `epoch`'s first write in this tenure: stored on the first
        call, returned unchanged by every later call of the same tenure (a replayed epoch keeps
        its original baseline). A baseline an earlier tenure left is replaced."""
        epoch = check_epoch(epoch)
        record, _ = self.acting(lease, f"store the baseline of epoch {epoch}")
        path = baseline_path(lease.table_id, lease.owner_id, epoch)

        def attempt() -> tuple[list[tuple], Offsets]:
            node = self.store.get(path)
            if node is not None and int(node.value["tenure"]) == record.tenure:
                return [], offsets_from_json(node.value["offsets"])
            value = {"offsets": offsets_to_json(current_offsets()), "tenure": record.tenure}
            write = ("create", path, value) if node is None else \
                ("set", path, value, node.version)
            return [write], offsets_from_json(value["offsets"])

        return self.store.transact(
            attempt, what=f"the baseline node of owner '{lease.owner_id}' on {lease.table}",
            doing=f"store the baseline of epoch {epoch}")

    def epoch_run(self, lease: Lease, epoch: int) -> int:
        """The epoch's run in the lease's tenure: how many times a rollback aborted it (0
        when it has no baseline in this tenure yet)."""
        record, _ = self.locks.current(lease)
        node = self.store.get(baseline_path(lease.table_id, lease.owner_id, check_epoch(epoch)))
        if node is None or int(node.value["tenure"]) != record.tenure:
            return 0
        return int(node.value.get("run", 0))

    def abort_run(self, lease: Lease, epoch: int) -> int:
        """Abort the epoch's current run (a rollback begins): from now on no task of it may
        register an attempt (`run_guard`). Returns the new run. An epoch with no baseline in
        this tenure has no task that could write: nothing to abort."""
        epoch = check_epoch(epoch)
        path = baseline_path(lease.table_id, lease.owner_id, epoch)

        def attempt() -> tuple[list[tuple], int]:
            record, lock_version = self.acting(lease, f"abort epoch {epoch}")
            node = self.store.get(path)
            if node is None or int(node.value["tenure"]) != record.tenure:
                return [], 0
            run = int(node.value.get("run", 0)) + 1
            return [("check", lock_path(lease.table_id, lease.owner_id), lock_version),
                    ("set", path, {**node.value, "run": run}, node.version)], run

        return self.store.transact(
            attempt, what=f"the baseline node of owner '{lease.owner_id}' on {lease.table}",
            doing=f"abort the run of epoch {epoch}")

    def run_guard(self, lease: Lease, epoch: int, run: int):
        """For `register_attempts(guard=...)`: the check that the task's run of the epoch
        still stands (not aborted by a rollback, same tenure); EpochAbortedError if not."""
        epoch = check_epoch(epoch)
        path = baseline_path(lease.table_id, lease.owner_id, epoch)

        def guard() -> list[tuple]:
            record, _ = self.locks.current(lease)
            node = self.store.get(path)
            current = None if node is None or int(node.value["tenure"]) != record.tenure \
                else int(node.value.get("run", 0))
            if current != run:
                now = "it has no baseline in this tenure" if current is None else \
                    f"the epoch is at run {current}"
                raise EpochAbortedError(
                    f"Run {run} of epoch {epoch} of owner '{lease.owner_id}' on {lease.table} "
                    f"was rolled back ({now}): a task of it still running may not write")
            return [("check", path, node.version)]

        return guard

    def pending_baselines(self, table_id: int, owner_id: str, tenure: int) -> dict[int, Offsets]:
        """Baselines of epochs of this tenure stored but not committed yet (retention must
        keep them)."""
        root = join_path("commits", str(table_id), _owner_node(owner_id), "epochs")
        found = {}
        for child in self.store.children(root):
            node = self.store.get(join_path(root, child))
            if node is not None and int(node.value["tenure"]) == tenure:
                found[int(child)] = offsets_from_json(node.value["offsets"])
        return found

    def forget_baselines(self, table_id: int, owner_id: str, up_to: int | None = None) -> None:
        """Drop stored baselines of epochs up to `up_to` (all when None): committed epochs,
        or an ended tenure, need them no more."""
        root = join_path("commits", str(table_id), _owner_node(owner_id), "epochs")
        for child in self.store.children(root):
            if up_to is None or int(child) <= up_to:
                self.store.delete(join_path(root, child))

    def drop_table(self, table_id: int) -> None:
        self.store.delete(join_path("commits", str(table_id)), recursive=True)

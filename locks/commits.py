"""Commits and epoch baselines: where an owner's undo starts after a crash.

Layout in the metadata store:

    /commits/<table_id>/<owner>                  {"epoch", "offsets", "token", "committed_at"}
    /commits/<table_id>/<owner>/epochs/<epoch>   {"offsets"}   (the epoch's baseline)

A commit moves only forward and is checked against the owner's lock in the same metadata
transaction, so a fenced lease can never commit. A baseline is stored insert-if-absent: a
replayed epoch keeps the offsets it had before its first write.
"""

from __future__ import annotations

import time

from locks.lease import Lease, Offsets, offsets_from_json, offsets_to_json
from locks.service import ColumnLockService, lock_path
from meta import MetadataStore, join_path, node_name
from tally.errors import AlreadyExistsError, InvalidInputError, NotFoundError, VersionConflictError

_RACES = (VersionConflictError, AlreadyExistsError, NotFoundError)


def commit_path(table_id: int, owner_id: str) -> str:
    return join_path("commits", str(table_id), node_name(owner_id))


def baseline_path(table_id: int, owner_id: str, epoch: int) -> str:
    return join_path("commits", str(table_id), node_name(owner_id), "epochs", str(epoch))


def _check_epoch(epoch) -> int:
    if not isinstance(epoch, int) or isinstance(epoch, bool) or epoch < 0:
        raise InvalidInputError(f"An epoch is a non-negative integer (a batch id), got {epoch!r}")
    return epoch


class CommitLog:
    def __init__(self, store: MetadataStore, locks: ColumnLockService):
        self.store = store
        self.locks = locks

    def last_commit(self, table_id: int, owner_id: str) -> tuple[int, Offsets] | None:
        node = self.store.get(commit_path(table_id, owner_id))
        if node is None or "epoch" not in node.value:
            return None
        return int(node.value["epoch"]), offsets_from_json(node.value["offsets"])

    def commit(self, lease: Lease, epoch: int, offsets: Offsets) -> bool:
        """Record that `epoch` is fully written with these end offsets.

        Returns False for a repeat of the last committed epoch (a replay), raises for an older
        one, and raises LeaseLostError for a lease that is expired or superseded.
        """
        epoch = _check_epoch(epoch)
        for _ in range(100):
            record, lock_version = self.locks.current(lease)
            node = self.store.get(commit_path(lease.table_id, lease.owner_id))
            if node is not None and "epoch" in node.value:
                last = int(node.value["epoch"])
                if epoch == last:
                    return False
                if epoch < last:
                    raise InvalidInputError(
                        f"Epoch {epoch} is older than the last commit {last} of owner "
                        f"'{lease.owner_id}' on {lease.table}: commits only move forward")
            value = {"epoch": epoch, "offsets": offsets_to_json(offsets),
                     "token": lease.token, "committed_at": time.time()}
            write = ("set", commit_path(lease.table_id, lease.owner_id), value, node.version) \
                if node is not None else ("create", commit_path(lease.table_id, lease.owner_id), value)
            try:
                self.store.transaction([
                    ("check", lock_path(lease.table_id, lease.owner_id), lock_version), write])
            except _RACES:
                continue
            self._forget_baselines(lease, epoch)
            return True
        raise VersionConflictError(f"Could not commit epoch {epoch} on {lease.table}; try again")

    def epoch_baseline(self, lease: Lease, epoch: int, current_offsets) -> Offsets:
        """The end offsets before `epoch`'s first write: stored on the first call, returned
        unchanged by every later call (a replayed epoch keeps its original baseline)."""
        epoch = _check_epoch(epoch)
        self.locks.current(lease)
        path = baseline_path(lease.table_id, lease.owner_id, epoch)
        node = self.store.get(path)
        if node is not None:
            return offsets_from_json(node.value["offsets"])
        try:
            self.store.create(path, {"offsets": offsets_to_json(current_offsets())})
        except AlreadyExistsError:
            pass
        return offsets_from_json(self.store.get(path).value["offsets"])

    def pending_baselines(self, table_id: int, owner_id: str) -> dict[int, Offsets]:
        """Baselines of epochs stored but not committed yet (retention must keep them)."""
        root = join_path("commits", str(table_id), node_name(owner_id), "epochs")
        found = {}
        for child in self.store.children(root):
            node = self.store.get(join_path(root, child))
            if node is not None:
                found[int(child)] = offsets_from_json(node.value["offsets"])
        return found

    def _forget_baselines(self, lease: Lease, committed: int) -> None:
        """Baselines of committed epochs are no longer needed."""
        for epoch in self.pending_baselines(lease.table_id, lease.owner_id):
            if epoch <= committed:
                self.store.delete(baseline_path(lease.table_id, lease.owner_id, epoch))

    def drop_table(self, table_id: int) -> None:
        self.store.delete(join_path("commits", str(table_id)), recursive=True)

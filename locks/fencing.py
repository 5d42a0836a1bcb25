"""What a tablet server checks before it applies a write: column locks and fencing tokens.

A tablet server keeps one `LockView` per table, pushed by the coordinator on every lock change
and fetched from it when the server needs it (see tablet_check). Every view carries the
version of the lock state it shows, which only grows per table, so a server keeps the newest
view whatever order views arrive in. A write touching a column
under another owner's lock is rejected (live, or expired but unrecovered: a lock's record stays
until it is released), and so is a write without a lease; a write under a lease must carry the
owner's newest token and the secret that token was granted with (of which the view holds
only a hash: the token is public, the secret is the acquirer's), and its lock must be live,
so a zombie (a paused owner whose lock expired
and was taken, or an earlier incarnation of a re-acquired owner) cannot write.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from locks.lease import secret_matches
from tally.errors import (AttemptSupersededError, ColumnLockConflict, LeaseLostError,
                          PermissionDeniedError, TakeoverLeaseError, UnrecoveredLockError)
from tally.timestamps import iso


@dataclass(frozen=True)
class HeldLock:
    owner_id: str
    column_ids: frozenset
    column_names: tuple
    token: int
    expires_at: float
    attempts: dict = field(default_factory=dict)  # bucket -> newest registered attempt
    secret_hash: str = ""
    takeover: bool = False  # granted by a takeover: its writes may only be an undo's

    def __repr__(self) -> str:
        return (f"HeldLock(owner {self.owner_id!r}, columns {list(self.column_names)}, token "
                f"{self.token}, expires {iso(self.expires_at)}, attempts {self.attempts}, "
                f"takeover {self.takeover})")


@dataclass
class LockView:
    """One table's locks as a tablet server knows them, as of lock-state `version` (the
    version of the table's lock guard in the metadata store: every lock change bumps it in
    its own transaction, so it only grows, also across coordinator restarts and failovers)."""

    table_id: int
    locks: list[HeldLock] = field(default_factory=list)
    column_tokens: dict[int, int] = field(default_factory=dict)
    version: int = 0

    def newer_than(self, other: "LockView | None") -> bool:
        return other is None or self.version > other.version

    @property
    def newest_token(self) -> int:
        """The largest token this view knows of; a larger one was granted after it."""
        return max([*self.column_tokens.values(), *(l.token for l in self.locks)], default=0)

    def behind(self, owner_id: str | None, token: int | None, bucket: int | None,
               attempt: int | None) -> bool:
        """Whether a write's lease (or attempt) is newer than this view knows: then the view
        may be behind the coordinator's (its push not here yet), and the write must be judged
        against a fresh one, never refused for a grant on its way."""
        if token is None:
            return False
        if token > self.newest_token:
            return True
        own = next((l for l in self.locks if l.owner_id == owner_id), None)
        return (own is not None and own.token == token and attempt is not None
                and bucket is not None and attempt > own.attempts.get(bucket, 0))

    def expired_for(self, owner_id: str | None, token: int | None, now: float) -> bool:
        """Whether the write's lease is this view's own lock of the owner, expired by it (a
        renewal's view may still be on its way)."""
        own = next((l for l in self.locks if l.owner_id == owner_id), None)
        return token is not None and own is not None and own.token == token \
            and own.expires_at <= now

    def to_json(self) -> dict:
        return {
            "table_id": self.table_id, "version": self.version,
            "locks": [{"owner_id": l.owner_id, "columns": sorted(l.column_ids),
                       "column_names": list(l.column_names), "token": l.token,
                       "expires_at": l.expires_at,
                       "attempts": {str(b): n for b, n in l.attempts.items()},
                       "secret_hash": l.secret_hash, "takeover": l.takeover}
                      for l in self.locks],
            "column_tokens": {str(k): v for k, v in self.column_tokens.items()},
        }

    @classmethod
    def from_json(cls, d: dict) -> "LockView":
        return cls(
            table_id=int(d["table_id"]),
            locks=[HeldLock(l["owner_id"], frozenset(int(c) for c in l["columns"]),
                            tuple(l["column_names"]), int(l["token"]), float(l["expires_at"]),
                            {int(b): int(n) for b, n in l["attempts"].items()},
                            str(l["secret_hash"]), bool(l.get("takeover", False)))
                   for l in d["locks"]],
            column_tokens={int(k): int(v) for k, v in d["column_tokens"].items()},
            version=int(d.get("version", 0)),
        )

    def _refuse(self, lock: HeldLock, overlap, now: float, table: str) -> None:
        """A lock of another owner covers the columns: live, or expired but not yet recovered
        (its writes since its last commit may still be undone, so nothing else may land in
        between)."""
        where = f"Columns {_columns(lock, overlap)} of table {table or self.table_id}"
        if lock.expires_at > now:
            raise ColumnLockConflict(
                f"{where} are locked by owner '{lock.owner_id}' (token {lock.token}) for "
                f"{lock.expires_at - now:.1f}s more; this write was rejected")
        raise UnrecoveredLockError(
            f"{where} are held by the expired lock of owner '{lock.owner_id}' (token "
            f"{lock.token}, expired {now - lock.expires_at:.1f}s ago), whose writes since its "
            "last commit may still be undone; this write was rejected. Restart that owner, "
            "take the columns over (recovery.acquire), or discard its lock")

    def check_write(self, column_ids: set[int], owner_id: str | None = None,
                    token: int | None = None, now: float | None = None,
                    table: str = "", bucket: int | None = None,
                    attempt: int | None = None, secret: str | None = None,
                    overwrite: bool = False) -> None:
        """Raise unless a write of `column_ids` by (owner_id, token, secret) may be applied
        now; under a takeover's lease only an undo's write (`overwrite`: MergeMode.OVERWRITE,
        which is what undo sends) may."""
        now = time.time() if now is None else now
        if token is None:
            owner_id = None  # a write without a lease is nobody's
        for lock in self.locks:
            overlap = lock.column_ids & column_ids
            if overlap and lock.owner_id != owner_id:
                self._refuse(lock, overlap, now, table)
        if token is None:
            return
        newest = max((self.column_tokens.get(c, 0) for c in column_ids), default=0)
        if token < newest:
            raise LeaseLostError(
                f"Write under token {token} by owner '{owner_id}' rejected: token {newest} was "
                f"issued since for these columns of table {table or self.table_id} (fenced)")
        own = next((l for l in self.locks if l.owner_id == owner_id), None)
        if own is None or own.token != token:
            raise LeaseLostError(
                f"Write under token {token} by owner '{owner_id}' rejected: that lease is no "
                f"longer held on table {table or self.table_id} (released or superseded)")
        if not secret_matches(secret, own.secret_hash):
            raise PermissionDeniedError(
                f"Write under token {token} by owner '{owner_id}' rejected: it does not carry "
                f"the secret of that lease on table {table or self.table_id}")
        if own.takeover and not overwrite:
            raise TakeoverLeaseError(
                f"Write under token {token} by owner '{owner_id}' rejected: that lease was "
                f"granted by a takeover of its expired lock on table {table or self.table_id}, "
                "and may only undo (OVERWRITE writes back to the last commit), never write new "
                "data")
        if own.expires_at <= now:
            raise LeaseLostError(
                f"Write under token {token} by owner '{owner_id}' rejected: the lease expired "
                f"{now - own.expires_at:.1f}s ago on table {table or self.table_id}")
        newest = own.attempts.get(bucket) if bucket is not None else None
        if newest is not None and (attempt is None or attempt < newest):
            raise AttemptSupersededError(
                f"Write by owner '{owner_id}' to bucket {bucket} of table "
                f"{table or self.table_id} rejected: it comes from attempt {attempt}, and "
                f"attempt {newest} has registered since (a retried task replaced this one)")


def _columns(lock: HeldLock, overlap) -> list:
    return [n for n, c in zip(lock.column_names, sorted(lock.column_ids)) if c in overlap] \
        or sorted(overlap)


def view_from_records(table_id: int, records, column_tokens: dict[int, int],
                      version: int = 0) -> LockView:
    """A LockView from the lock service's stored records (expired ones included: the view
    judges expiry itself at write time), as of lock-state `version`."""
    return LockView(
        table_id,
        [HeldLock(r.owner_id, frozenset(r.column_ids), r.column_names, r.token, r.expires_at,
                  dict(r.attempts), r.secret_hash, r.takeover) for r in records],
        dict(column_tokens), version,
    )

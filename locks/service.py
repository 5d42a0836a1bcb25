"""The coordinator's column lock service: acquire, renew, release and describe column locks.

Layout in the metadata store:

    /locks/<table_id>                 {"next_token", "column_tokens": {column_id: token}}
    /locks/<table_id>/<owner>         one lock: owner id, column ids and names, ttl, expiry,
                                      token, initial offsets, created-at

Every change is one metadata transaction that checks the table's guard node version and bumps
it, so two acquirers can never both win, even across coordinator restarts. Expiry is judged on
the coordinator's clock (`clock`, `time.time` by default).
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from typing import Callable

from locks.lease import Lease, LockRecord, Offsets
from meta import MetadataStore, join_path, node_name
from tally.errors import (
    AlreadyExistsError,
    ColumnLockConflict,
    InvalidInputError,
    LeaseLostError,
    NotFoundError,
    VersionConflictError,
)

_RACES = (VersionConflictError, AlreadyExistsError, NotFoundError)


@dataclass(frozen=True)
class LockTarget:
    """The table a lock is for: its name, id (changes when re-created) and schema."""

    name: str
    table_id: int
    schema: object  # merge_engine.Schema (columns with stable ids, primary key)


def guard_path(table_id: int) -> str:
    return join_path("locks", str(table_id))


def lock_path(table_id: int, owner_id: str) -> str:
    return join_path("locks", str(table_id), node_name(owner_id))


class ColumnLockService:
    def __init__(self, store: MetadataStore, clock: Callable[[], float] = time.time,
                 on_change: Callable[[int], None] | None = None):
        self.store = store
        self.clock = clock
        self.on_change = on_change or (lambda table_id: None)

    # --- reading ------------------------------------------------------------------------------

    def records(self, table_id: int) -> dict[str, tuple[LockRecord, int]]:
        """{owner node name: (record, node version)} of every stored lock of a table."""
        found = {}
        for child in self.store.children(guard_path(table_id)):
            node = self.store.get(join_path("locks", str(table_id), child))
            if node is not None:
                found[child] = (LockRecord.from_json(node.value), node.version)
        return found

    def describe(self, target: LockTarget, include_expired: bool = False) -> list[dict]:
        now = self.clock()
        return [r.describe(now) | {"expired": not r.live(now)}
                for r, _ in sorted(self.records(target.table_id).values(), key=lambda x: x[0].token)
                if include_expired or r.live(now)]

    def column_tokens(self, table_id: int) -> dict[int, int]:
        node = self.store.get(guard_path(table_id))
        return {} if node is None else {int(k): int(v) for k, v in node.value.get("column_tokens", {}).items()}

    # --- acquiring ----------------------------------------------------------------------------

    def acquire(self, target: LockTarget, owner_id: str, columns, ttl: float,
                current_offsets: Callable[[], Offsets]) -> Lease:
        """Lock `columns` of a table for `owner_id` (see Lease). Primary-key columns are dropped."""
        if not isinstance(owner_id, str) or not owner_id:
            raise InvalidInputError(f"A lock owner id must be a non-empty string, got {owner_id!r}")
        if not isinstance(ttl, (int, float)) or ttl <= 0:
            raise InvalidInputError(f"A lock ttl must be a positive number of seconds, got {ttl!r}")
        ids, names = self._resolve(target, columns)
        for _ in range(100):
            try:
                lease = self._try_acquire(target, owner_id, ids, names, float(ttl), current_offsets)
            except _RACES:
                continue  # another acquirer changed the table's locks first: look again
            self.on_change(target.table_id)
            return lease
        raise VersionConflictError(f"Locks of table {target.name} kept changing; try again")

    def _resolve(self, target: LockTarget, columns) -> tuple[tuple[int, ...], tuple[str, ...]]:
        schema = target.schema
        if isinstance(columns, str) or columns is None:
            raise InvalidInputError(f"columns must be a list of column names, got {columns!r}")
        unknown = [c for c in columns if not schema.has_column(c)]
        if unknown:
            raise InvalidInputError(
                f"Cannot lock unknown columns {unknown} of table {target.name}; its columns "
                f"are {schema.names}")
        wanted = {c for c in columns if c not in schema.primary_key}
        if not wanted:
            raise InvalidInputError(
                f"Nothing to lock in table {target.name}: {list(columns)} holds only primary-key "
                "columns, which are never locked")
        chosen = [c for c in schema.columns if c.name in wanted]
        return tuple(c.id for c in chosen), tuple(c.name for c in chosen)

    def _try_acquire(self, target, owner_id, ids, names, ttl, current_offsets) -> Lease:
        now = self.clock()
        guard = self.store.get(guard_path(target.table_id))
        records = self.records(target.table_id)
        mine_key = node_name(owner_id)
        mine = records.get(mine_key)
        obsolete = []
        for key, (record, version) in records.items():
            overlap = set(record.column_ids) & set(ids)
            if key == mine_key or not overlap:
                continue
            if record.live(now):
                raise ColumnLockConflict(
                    f"Columns {sorted(self._names(target, overlap))} of table {target.name} are "
                    f"locked by owner '{record.owner_id}' until "
                    f"{time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(record.expires_at))} "
                    f"({record.expires_at - now:.1f}s from now)")
            obsolete.append((key, version))  # expired: taken over, so its node goes
        same_columns = mine is not None and set(mine[0].column_ids) == set(ids)
        if mine is not None and mine[0].live(now) and not same_columns:
            raise ColumnLockConflict(
                f"Owner '{owner_id}' already holds a live lock on columns "
                f"{list(mine[0].column_names)} of table {target.name}; it cannot lock "
                f"{list(names)} as well. Release it first or use another owner id.")
        state = dict(guard.value) if guard else {}  # an empty guard: made as a parent node
        token = int(state.get("next_token", 1))
        tokens = dict(state.get("column_tokens", {}))
        tokens.update({str(c): token for c in ids})
        record = LockRecord(
            owner_id=owner_id, table_id=target.table_id, column_ids=ids, column_names=names,
            ttl=ttl, expires_at=now + ttl, token=token,
            initial_offsets=mine[0].initial_offsets if same_columns else dict(current_offsets()),
            created_at=mine[0].created_at if same_columns else now,
            attempts=dict(mine[0].attempts) if mine else {},  # attempt numbers only grow
        )
        path = lock_path(target.table_id, owner_id)
        ops = [self._guard_op(guard, target.table_id,
                              {"next_token": token + 1, "column_tokens": tokens})]
        ops.append(("set", path, record.to_json(), mine[1]) if mine else ("create", path, record.to_json()))
        ops += [("delete", join_path("locks", str(target.table_id), key), version)
                for key, version in obsolete]
        self.store.transaction(ops)
        return record.lease(target.name)

    def _guard_op(self, guard, table_id: int, value: dict):
        if guard is None:
            return ("create", guard_path(table_id), value)
        return ("set", guard_path(table_id), value, guard.version)

    @staticmethod
    def _names(target: LockTarget, ids) -> list[str]:
        return [c.name for c in target.schema.columns if c.id in ids]

    # --- renewing and releasing ---------------------------------------------------------------

    def current(self, lease: Lease) -> tuple[LockRecord, int]:
        """The stored record of a lease that is still the owner's newest and unexpired."""
        node = self.store.get(lock_path(lease.table_id, lease.owner_id))
        if node is None:
            raise LeaseLostError(
                f"The lock of owner '{lease.owner_id}' on table {lease.table} is gone (released, "
                "or taken over after it expired); re-acquire it")
        record = LockRecord.from_json(node.value)
        if record.token != lease.token:
            raise LeaseLostError(
                f"Lease token {lease.token} of owner '{lease.owner_id}' on table {lease.table} "
                f"was superseded by token {record.token}: this writer is fenced")
        if not record.live(self.clock()):
            raise LeaseLostError(
                f"The lease of owner '{lease.owner_id}' on table {lease.table} expired at "
                f"{record.expires_at:.3f}; re-acquire it (its initial offsets are kept)")
        return record, node.version

    def renew(self, lease: Lease) -> Lease:
        """Extend a lease by its ttl; LeaseLostError once it expired or was superseded."""
        for _ in range(100):
            record, version = self.current(lease)
            renewed = dataclasses.replace(record, expires_at=self.clock() + record.ttl)
            try:
                self.store.transaction([("set", lock_path(lease.table_id, lease.owner_id),
                                         renewed.to_json(), version)])
            except _RACES:
                continue
            self.on_change(lease.table_id)
            return renewed.lease(lease.table)
        raise VersionConflictError(f"Could not renew the lease on {lease.table}; try again")

    def register_attempt(self, lease: Lease, bucket: int) -> int:
        """A new attempt number for the owner's writes to `bucket` (of every partition): once
        this returns, tablet servers reject the owner's writes there from older attempts."""
        if not isinstance(bucket, int) or bucket < 0:
            raise InvalidInputError(f"A bucket is a non-negative integer, got {bucket!r}")
        for _ in range(100):
            record, version = self.current(lease)
            number = record.attempts.get(bucket, 0) + 1
            updated = dataclasses.replace(record, attempts={**record.attempts, bucket: number})
            try:
                self.store.transaction([("set", lock_path(lease.table_id, lease.owner_id),
                                         updated.to_json(), version)])
            except _RACES:
                continue
            self.on_change(lease.table_id)
            return number
        raise VersionConflictError(f"Could not register an attempt on {lease.table}; try again")

    def release(self, lease: Lease) -> bool:
        """Drop the lock if `lease` is still its newest token; a superseded lease does nothing."""
        node = self.store.get(lock_path(lease.table_id, lease.owner_id))
        if node is None or LockRecord.from_json(node.value).token != lease.token:
            return False
        try:
            self.store.transaction([("delete", lock_path(lease.table_id, lease.owner_id),
                                     node.version)])
        except _RACES:
            return False
        self.on_change(lease.table_id)
        return True

    def drop_table(self, table_id: int) -> None:
        """Forget every lock of a dropped table."""
        self.store.delete(guard_path(table_id), recursive=True)

"""The coordinator's column lock service: acquire, renew, release and describe column locks.

Layout in the metadata store:

    /locks/<table_id>                 {"next_token", "column_tokens": {column_id: token}}
    /locks/<table_id>/<owner>         one lock: owner id, column ids and names, ttl, expiry,
                                      token, initial offsets, created-at

Every acquisition and takeover is one metadata transaction (`MetadataStore.transact`: built
again from fresh reads when another writer got in first) that checks the table's guard node
version and bumps it, so two acquirers can never both win, even across coordinator restarts; a
renewal, an attempt registration, a release or a discard changes the lock node and bumps the
guard in the same transaction. So the guard's version counts every change of the table's
locks: it is the version of the lock views tablet servers receive (`view_state`), and it only
grows, whichever coordinator made the change. A guard may hold {} (the ZooKeeper store makes
it, as the parent of the lock node an acquisition creates, before that transaction): no token
issued yet. Expiry is judged on the coordinator's clock (`clock`, `time.time` by default).

`on_change(table_id, fencing)` runs after every change: `fencing` is False for a renewal
(which extends an expiry and fences nobody), the set of bucket numbers for an attempt
registration (it fences writes to those buckets only), and True for everything that grants a
token or removes a lock.

A lock node lives from the acquisition that starts its tenure until its owner releases it (or
an operator discards it): expiry alone does not end a tenure, because the tenure's writes since
its last commit may still have to be undone. Until then its columns stay closed to everyone
else; `take_over` hands such an expired lock to another owner for exactly that undo.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Callable

from locks import ownership
from locks.lease import (Lease, LockRecord, Offsets, new_lease_secret, secret_hash,
                         secret_matches)
from locks.owner_claims import claim_ops, claimant
from locks.refusals import refuse_overlap, refuse_unrecoverable, when
from locks.request import LockTarget, check_buckets, check_ttl
from tally.errors import (
    ColumnLockConflict,
    InvalidInputError,
    LeaseLostError,
    PermissionDeniedError,
    UnrecoveredLockError,
    VersionConflictError,
)
from locks.lock_nodes import (column_tokens, guard_path, lock_path, stored_locks,
                              view_state)
from tally.meta import MetadataStore, join_path, node_name


class ColumnLockService:
    def __init__(self, store: MetadataStore, clock: Callable[[], float] = time.time,
                 on_change: Callable[[int, "bool | frozenset[int]"], None] | None = None):
        self.store = store
        self.clock = clock
        self.on_change = on_change or (lambda table_id, fencing: None)

    # --- reading ------------------------------------------------------------------------------

    def records(self, table_id: int) -> dict[str, tuple[LockRecord, int]]:
        """{owner node name: (record, node version)} of every stored lock of a table."""
        return stored_locks(self.store, table_id)

    def describe(self, target: LockTarget, include_expired: bool = False) -> list[dict]:
        now = self.clock()
        return [r.describe(now) | {"expired": not r.live(now)}
                for r, _ in sorted(self.records(target.table_id).values(), key=lambda x: x[0].token)
                if include_expired or r.live(now)]

    def holders(self) -> dict[int, tuple[int, int]]:
        """{table id: (live locks, expired locks not yet released)} of every table with a
        stored lock (what the coordinator's metrics show)."""
        now, out = self.clock(), {}
        for child in self.store.children(join_path("locks")):
            if child.isdigit():
                records = [r for r, _ in self.records(int(child)).values()]
                live = sum(1 for r in records if r.live(now))
                if records:
                    out[int(child)] = (live, len(records) - live)
        return out

    def column_tokens(self, table_id: int) -> dict[int, int]:
        node = self.store.get(guard_path(table_id))
        return {} if node is None else column_tokens(node)

    def view_state(self, table_id: int) -> tuple[int, list[LockRecord], dict[int, int]]:
        """(version, records, column tokens) of the table's locks as one state (lock_nodes)."""
        return view_state(self.store, table_id)

    # --- acquiring ----------------------------------------------------------------------------

    def acquire(self, target: LockTarget, owner_id: str, columns, ttl: float,
                current_offsets: Callable[[], Offsets], principal=None) -> Lease:
        """Lock `columns` of a table for `owner_id` (see Lease) on behalf of `principal` (None:
        the servers), which must own the owner id or claims it now (see ownership).
        Primary-key columns are dropped."""
        if not isinstance(owner_id, str) or not owner_id:
            raise InvalidInputError(f"A lock owner id must be a non-empty string, got {owner_id!r}")
        node_name(owner_id, "lock owner id")  # within the metadata stores' name limit
        ttl = check_ttl(ttl)
        ids, names = self._resolve(target, columns)
        # another acquirer that changed the table's locks first: look again
        lease = self.store.transact(
            lambda: self._acquire_ops(target, owner_id, ids, names, ttl, current_offsets,
                                      principal),
            what=f"Locks of table {target.name}")
        self.on_change(target.table_id, True)
        return lease

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

    def _acquire_ops(self, target, owner_id, ids, names, ttl,
                     current_offsets, principal) -> tuple[list[tuple], Lease]:
        # judged in the transaction that records the claim: two principals racing for a
        # new owner id cannot both win it
        ownership.check("lock_acquire", principal, owner_id,
                        claimant(self.store, target.table_id, owner_id), table=target.name)
        claim = claim_ops(self.store, target.table_id, owner_id,
                          ownership.principal_id(principal))
        now = self.clock()
        guard = self.store.get(guard_path(target.table_id))
        records = self.records(target.table_id)
        mine_key = node_name(owner_id, "lock owner id")
        mine = records.get(mine_key)
        # The owner's own lock first: a tenure that can no longer be recovered is refused
        # before anyone else's expired lock is taken over on its behalf.
        continues = mine is not None and set(mine[0].column_ids) == set(ids)
        if continues:
            refuse_unrecoverable(target, mine[0], now)
        for key, (record, _) in records.items():
            if key != mine_key and set(record.column_ids) & set(ids):
                refuse_overlap(target, record, set(record.column_ids) & set(ids), now)
        if mine is not None and not continues:
            if mine[0].live(now):
                raise ColumnLockConflict(
                    f"Owner '{owner_id}' already holds a live lock on columns "
                    f"{list(mine[0].column_names)} of table {target.name}; it cannot lock "
                    f"{list(names)} as well. Release it first or use another owner id.")
            raise UnrecoveredLockError(
                f"Owner '{owner_id}' has an expired, unrecovered lock on columns "
                f"{list(mine[0].column_names)} of table {target.name} (tenure "
                f"{mine[0].tenure}); recover it with the same columns, or take it over "
                "(recovery.acquire rolls its uncommitted writes back first)")
        token, guard_op = self._next_token(guard, target.table_id, ids)
        secret = new_lease_secret()
        if continues:
            # The owner's unreleased lock (a restarted job): its tenure goes on, with the
            # offsets it began at; the token and the secret are new, which fences the earlier
            # incarnation.
            record = dataclasses.replace(mine[0], ttl=ttl, expires_at=now + ttl, token=token,
                                         secret_hash=secret_hash(secret), takeover=False,
                                         taken_over_by=None)
        else:
            record = LockRecord(
                owner_id=owner_id, table_id=target.table_id, column_ids=ids, column_names=names,
                ttl=ttl, expires_at=now + ttl, token=token,
                initial_offsets=dict(current_offsets()), created_at=now, tenure=token,
                secret_hash=secret_hash(secret), principal=ownership.principal_id(principal))
        path = lock_path(target.table_id, owner_id)
        write = ("set", path, record.to_json(), mine[1]) if mine else \
            ("create", path, record.to_json())
        return claim + [guard_op, write], record.lease(target.name, secret)

    def _next_token(self, guard, table_id: int, ids) -> tuple[int, tuple]:
        """A new fencing token, recorded as the newest for `ids`, and the guard write."""
        state = dict(guard.value) if guard else {}  # an empty guard: made as a parent node
        token = int(state.get("next_token", 1))
        tokens = dict(state.get("column_tokens", {}))
        tokens.update({str(c): token for c in ids})
        return token, self._guard_op(guard, table_id,
                                     {"next_token": token + 1, "column_tokens": tokens})

    # --- taking over expired locks ------------------------------------------------------------

    def take_over(self, target: LockTarget, owner_id: str, columns, ttl: float,
                  principal=None) -> list[Lease]:
        """Leases on every expired lock in the way of `owner_id` locking `columns`, so that the
        caller can undo their tenures' uncommitted writes and then release them.

        Each expired lock keeps its owner id, tenure and offsets and gets a new token (which
        fences its zombie) and `ttl` to live, marked as a takeover by `principal` (which must
        own `owner_id`): such a lease may only undo and release, never commit or begin an
        epoch. Live locks in the way raise ColumnLockConflict.
        """
        ttl = check_ttl(ttl)
        ids, _ = self._resolve(target, columns)
        ownership.check("lock_take_over", principal, owner_id,
                        claimant(self.store, target.table_id, owner_id), table=target.name)
        taker = ownership.principal_id(principal)
        leases = self.store.transact(lambda: self._take_over_ops(target, owner_id, ids, ttl,
                                                                 taker),
                                     what=f"Locks of table {target.name}")
        if leases:
            self.on_change(target.table_id, True)
        return leases

    def _take_over_ops(self, target, owner_id, ids, ttl,
                       taker) -> tuple[list[tuple], list[Lease]]:
        now = self.clock()
        mine_key = node_name(owner_id, "lock owner id")
        in_way = []
        for key, (record, version) in self.records(target.table_id).items():
            overlap = set(record.column_ids) & set(ids)
            if key == mine_key and set(record.column_ids) == set(ids):
                continue  # the owner's own tenure: it recovers it itself
            if key != mine_key and not overlap:
                continue
            if record.live(now):
                refuse_overlap(target, record, overlap, now)
            refuse_unrecoverable(target, record, now)
            in_way.append((record, version))
        if not in_way:
            return [], []
        guard = self.store.get(guard_path(target.table_id))
        revived_ids = sorted({c for record, _ in in_way for c in record.column_ids})
        token, guard_op = self._next_token(guard, target.table_id, revived_ids)
        ops, leases = [guard_op], []
        for record, version in in_way:
            secret = new_lease_secret()  # the taker's now; the zombie's no longer works
            revived = dataclasses.replace(record, token=token, ttl=ttl, expires_at=now + ttl,
                                          secret_hash=secret_hash(secret), takeover=True,
                                          taken_over_by=taker)
            ops.append(("set", lock_path(target.table_id, record.owner_id), revived.to_json(),
                        version))
            leases.append(revived.lease(target.name, secret))
        return ops, leases

    def discard(self, target: LockTarget, owner_id: str) -> bool:
        """Drop an expired lock without undoing anything: its writes since its last commit
        stay as they are (an operator's choice when they can no longer be undone). A live
        lock is refused; False when there is no such lock."""
        path = lock_path(target.table_id, owner_id)

        def attempt() -> tuple[list[tuple], bool]:
            node = self.store.get(path)
            if node is None:
                return [], False
            record = LockRecord.from_json(node.value)
            if record.live(self.clock()):
                raise ColumnLockConflict(
                    f"The lock of owner '{owner_id}' on table {target.name} is live until "
                    f"{when(record.expires_at)}; only an expired lock can be discarded")
            return [self._bump(target.table_id), ("delete", path, node.version)], True

        discarded = self.store.transact(attempt, what=f"Locks of table {target.name}")
        if discarded:
            self.on_change(target.table_id, True)
        return discarded

    def _bump(self, table_id: int) -> tuple:
        """The guard write that counts a change (the lock views' version) without changing
        tokens; in the change's own transaction, whose retry reads it again."""
        guard = self.store.get(guard_path(table_id))
        return self._guard_op(guard, table_id, dict(guard.value) if guard else {})

    def _guard_op(self, guard, table_id: int, value: dict):
        if guard is None:
            return ("create", guard_path(table_id), value)
        return ("set", guard_path(table_id), value, guard.version)

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
        self._check_secret(lease, record)
        if not record.live(self.clock()):
            raise LeaseLostError(
                f"The lease of owner '{lease.owner_id}' on table {lease.table} expired at "
                f"{record.expires_at:.3f}; re-acquire it (its initial offsets are kept)")
        return record, node.version

    @staticmethod
    def _check_secret(lease: Lease, record: LockRecord) -> None:
        """The token is public; only the acquirer knows the secret it was granted with."""
        if not secret_matches(lease.secret, record.secret_hash):
            raise PermissionDeniedError(
                f"The lease of owner '{lease.owner_id}' on table {lease.table} (token "
                f"{lease.token}) does not carry the secret its lock was granted with: only "
                "the acquirer may act as the owner; nothing was changed")

    def renew(self, lease: Lease) -> Lease:
        """Extend a lease by its ttl; LeaseLostError once it expired or was superseded."""
        def attempt() -> tuple[list[tuple], Lease]:
            record, version = self.current(lease)
            renewed = dataclasses.replace(record, expires_at=self.clock() + record.ttl)
            return [self._bump(lease.table_id),
                    ("set", lock_path(lease.table_id, lease.owner_id), renewed.to_json(),
                     version)], renewed.lease(lease.table, lease.secret)

        renewed = self.store.transact(attempt, what=f"the lock of owner '{lease.owner_id}'",
                                      doing=f"renew the lease on {lease.table}")
        self.on_change(lease.table_id, False)  # only a later expiry: nobody is fenced
        return renewed

    def register_attempt(self, lease: Lease, bucket: int) -> int:
        """A new attempt number for the owner's writes to `bucket` (of every partition): once
        this returns, tablet servers reject the owner's writes there from older attempts."""
        return self.register_attempts(lease, [bucket])[bucket]

    def register_attempts(self, lease: Lease, buckets, guard=None) -> dict[int, int]:
        """`register_attempt` for several buckets in one metadata transaction and one push of
        the lock view: {bucket: its new attempt number}. `guard()` (optional) returns more
        "check" ops for that transaction, or raises: the attempts are registered only while
        what it checked holds (an epoch's run not aborted, say)."""
        buckets = check_buckets(buckets)

        def attempt() -> tuple[list[tuple], dict[int, int]]:
            record, version = self.current(lease)
            numbers = {b: record.attempts.get(b, 0) + 1 for b in buckets}
            updated = dataclasses.replace(record, attempts={**record.attempts, **numbers})
            checks = list(guard()) if guard is not None else []
            return checks + [self._bump(lease.table_id),
                             ("set", lock_path(lease.table_id, lease.owner_id),
                              updated.to_json(), version)], numbers

        numbers = self.store.transact(attempt, what=f"the lock of owner '{lease.owner_id}'",
                                      doing=f"register attempts on {lease.table}")
        self.on_change(lease.table_id, frozenset(buckets))
        return numbers

    def release(self, lease: Lease) -> bool:
        """Drop the lock if `lease` is still its newest token; a superseded lease does nothing,
        and one without the lock's secret is refused."""
        node = self.store.get(lock_path(lease.table_id, lease.owner_id))
        if node is None or LockRecord.from_json(node.value).token != lease.token:
            return False
        self._check_secret(lease, LockRecord.from_json(node.value))

        def attempt() -> tuple[list[tuple], bool]:
            # the lock node's version pins the lease read above: if it moved (renewed,
            # superseded, gone), the release is lost, never retried against a newer grant
            now = self.store.get(lock_path(lease.table_id, lease.owner_id))
            if now is None or now.version != node.version:
                return [], False
            return [self._bump(lease.table_id),
                    ("delete", lock_path(lease.table_id, lease.owner_id), node.version)], True

        try:
            released = self.store.transact(attempt, what=f"Locks of table {lease.table}")
        except VersionConflictError:
            return False
        if released:
            self.on_change(lease.table_id, True)
        return released

    def drop_table(self, table_id: int) -> None:
        """Forget every lock of a dropped table."""
        self.store.delete(guard_path(table_id), recursive=True)

"""The coordinator's lock, commit and retention actions (column locks and undo baselines).

ColumnLockService and CommitLog keep the locks; this module maps them onto DoAction names, resolves
table names to ids and schemas, and supplies the table's current offsets for initial offsets and
baselines. Every lock change goes to the tablet servers through LockViewPublisher: in the
background, and, for a change that fences, confirmed by the table's bucket leaders *before* the
call answers, so that no write under a superseded token is accepted once a new lease exists
(see docs/locks.md).
"""

from __future__ import annotations

import logging

from locks import ColumnLockService, CommitLog, Lease, LockTarget, owner_claims, ownership
from locks.caller import caller
from locks.commits import check_epoch, refuse_takeover
from locks.lock_nodes import lock_path
from locks.request import check_buckets
from locks.lease import offsets_from_json, offsets_to_json
from locks.view_publisher import LockViewPublisher
from tally.errors import InvalidInputError, LeaseLostError, RecoveryError
from tally.wire.messages import field, int_items

log = logging.getLogger(__name__)


def offsets_field(body: dict, name: str) -> dict:
    """Offsets sent as [[partition (text or null), bucket, offset], ...], checked strictly."""
    items = field(body, name, list)
    for item in items:
        if not (isinstance(item, list) and len(item) == 3
                and (item[0] is None or isinstance(item[0], str))):
            raise InvalidInputError(f"{name} are [partition, bucket, offset] triples, not {item!r}")
        int_items(item[1:], name)
    return offsets_from_json(items)


def lease_field(body: dict) -> Lease:
    """The lease a request carries, every field of the right JSON type (Lease.from_json would
    coerce "1" or 1.5 into a token or table id)."""
    doc = field(body, "lease", dict)
    for name in ("table", "owner_id", "secret"):
        field(doc, name, str)
    for name in ("table_id", "token", "tenure"):
        field(doc, name, int)
    for name in ("expires_at", "ttl"):
        if isinstance(doc.get(name), bool) or not isinstance(doc.get(name), (int, float)):
            raise InvalidInputError(f"lease field {name!r} must be a number")
    if not all(isinstance(c, str) for c in field(doc, "columns", list)):
        raise InvalidInputError("lease field 'columns' must hold column names")
    offsets_field(doc, "initial_offsets")
    return Lease.from_json(doc)


class CoordinatorLocks:
    """Adds the lock actions to a Coordinator."""

    def __init__(self, coordinator) -> None:
        self.coordinator = coordinator
        self.catalog = coordinator.catalog
        self.locks = ColumnLockService(coordinator.store, clock=coordinator.clock,
                                       on_change=lambda table_id, fencing:
                                       self.views.changed(table_id, fencing))
        self.views = LockViewPublisher(coordinator, self.locks)
        self.commits = CommitLog(coordinator.store, self.locks)
        coordinator.actions.update({
            "lock_acquire": self.acquire,
            "lock_renew": self.renew,
            "lock_release": self.release,
            "lock_take_over": self.take_over,
            "lock_discard": self.discard,
            "undo_baselines": self.undo_baselines,
            "lock_reassign": self.reassign,
            "register_attempt": lambda body: self.locks.register_attempt(
                self.lease(body, "register_attempt"), field(body, "bucket", int)),
            "register_attempts": lambda body: sorted(self.locks.register_attempts(
                self.lease(body, "register_attempts"),
                check_buckets(field(body, "buckets", list))).items()),
            "lock_describe": self.describe,
            "lock_view": self.view_action,
            "commit": self.commit,
            "commit_together": self.commit_together,
            "last_commit": self.last_commit,
            "epoch_baseline": self.epoch_baseline,
            "epoch_begin": self.epoch_begin,
            "epoch_abort": self.epoch_abort,
            "retention_floor": self.retention_floor,
        })

    # --- helpers ------------------------------------------------------------------------

    def target(self, name: str) -> LockTarget:
        record = self.catalog.get_table(name)
        descriptor = self.coordinator.parse_descriptor(record.descriptor)
        return LockTarget(record.name, record.table_id, descriptor.schema,
                          descriptor.expired_lock_retention_ms / 1000.0)

    def lease(self, body: dict, call: str) -> Lease:
        """The request's lease, once the caller may make `call` under its owner id."""
        lease = lease_field(body)
        record = self.catalog.get_table(lease.table)
        if record.table_id != lease.table_id:
            raise RecoveryError(
                f"Table {lease.table} was dropped and re-created (id {lease.table_id} is now "
                f"{record.table_id}): the lease of owner '{lease.owner_id}' is void")
        self.check_owner(call, lease)
        return lease

    def check_owner(self, call: str, lease: Lease) -> None:
        """PermissionDeniedError unless the caller owns the lease's owner id, or holds the
        lock by a takeover and `call` is one a taker may make (see ownership)."""
        principal = caller()
        if ownership.principal_id(principal) is None:
            return  # the servers, or a cluster without credentials: one trusted principal
        node = self.coordinator.store.get(lock_path(lease.table_id, lease.owner_id))
        held = None if node is None else node.value
        taker = held.get("taken_over_by") if held and held.get("takeover") and \
            held.get("token") == lease.token else None
        ownership.check(call, principal, lease.owner_id,
                        owner_claims.claimant(self.coordinator.store, lease.table_id,
                                              lease.owner_id),
                        table=lease.table, taker=taker)

    def view(self, table_id: int):
        return self.views.view(table_id)

    # --- actions ------------------------------------------------------------------------

    def acquire(self, body: dict) -> dict:
        target = self.target(field(body, "table", str))
        ttl = body.get("ttl", 60)
        if isinstance(ttl, bool) or not isinstance(ttl, (int, float)):
            raise InvalidInputError(f"ttl must be a number of seconds, not {ttl!r}")
        lease = self.locks.acquire(
            target, field(body, "owner_id", str), field(body, "columns", list), ttl,
            lambda: self.coordinator.list_offsets(target.name, settle=True),
            principal=caller())
        return lease.to_json()

    def renew(self, body: dict) -> dict:
        return self.locks.renew(self.lease(body, "lock_renew")).to_json()

    def release(self, body: dict) -> bool:
        """Release ends the tenure: its uncommitted epochs' baselines go with it."""
        lease = lease_field(body)
        self.check_owner("lock_release", lease)
        released = self.locks.release(lease)
        if released:
            self.commits.forget_baselines(lease.table_id, lease.owner_id)
        return released

    def take_over(self, body: dict) -> list[dict]:
        target = self.target(field(body, "table", str))
        leases = self.locks.take_over(target, field(body, "owner_id", str),
                                      field(body, "columns", list), body.get("ttl", 60),
                                      principal=caller())
        return [lease.to_json() for lease in leases]

    def discard(self, body: dict) -> bool:
        target = self.target(field(body, "table", str))
        owner_id = field(body, "owner_id", str)
        discarded = self.locks.discard(target, owner_id)
        if discarded:
            self.commits.forget_baselines(target.table_id, owner_id)
        return discarded

    def reassign(self, body: dict) -> dict:
        """An admin's call: make `principal` (a client of the auth file) the owner id's
        principal on the table, e.g. when a job moves to another service account. An id an
        auth file grant matches belongs to its grantees: that is changed in the auth file."""
        target = self.target(field(body, "table", str))
        owner_id, to = field(body, "owner_id", str), field(body, "principal", str)
        principal = caller()
        grants = getattr(principal, "grants", None) or ownership.NO_GRANTS
        if grants.principals and to not in grants.principals:
            raise InvalidInputError(
                f"no client {to!r} in the auth file: an owner id is reassigned to one of "
                f"{sorted(grants.principals)}")
        granted = grants.granted(ownership.OWNERS, owner_id)
        if granted:
            raise InvalidInputError(
                f"owner id '{owner_id}' matches the auth file's grants of "
                f"{', '.join(repr(p) for p in granted)}: it belongs to them; change the auth "
                "file to move it. Nothing was changed")
        before = owner_claims.reassign(self.coordinator.store, target.table_id, owner_id, to)
        log.info("owner id '%s' on %s reassigned from %s to %s", owner_id, target.name,
                 before, to)
        return {"owner_id": owner_id, "principal": to, "before": before}

    def undo_baselines(self, body: dict) -> list:
        """[offsets, why] an undo of the lease's tenure starts from (see CommitLog)."""
        lease = self.lease(body, "undo_baselines")
        offsets, source = self.commits.undo_baselines(
            lease.table_id, lease.owner_id, lease.tenure, lease.initial_offsets)
        return [offsets_to_json(offsets), source]

    def describe(self, body: dict) -> list[dict]:
        return self.locks.describe(self.target(field(body, "table", str)),
                                   include_expired=bool(body.get("include_expired")))

    def view_action(self, body: dict) -> dict:
        return self.view(field(body, "table_id", int)).to_json()

    def commit(self, body: dict) -> bool:
        return self.commits.commit(self.lease(body, "commit"), field(body, "epoch", int),
                                   offsets_field(body, "offsets"))

    def commit_together(self, body: dict) -> list[bool]:
        """One epoch's commits of several owners (a source and its rollups), all or none;
        each lease is checked as a single commit's is."""
        items = field(body, "commits", list)
        if not items:
            raise InvalidInputError("commit_together needs at least one commit")
        commits = []
        for item in items:
            if not isinstance(item, dict):
                raise InvalidInputError("each commit is an object with 'lease' and 'offsets'")
            commits.append((self.lease(item, "commit"), offsets_field(item, "offsets")))
        return self.commits.commit_together(commits, field(body, "epoch", int))

    def last_commit(self, body: dict):
        record = self.catalog.get_table(field(body, "table", str))
        found = self.commits.last_commit(record.table_id, field(body, "owner_id", str))
        return None if found is None else [found.epoch, offsets_to_json(found.offsets),
                                           found.tenure]

    def epoch_baseline(self, body: dict) -> list:
        lease = self.lease(body, "epoch_baseline")
        offsets = self.commits.epoch_baseline(
            lease, field(body, "epoch", int),
            lambda: self.coordinator.list_offsets(lease.table, settle=True))
        return offsets_to_json(offsets)

    def epoch_begin(self, body: dict) -> dict:
        """Everything a writer needs before an epoch's first write, in one call: a new attempt
        for each of `buckets` (pushed to the tablet servers, so every earlier attempt of the
        owner there is fenced from now on), every bucket's end offset read after that push
        (no fenced attempt can move them any more), and the epoch's baseline, stored
        insert-if-absent from those offsets (a replayed epoch keeps its first baseline)."""
        lease = self.lease(body, "epoch_begin")
        epoch = check_epoch(field(body, "epoch", int))  # every field checked before any change
        buckets = check_buckets(field(body, "buckets", list))
        record, _ = self.locks.current(lease)  # a forged or superseded lease learns nothing more
        refuse_takeover(record, lease, f"begin epoch {epoch}")
        self.coordinator.rollups.refuse_building(lease.table_id, lease.table)
        last = self.commits.last_commit(lease.table_id, lease.owner_id)
        if last is not None and last.epoch >= epoch:
            raise LeaseLostError(
                f"Epoch {epoch} of owner '{lease.owner_id}' on {lease.table} is committed "
                f"already (last commit: epoch {last.epoch}): a writer of it still running is "
                "stale and may not write")
        run = body.get("run")
        if run is not None:
            # a task of a run the driver began: registered only while that run stands
            if not isinstance(run, int) or isinstance(run, bool) or run < 0:
                raise InvalidInputError(f"An epoch's run is a non-negative integer, got {run!r}")
            guard = self.commits.run_guard(lease, epoch, run)
        else:
            guard = None
        attempts = self.locks.register_attempts(lease, buckets, guard=guard)
        offsets = self.coordinator.list_offsets(lease.table, settle=True)
        baseline = self.commits.epoch_baseline(lease, epoch, lambda: offsets)
        return {"baseline": offsets_to_json(baseline), "offsets": offsets_to_json(offsets),
                "attempts": [[b, n] for b, n in sorted(attempts.items())],
                "run": self.commits.epoch_run(lease, epoch) if run is None else run}

    def epoch_abort(self, body: dict) -> int:
        """Abort the epoch's current run before a rollback (see CommitLog.abort_run)."""
        return self.commits.abort_run(self.lease(body, "epoch_abort"), field(body, "epoch", int))

    def retention_floor(self, body: dict) -> dict:
        """Per bucket, the oldest offset an unreleased lock tenure still needs for undo: its
        last commit in the tenure (else the tenure's start) and its uncommitted epochs'
        baselines. Retention must keep it. Expired tenures hold it for the table's
        `table.log.retention.expired-lock-ms` after their expiry, then no longer (their undo
        is then refused). While a tenure holds, a bucket it has no offset for (a partition
        created since) needs offset 0."""
        table_id = field(body, "table_id", int)
        target = self.target(self.catalog.table_by_id(table_id).name)
        floor: dict = {}

        def need(offsets):
            for key, offset in offsets.items():
                floor[key] = min(floor.get(key, offset), offset)

        now = self.locks.clock()
        holding = 0
        for record, _ in self.locks.records(table_id).values():
            if not record.recoverable(now, target.expired_hold):
                continue
            holding += 1
            need(self.commits.undo_baselines(table_id, record.owner_id, record.tenure,
                                             record.initial_offsets)[0])
            for baseline in self.commits.pending_baselines(table_id, record.owner_id,
                                                           record.tenure).values():
                need(baseline)
        return {"offsets": offsets_to_json(floor), "holding_locks": holding}

    def drop_table(self, table_id: int) -> None:
        self.locks.drop_table(table_id)
        self.commits.drop_table(table_id)
        owner_claims.drop_table(self.coordinator.store, table_id)

    def close(self) -> None:
        self.views.close()

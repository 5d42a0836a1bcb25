"""The coordinator's side of replication: elections, in-sync sets, replacements, and telling
tablet servers what they hold.

Every bucket's BucketReplicas lives in its partition's metadata node (catalog). This class

- answers `server_buckets` (a tablet server's roles: which buckets it leads or follows, under
  which leader epoch) and `bucket_replicas` (the same facts per table, for people);
- applies `alter_isr`, the leader's request to add a caught-up follower to its in-sync set or
  drop a lagging one, only while that leader still holds the epoch it names: a deposed leader
  cannot shrink the set to acknowledge writes alone, and a leader that proposes from a set the
  coordinator has changed since is answered with the current set instead;
- takes a tablet server that comes back as a new process out of the in-sync sets its copies
  may no longer deserve, before it gets any role (server_incarnations);
- runs a loop that, whenever the live servers change (and every few seconds besides), elects a
  new leader for each bucket whose leader is gone, drops dead followers from in-sync sets, and
  re-creates on live servers the copies of a server gone longer than `replace_after`.

Servers learn of changes from the version in every heartbeat answer, and sooner from a
`replicas_changed` nudge sent right after a change (best effort: the heartbeat is the
guarantee).
"""

from __future__ import annotations

import logging
import threading
import time
import uuid

from tally.errors import InvalidInputError, NotFoundError, StaleMetadataError, TallyError
from tally.server.coordinator.catalog import BucketReplicas, PartitionRecord
from tally.server.coordinator.departure_probe import refuses_connections
from tally.server.coordinator.leader_moves import LeaderMoves
from tally.server.coordinator.replica_placement import (elect, min_insync_replicas, place, replace,
                                                        replica_lag_time_ms, replication_factor,
                                                        without_dead_followers)
from tally.server.coordinator.server_incarnations import ServerIncarnations
from tally.server.settings import REPLICA_LAG_TIME
from tally.wire.messages import field

log = logging.getLogger(__name__)

CHECK_INTERVAL = 0.5        # seconds between looks for changes of the live servers
FULL_CHECK_INTERVAL = 5.0   # seconds between checks of every bucket when nothing changed
NUDGE_TIMEOUT = 2.0         # a `replicas_changed` nudge to a wedged server gives up after this


class ReplicaControl:
    """Added to a Coordinator; adds the replication actions to its action table."""

    def __init__(self, coordinator, default_factor: int = 1, replace_after: float = 60.0,
                 grace: float = 0.0, clock=time.monotonic,
                 lag_time: float = REPLICA_LAG_TIME) -> None:
        """`grace`: seconds after start before servers not seen live count as gone: a
        coordinator that has just started has heard no heartbeats yet, and electing then
        would depose every leader for nothing. It ends early once every known server has
        been seen live. `lag_time`: seconds a follower may go without catching up before
        its leader takes it out of the in-sync set, for tables that set no
        `table.replication.lag-time-ms`."""
        self.coordinator = coordinator
        self.catalog = coordinator.catalog
        self.default_factor = default_factor
        self.replace_after = replace_after
        self.default_lag_ms = max(1, round(lag_time * 1000))
        self._clock = clock
        self._acting_from = clock() + grace
        self._instance = uuid.uuid4().hex[:8]
        self._changes = 0
        self._lock = threading.Lock()
        self._dead_since: dict[str, float] = {}
        self._last_live: frozenset[str] | None = None
        self._last_full = 0.0
        # table id -> (descriptor, (min isr, lag time ms))
        self._settings: dict[int, tuple[str, tuple[int, int]]] = {}
        self.incarnations = ServerIncarnations(self)
        self.moves = LeaderMoves(coordinator, self._changed)
        coordinator.actions.update({
            "bucket_replicas": self.bucket_replicas,
            "server_buckets": self.server_buckets,
            "alter_isr": self.alter_isr,
            "move_leader": self.moves.move_leader,
        })
        self._lease_recheck: float | None = None  # when a leader's lease that kept it runs out
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread = threading.Thread(target=self._run, name="replica control", daemon=True)
        self._thread.start()

    @property
    def version(self) -> str:
        """Changes whenever any bucket's replicas change (and with every coordinator start)."""
        return f"{self._instance}:{self._changes}"

    # --- placement ------------------------------------------------------------------------

    def place(self, descriptor, bucket_count: int, salt: int,
              live: list[str]) -> tuple[BucketReplicas, ...]:
        factor = self.validate(descriptor)
        return place(live, bucket_count, factor, salt)

    def validate(self, descriptor) -> int:
        """The table's replication factor, its replication options checked (a bad value is
        refused at create, InvalidOptionError naming the option)."""
        factor = replication_factor(descriptor, self.default_factor)
        min_insync_replicas(descriptor, factor)
        replica_lag_time_ms(descriptor, self.default_lag_ms)
        return factor

    def created(self, buckets) -> None:
        """New buckets exist: their servers take their roles now."""
        self._changed({s for r in buckets for s in r.replicas})

    # --- actions --------------------------------------------------------------------------

    def bucket_replicas(self, body: dict) -> list[list]:
        """[[partition, bucket, leader, replicas, isr, leader_epoch], ...] of one table."""
        record = self.coordinator.named_table(body)
        out = []
        for p in self.catalog.partitions(record.table_id):
            for b, r in enumerate(p.buckets):
                out.append([p.name, b, r.leader, list(r.replicas), list(r.isr), r.leader_epoch])
        return out

    def server_buckets(self, body: dict) -> dict:
        """The buckets one tablet server holds a copy of, with its role in each. A server
        that asks as a new process (`incarnation`) leaves the in-sync sets first."""
        server_id = field(body, "server_id", str)
        self.incarnations.heard(server_id, field(body, "incarnation", str, None))
        # read before the roles: a label never newer than what it labels (a leader lease
        # renews only with roles at least as new as the heartbeat answer's version)
        version = self.version
        live = self.coordinator.liveness.live()
        out = []
        for table_id, p in self._all_partitions():
            for b, r in enumerate(p.buckets):
                if server_id not in r.replicas:
                    continue
                try:
                    min_isr, lag_ms = self._table_settings(table_id, len(r.replicas))
                except NotFoundError:
                    continue
                out.append({"table_id": table_id, "partition_id": p.partition_id,
                            "partition": p.name, "bucket": b, "leader": r.leader,
                            "leader_address": live.get(r.leader) if r.leader else None,
                            "replicas": list(r.replicas), "isr": list(r.isr),
                            "leader_epoch": r.leader_epoch, "min_isr": min_isr,
                            "lag_time_ms": lag_ms})
        return {"version": version, "buckets": out}

    def alter_isr(self, body: dict) -> dict:
        """A leader changes its bucket's in-sync set; refused (StaleMetadataError) unless it
        still leads under `leader_epoch`. The set must hold the leader and only replicas.
        With `current_isr` (the set the proposal was made from), a set the coordinator has
        changed since is kept and returned: the leader proposes again from it, so it never
        puts back a follower the coordinator took out (a restarted server)."""
        table_id, partition_id = field(body, "table_id", int), field(body, "partition_id", int)
        bucket, epoch = field(body, "bucket", int), field(body, "leader_epoch", int)
        leader = field(body, "leader", str)
        isr = field(body, "isr", list)
        based_on = field(body, "current_isr", list, None)
        if not all(isinstance(s, str) for s in isr) or leader not in isr:
            raise InvalidInputError(f"an in-sync set must list server ids and hold the leader, "
                                    f"not {isr!r}")
        partition = self.catalog.partition_by_id(table_id, partition_id)

        def change(buckets):
            buckets = list(buckets)
            if not 0 <= bucket < len(buckets):
                raise NotFoundError(f"table id {table_id} has no bucket {bucket}")
            current = buckets[bucket]
            if current.leader != leader or current.leader_epoch != epoch:
                raise StaleMetadataError(
                    f"server {leader} no longer leads bucket {bucket} of table id {table_id} "
                    f"under epoch {epoch} (leader {current.leader}, epoch "
                    f"{current.leader_epoch}): its in-sync change was refused")
            if based_on is not None and set(based_on) != set(current.isr):
                return buckets
            stray = [s for s in isr if s not in current.replicas]
            if stray:
                raise InvalidInputError(f"servers {stray} hold no copy of bucket {bucket}")
            buckets[bucket] = BucketReplicas(leader, current.replicas,
                                             tuple(s for s in current.replicas if s in isr),
                                             epoch)
            return buckets

        updated = self.catalog.update_buckets(table_id, partition.name, change)
        if updated is None:
            raise NotFoundError(f"partition id {partition_id} of table id {table_id} is gone")
        self._changed(set(updated.buckets[bucket].replicas))
        return updated.buckets[bucket].to_json()

    # --- the loop -------------------------------------------------------------------------

    def wake(self) -> None:
        """The live servers changed (a departure was noticed): check now, not at the next
        half second."""
        self._wake.set()

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(CHECK_INTERVAL)
            self._wake.clear()
            if self._stop.is_set():
                return
            try:
                self.check()
            except TallyError as e:
                log.warning("replica check failed (retried): %s", e)
            except Exception:  # the loop must outlive anything: failover depends on it
                log.exception("replica check failed (retried)")

    def check(self, force: bool = False) -> int:
        """One pass: elections, in-sync shrinks, replacements. Returns buckets changed."""
        now = self._clock()
        live = self.coordinator.liveness.live()
        live_set = frozenset(live)
        known = self.catalog.known_servers()
        if now < self._acting_from:
            if not set(known) <= live_set | self._refusing(known, live_set):
                return 0
            # every server this cluster knows has been heard (or its process is gone): the
            # grace has nothing left to wait for, and a departure is acted on at once
            self._acting_from = now
        # a leader that is not live may still hold a lease it was granted: it is deposed only
        # once that has run out (lease_grants)
        with self.coordinator.leases.deposing(set(known) - live_set) as free:
            return self._check(now, live_set, known, (set(known) - live_set) - free, force)

    def _refusing(self, known: dict[str, str], live: frozenset[str]) -> set[str]:
        """Known servers not heard since this coordinator started whose port refuses
        connections: their processes are gone, so the grace need not wait for them and they
        hold no lease (a leader killed while the coordinator restarted fails over at once)."""
        gone = set()
        for sid in set(known) - live:
            if refuses_connections(known[sid]):
                self.coordinator.leases.end(sid)
                gone.add(sid)
        return gone

    def _check(self, now: float, live_set: frozenset[str], known, held: set[str],
               force: bool) -> int:
        leases = self.coordinator.leases
        if held:  # look again the moment the first of their leases has run out
            self._lease_recheck = min(leases.held_until(sid) for sid in held)
        elif self._lease_recheck is not None and leases.now() >= self._lease_recheck:
            self._lease_recheck, force = None, True
        for sid in known:
            if sid in live_set:
                self._dead_since.pop(sid, None)
            else:
                self._dead_since.setdefault(sid, now)
        overdue = {sid for sid, since in self._dead_since.items()
                   if now - since >= self.replace_after}
        if not (force or overdue or live_set != self._last_live
                or now - self._last_full >= FULL_CHECK_INTERVAL):
            return 0
        self._last_live, self._last_full = live_set, now
        changed = 0
        partitions = list(self._all_partitions())
        load: dict[str, int] = {}
        for _, p in partitions:
            for r in p.buckets:
                for s in r.replicas:
                    load[s] = load.get(s, 0) + 1
        for table_id, p in partitions:
            touched: set[str] = set()

            def change(buckets, touched=touched):
                out = []
                for r in buckets:
                    new = r
                    if new.leader not in live_set and new.leader not in held:
                        new = elect(new, live_set)
                    new = without_dead_followers(new, live_set)
                    if new.leader is not None:
                        for gone in overdue & set(new.replicas):
                            moved = replace(new, gone, load, live_set)
                            if moved != new:
                                for s in set(moved.replicas) - set(new.replicas):
                                    load[s] = load.get(s, 0) + 1
                                new = moved
                    if new != r:
                        touched.update(r.replicas)
                        touched.update(new.replicas)
                        log.info("bucket of table id %d partition %s: %s -> %s", table_id,
                                 p.name, r.to_json(), new.to_json())
                    out.append(new)
                return out

            if not any(self._needs_change(r, live_set, overdue) for r in p.buckets):
                continue
            updated = self.catalog.update_buckets(table_id, p.name, change)
            if updated is not None and touched:
                changed += sum(1 for a, b in zip(p.buckets, updated.buckets) if a != b)
                self._changed(touched)
        return changed

    @staticmethod
    def _needs_change(r: BucketReplicas, live: frozenset[str], overdue: set[str]) -> bool:
        if r.leader not in live:
            return bool(set(r.isr) & live) or r.leader is not None
        if any(s not in live for s in r.isr):
            return True
        return bool(overdue & set(r.replicas))

    def _changed(self, servers: set[str]) -> None:
        """Bump the version and nudge the live servers involved to fetch their roles now."""
        with self._lock:
            self._changes += 1
        live = self.coordinator.liveness.live()
        for sid in servers:
            address = live.get(sid)
            if address is not None:
                threading.Thread(target=self._nudge, args=(address,), daemon=True,
                                 name=f"nudge {sid}").start()

    def changed(self, servers: set[str]) -> None:
        """A bucket's replicas were changed outside this loop (a restore): tell the servers."""
        self._changed(servers)

    def all_partitions(self):
        """(table id, PartitionRecord) of every partition of every table."""
        return self._all_partitions()

    def _nudge(self, address: str) -> None:
        try:
            self.coordinator.channels.get(address).action("replicas_changed", {},
                                                          timeout=NUDGE_TIMEOUT)
        except TallyError as e:
            log.info("tablet server at %s will learn of the change from its heartbeat: %s",
                     address, e)

    # --- helpers --------------------------------------------------------------------------

    def _all_partitions(self):
        """(table id, PartitionRecord) of every partition of every table."""
        for child in self.catalog.store.children("/tables"):
            try:
                table_id = int(child)
            except ValueError:
                continue
            try:
                partitions: list[PartitionRecord] = self.catalog.partitions(table_id)
            except NotFoundError:
                continue
            for p in partitions:
                yield table_id, p

    def _table_settings(self, table_id: int, factor: int) -> tuple[int, int]:
        """(min in-sync replicas, replica lag time in ms) of a table's buckets."""
        record = self.catalog.table_by_id(table_id)
        cached = self._settings.get(table_id)
        if cached is not None and cached[0] == record.descriptor:
            return cached[1]
        descriptor = self.coordinator.parse_descriptor(record.descriptor)
        value = (min(min_insync_replicas(descriptor, factor), factor),
                 replica_lag_time_ms(descriptor, self.default_lag_ms))
        self._settings[table_id] = (record.descriptor, value)
        return value

    def out_of_sync(self) -> dict[str, list[str]]:
        """Per server, the buckets whose copy on it is out of the in-sync set (what `tally
        servers` shows beside each server)."""
        out: dict[str, list[str]] = {}
        names: dict[int, str] = {}
        for table_id, p in self._all_partitions():
            for b, r in enumerate(p.buckets):
                for sid in r.replicas:
                    if sid in r.isr:
                        continue
                    if table_id not in names:
                        try:
                            names[table_id] = self.catalog.table_by_id(table_id).name
                        except NotFoundError:
                            names[table_id] = f"table id {table_id}"
                    where = f" partition {p.name}" if p.name is not None else ""
                    out.setdefault(sid, []).append(f"bucket {b}{where} of {names[table_id]}")
        return out

    def close(self) -> None:
        self._stop.set()
        self._wake.set()
        self._thread.join(timeout=5)

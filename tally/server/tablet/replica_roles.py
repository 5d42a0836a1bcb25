"""A tablet server's roles in the buckets it holds a copy of: leader or follower, and when.

The coordinator decides the roles (replica_control); this class applies them. It asks for them
(`server_buckets`) at start, whenever a heartbeat answer carries a new version, and when the
coordinator nudges it (`replicas_changed`); in between, a leader asks the coordinator to change
its in-sync set as followers catch up or fall silent.

Becoming a leader records the new epoch's start offset in the bucket (so a deposed leader can
find where its log parted from ours) and starts a Leadership; being deposed ends it, which
fails every write and read waiting on it. Following hands the bucket to the fetcher of its
leader's server (replica_fetcher). Role changes take the bucket's lock, so a write never lands
between the check of the role and its apply under an epoch that has ended.

Each process has an **incarnation**, a random id made when it starts and sent with every
heartbeat and role request: a server that comes back under a new one may hold an older copy
than it confirmed before (a restored backup, writes an unsynced crash lost), so the
coordinator takes it out of the in-sync sets before it gives it any role (replica_control).

It also answers the followers' calls: `replica_fetch` (changelog entries from an offset, waiting
a little for new ones) and `replica_epoch_end` (where an epoch of ours ended).
"""

from __future__ import annotations

import json
import logging
import threading
import time
import uuid

import pyarrow as pa

from tally.errors import NotLeaderError, StaleMetadataError, TallyError
from tally.server.settings import REPLICA_LAG_TIME
from tally.server.tablet.leadership import Leadership
from tally.server.tablet.replica_fetcher import Fetchers
from tally.server.tablet.tablets import TabletKey
from tally.wire.messages import field, int_items, table_to_ipc

log = logging.getLogger(__name__)

REFRESH_INTERVAL = 1.0       # seconds between the leader's in-sync checks and role refreshes
ROLE_WAIT = 5.0              # seconds a request for a bucket with no role yet waits for one
MAX_FETCH_WAIT = 5.0         # longest a fetch may wait for new records
FETCH_METADATA = b"tally.replica"


def bucket_key(item: dict) -> TabletKey:
    return TabletKey(int(item["table_id"]), int(item["partition_id"]), int(item["bucket"]))


class ReplicaRoles:
    """Added to a TabletServer; adds the replication actions to its action tables."""

    def __init__(self, server, peers) -> None:
        """`peers`: a ChannelPool with the cluster credential, to reach other tablet servers."""
        self.server = server
        self.server_id = server.server_id
        self.incarnation = uuid.uuid4().hex  # this process: a restart is a new one
        self.roles: dict[TabletKey, dict] = {}
        self.leading: dict[TabletKey, Leadership] = {}
        self._version: str | None = None
        self._lock = threading.Lock()
        self._appended = threading.Condition()
        self._generation = 0  # counts appends, so a fetch never sleeps past one it missed
        self._wake = threading.Event()
        self._refreshed = threading.Condition()  # notified after every refresh of the roles
        self._refreshes = 0
        self._stop = threading.Event()
        self.fetchers = Fetchers(self, peers)
        server.actions.update({
            "replicas_changed": lambda body: self._wake.set(),
            "replica_epoch_end": self.epoch_end,
        })
        server.binary_actions["replica_fetch"] = self.fetch
        self._thread = threading.Thread(target=self._run, name="replica roles", daemon=True)
        server.metrics.watch_replication(self.replication_state)

    def start(self) -> None:
        try:
            self.refresh()
        except TallyError as e:
            log.info("roles not known yet (asked again shortly): %s", e)
        self._thread.start()

    # --- what the write and read paths ask -------------------------------------------------

    def leadership(self, key: TabletKey, label: str) -> Leadership:
        """This server's leadership of a bucket, or NotLeaderError (the client re-routes).
        A bucket this server does not lead by what it last heard waits for one refresh of its
        roles first: the first write to a new table, or to a bucket whose leadership just moved
        here, is not refused for a role that is on its way."""
        with self._lock:
            lead = self.leading.get(key)
            role = self.roles.get(key)
        if lead is None or lead.ended:
            # a client sent this here because the coordinator says this server leads it (or
            # a new table's role is on its way): hear the coordinator once before refusing
            lead, role = self._await_role(key)
        if lead is None or lead.ended:
            self._wake.set()  # a bucket made since our last refresh, or a change we missed
            leader = role.get("leader") if role else None
            where = "it is taking the lead (retry)" if leader == self.server_id else \
                f"server {leader} leads it" if leader else "its leader is not known here yet"
            raise NotLeaderError(f"{label} is not led by tablet server {self.server_id}: "
                                 f"{where}")
        return lead

    def _await_role(self, key: TabletKey):
        """Wait (a few seconds at most) until a refresh begun after this call has ended; the
        bucket's leadership and role then."""
        deadline = time.monotonic() + ROLE_WAIT
        with self._refreshed:
            wanted = self._refreshes + 2  # one may be under way since before the bucket was made
            self._wake.set()
            while self._refreshes < wanted and time.monotonic() < deadline:
                self._refreshed.wait(deadline - time.monotonic())
        with self._lock:
            return self.leading.get(key), self.roles.get(key)

    def leads(self, key: TabletKey) -> bool:
        with self._lock:
            lead = self.leading.get(key)
        return lead is not None and not lead.ended

    def appended(self) -> None:
        """A write committed: wake the fetches waiting for new records."""
        with self._appended:
            self._generation += 1
            self._appended.notify_all()

    def heartbeat_answer(self, answer: dict) -> None:
        version = answer.get("replica_version")
        if version is not None and version != self._version:
            self._wake.set()

    # --- roles ----------------------------------------------------------------------------

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(REFRESH_INTERVAL)
            if self._stop.is_set():
                return
            try:
                if self._wake.is_set():
                    self._wake.clear()
                    self.refresh()
                self._propose_isr()
            except TallyError as e:
                log.info("replica roles: %s (retried)", e)
            except Exception:  # failover depends on this thread: it must outlive anything
                log.exception("replica roles failed (retried)")

    def refresh(self) -> None:
        answer = self.server.coordinator("server_buckets", {"server_id": self.server_id,
                                                            "incarnation": self.incarnation})
        roles = {bucket_key(item): item for item in answer["buckets"]}
        for key, role in roles.items():
            try:
                self._apply(key, role)
            except TallyError as e:
                log.warning("cannot take role in %s: %s", key.describe(), e)
                self._wake.set()
        for key in set(self.roles) - set(roles):
            self._leave(key)
        self._version = answer["version"]
        self.server.leader_lease.applied(answer["version"])  # renews the lease it waited on
        with self._refreshed:
            self._refreshes += 1
            self._refreshed.notify_all()

    def _apply(self, key: TabletKey, role: dict) -> None:
        hosted = self.server.tablet(key.table_id, key.partition_id, key.bucket)
        with hosted.lock:
            with self._lock:
                old = self.leading.get(key)
                self.roles[key] = role
            if role["leader"] == self.server_id:
                self.fetchers.unfollow(key)
                if old is not None and old.epoch == role["leader_epoch"] and not old.ended:
                    old.update(role["isr"], role["min_isr"], role["replicas"], lag_time(role))
                    return
                if old is not None:
                    old.end("a newer leader epoch began here")
                epochs = hosted.tablet.leader_epochs
                if not epochs or epochs[-1][0] < role["leader_epoch"]:
                    # a new epoch starts at our log end; a restarted leader of the same epoch
                    # keeps the start it recorded then
                    hosted.tablet.record_leader_epoch(role["leader_epoch"],
                                                      hosted.tablet.log_end_offset)
                lead = Leadership(self.server_id, hosted, role["leader_epoch"],
                                  role["replicas"], role["isr"], role["min_isr"],
                                  lag_time(role))
                with self._lock:
                    self.leading[key] = lead
                log.info("leading %s under epoch %d (in sync: %s)", hosted.label,
                         role["leader_epoch"], role["isr"])
                return
            if old is not None:
                old.end(f"server {role['leader']} leads it under epoch {role['leader_epoch']}")
                with self._lock:
                    self.leading.pop(key, None)
                log.info("no longer leading %s: %s", hosted.label, role["leader"])
        if role["leader"] and role["leader_address"]:
            self.fetchers.follow(key, hosted, role)
        else:
            self.fetchers.unfollow(key)

    def forget_table(self, table_id: int) -> None:
        """A dropped table: its roles go at once, not at the next refresh."""
        with self._lock:
            keys = [k for k in self.roles if k.table_id == table_id]
        for key in keys:
            self._leave(key)

    def _leave(self, key: TabletKey) -> None:
        """This server holds no copy of the bucket any more (its copy was moved elsewhere)."""
        self.fetchers.unfollow(key)
        with self._lock:
            lead = self.leading.pop(key, None)
            self.roles.pop(key, None)
        if lead is not None:
            lead.end("this server no longer holds a copy")

    def _propose_isr(self) -> None:
        with self._lock:
            leading = list(self.leading.items())
        for key, lead in leading:
            if lead.ended:
                continue
            wanted = lead.isr_proposal()
            if wanted is None:
                continue
            before = lead.isr
            try:
                # `current_isr`: the set this proposal was made from; one the coordinator has
                # changed since (a restarted follower taken out) is not overwritten by it
                answer = self.server.coordinator("alter_isr", {
                    "table_id": key.table_id, "partition_id": key.partition_id,
                    "bucket": key.bucket, "leader": self.server_id,
                    "leader_epoch": lead.epoch, "isr": list(wanted),
                    "current_isr": sorted(before)})
            except StaleMetadataError as e:
                lead.end(str(e))
                self._wake.set()
                continue
            lead.update(answer["isr"], lead.min_isr)
            after = lead.isr
            table = lead.hosted.routing.name
            self.server.metrics.isr_changed(table, len(before - after), len(after - before))
            level = log.warning if before - after else log.info
            level("%s in sync: %s (left: %s, joined: %s)", lead.label, answer["isr"],
                  sorted(before - after), sorted(after - before))

    # --- what followers call --------------------------------------------------------------

    def epoch_end(self, body: dict) -> int:
        """Where epoch `epoch` ended in this leader's log (the first offset of the next one)."""
        key = TabletKey(field(body, "table_id", int), field(body, "partition_id", int),
                        field(body, "bucket", int))
        lead = self._checked_leadership(key, field(body, "leader_epoch", int))
        return int(lead.tablet.epoch_end_offset(field(body, "epoch", int)))

    def _checked_leadership(self, key: TabletKey, epoch: int) -> Leadership:
        lead = self.leadership(key, key.describe())
        if lead.epoch != epoch:
            raise NotLeaderError(f"{key.describe()} is led here under epoch {lead.epoch}, "
                                 f"not {epoch}")
        return lead

    def fetch(self, header: dict, payload) -> bytes:
        """Changelog entries for a follower, per bucket it names from the offset it holds up
        to; waits up to `max_wait_ms` while there are none. The answer is one Arrow table of
        entries (a `slot` column says which requested bucket) and, in its metadata, per
        bucket the high watermark, the log start, the leader epochs, or an error."""
        follower = field(header, "server_id", str)
        max_wait = min(field(header, "max_wait_ms", int, 500) / 1000, MAX_FETCH_WAIT)
        max_bytes = field(header, "max_bytes", int, 4 << 20)
        requests = field(header, "buckets", list)
        slots = [int_items(item, "buckets") for item in requests]
        generation = self._generation
        tables, meta = self._fetch_once(follower, slots, max_bytes)
        if tables or any("error" in m for m in meta) or max_wait <= 0:
            return self._encode(tables, meta)
        with self._appended:
            if self._generation == generation:
                self._appended.wait(max_wait)
        return self._encode(*self._fetch_once(follower, slots, max_bytes))

    def _fetch_once(self, follower: str, slots: list, max_bytes: int):
        from merge_engine.kv.replica_entries import ReplicatedEntry

        tables, meta = [], []
        for slot, (table_id, partition_id, bucket, epoch, offset) in enumerate(slots):
            key = TabletKey(table_id, partition_id, bucket)
            try:
                lead = self._checked_leadership(key, epoch)
            except NotLeaderError as e:
                meta.append({"error": "not_leader", "message": str(e)})
                continue
            tablet = lead.tablet
            if offset > tablet.log_end_offset:
                # a copy longer than ours under our epoch has not cut its divergent tail:
                # its offset must not count towards the high watermark
                meta.append({"error": "diverged", "log_end": tablet.log_end_offset})
                continue
            if lead.follower_fetched(follower, offset):
                log.warning("%s: follower %s now fetches from %d, below what it confirmed "
                            "before: it lost data and leaves the in-sync set", lead.label,
                            follower, offset)
                self._wake.set()  # propose the smaller in-sync set now, not in a second
            info = {"hw": lead.high_watermark(), "log_start": tablet.log_start_offset,
                    "log_end": tablet.log_end_offset,
                    "leader_epochs": [list(e) for e in tablet.leader_epochs]}
            if offset < tablet.log_start_offset:
                info["error"] = "out_of_range"
            elif offset < tablet.log_end_offset:
                try:
                    entries = tablet.replication_entries(offset, max_bytes)
                except TallyError as e:
                    info["error"] = "unreadable"
                    info["message"] = str(e)
                    entries = []
                if entries:
                    table = ReplicatedEntry.to_arrow(entries)
                    tables.append(table.append_column(
                        "slot", pa.array([slot] * table.num_rows, pa.int32())))
                    max_bytes = max(max_bytes - sum(len(e.data) for e in entries), 1)
            meta.append(info)
        return tables, meta

    def replication_state(self) -> list[tuple[str, int, int]]:
        """(table, in-sync copies, copies) of each bucket this server leads (the metrics')."""
        with self._lock:
            leading = list(self.leading.values())
        return [(lead.hosted.routing.name, len(lead.isr), len(lead.replicas))
                for lead in leading if not lead.ended]

    @staticmethod
    def _encode(tables: list, meta: list) -> bytes:
        from merge_engine.kv.replica_entries import ReplicatedEntry

        if tables:
            table = pa.concat_tables(tables)
        else:
            table = ReplicatedEntry.to_arrow([])
            table = table.append_column("slot", pa.array([], pa.int32()))
        table = table.replace_schema_metadata({FETCH_METADATA: json.dumps(meta).encode()})
        return table_to_ipc(table)

    def close(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)
        self.fetchers.close()
        with self._lock:
            for lead in self.leading.values():
                lead.end("the server is shutting down")


def lag_time(role: dict) -> float:
    """The replica lag time of a role, in seconds (the coordinator sends the table's, or its
    default; one from a coordinator that sends none is the built-in default)."""
    value = role.get("lag_time_ms")
    return REPLICA_LAG_TIME if value is None else int(value) / 1000

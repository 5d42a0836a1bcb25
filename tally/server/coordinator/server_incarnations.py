"""Which process each tablet server runs as, and what the coordinator does when that changes.

A tablet server makes a random incarnation id when its process starts and sends it with every
heartbeat and every request for its roles. The same server id under a new incarnation is a
restarted process, and its copies may hold less than it confirmed before: its data directory
may have been replaced by an older copy (a restored backup), or a crash may have lost writes
that were not synced. A leader notices a follower whose offset goes back only once it fetches
again, and an election may come first; so the coordinator acts on the new incarnation before
the server gets any role: the server leaves the in-sync set of every bucket in which another
in-sync replica is live, and a bucket it led gets another leader under the next epoch. The
copy then rejoins by catching up, like any follower, after cutting its log back by its
leader-epoch history. Where it is the last in-sync replica standing it stays (taking it out
would leave no copy that may lead), and the coordinator says so in its log.

Incarnations are kept in the server's metadata node, so a coordinator that restarted still
tells a new process from the one it knew.
"""

from __future__ import annotations

import logging
import threading

from tally.server.coordinator.replica_placement import last_standing, without_restarted

log = logging.getLogger(__name__)


class ServerIncarnations:
    def __init__(self, control) -> None:
        """`control`: the coordinator's ReplicaControl (its catalog, its live servers, and
        its nudges to the servers whose roles change)."""
        self.control = control
        self.catalog = control.catalog
        self._known: dict[str, str] = {}
        self._lock = threading.Lock()  # a heartbeat and a role request of one new process race

    def heard(self, server_id: str, incarnation: str | None) -> None:
        """`server_id` runs as `incarnation` (None: a server from before incarnations, which
        is taken at its word). Returns once a new process's copies are out of the in-sync
        sets they may no longer deserve."""
        if incarnation is None or self._known.get(server_id) == incarnation:
            return
        with self._lock:
            known = self._known.get(server_id)
            if known == incarnation:
                return
            if known is None:  # first heard by this coordinator process
                known = self.catalog.server_incarnation(server_id)
            if known is not None and known != incarnation:
                log.warning("tablet server %s runs as a new process (incarnation %s, was %s): "
                            "its copies leave the in-sync sets until they catch up", server_id,
                            incarnation, known)
                self._restarted(server_id)
            if self.catalog.set_server_incarnation(server_id, incarnation):
                self._known[server_id] = incarnation

    def _restarted(self, server_id: str) -> None:
        live = set(self.control.coordinator.liveness.live()) - {server_id}
        for table_id, p in list(self.control.all_partitions()):
            if not any(server_id in r.isr for r in p.buckets):
                continue
            touched: set[str] = set()

            def change(buckets, touched=touched):
                out = []
                for b, r in enumerate(buckets):
                    new = without_restarted(r, server_id, live)
                    if last_standing(r, server_id, live):
                        log.warning("bucket %d of table id %d partition %s: server %s is its "
                                    "only live in-sync copy and stays in sync; if its data "
                                    "was restored from an older copy, writes acknowledged "
                                    "since that copy are missing", b, table_id, p.name,
                                    server_id)
                    if new != r:
                        touched.update(r.replicas)
                        log.info("bucket %d of table id %d partition %s: %s -> %s (server %s "
                                 "restarted)", b, table_id, p.name, r.to_json(), new.to_json(),
                                 server_id)
                    out.append(new)
                return out

            self.catalog.update_buckets(table_id, p.name, change)
            if touched:
                self.control.changed(touched)

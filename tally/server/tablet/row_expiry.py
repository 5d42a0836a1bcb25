"""The row TTL's sweep on a tablet server (the rule itself: merge_engine.kv.row_ttl).

Reads never return an expired row and the next write of its key records its -D, so the sweep is
not needed for correctness: it writes the -D of rows nobody touches any more, so changelog
consumers learn of the expiry and the rows stop taking disk. Every `interval` seconds each open
bucket this server leads of a table with `table.kv.row-ttl` is swept under its bucket lock
(followers receive the expiries in their leader's changelog); the coordinator's
`expire_rows` action runs one pass now.
"""

from __future__ import annotations

import logging

from tally.errors import StorageError
from tally.server.tablet.periodic import PeriodicDuty

log = logging.getLogger(__name__)

EXPIRY_INTERVAL = 60.0


class RowExpiry:
    def __init__(self, server, interval: float = EXPIRY_INTERVAL) -> None:
        self.server = server
        server.actions["expire_rows"] = lambda body: self.sweep()
        self._loop = PeriodicDuty(self.sweep, interval, "row expiry")

    def start(self) -> None:
        self._loop.start()

    def close(self) -> None:
        self._loop.close()

    def sweep(self) -> dict:
        """One pass; {bucket label: rows expired} for the buckets where rows expired."""
        expired = {}
        for hosted in self.server.host.all_hosted():
            if hosted.tablet.descriptor.row_ttl_ms is None:
                continue
            if not self.server.replicas.leads(hosted.key):
                continue  # a follower's rows change only by its leader's changelog
            try:
                with hosted.lock:
                    count = hosted.tablet.expire_rows()
            except StorageError as e:  # a full or closed disk: the others go on
                log.info("row expiry skipped for %s: %s", hosted.label, e)
                continue
            if count:
                expired[hosted.label] = count
        return expired

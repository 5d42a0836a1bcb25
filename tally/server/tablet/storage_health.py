"""A tablet server's storage health: the buckets whose disk refused a write, reported and reopened.

Why: RocksDB turns read-only after a write it could not make (a full disk, an I/O error) and
rocksdict offers no DB::Resume, so such a bucket would refuse every write until the server
restarted. Every `interval` seconds this keeper looks for failed buckets, and once the disk has
room for a reopen (RocksDB writes its write-ahead log into a table file while it opens) it
closes the bucket and opens it again, which replays the changelog past the last flush as any
open does. Nothing acknowledged is lost: a write is acknowledged only after its changelog record
is in RocksDB's log, and a refused write left at most a torn record at the log's end, which
RocksDB drops when it opens. Until then the bucket serves point lookups and changelog reads;
writes and scans (which flush the row buffer first) are refused with the bucket's error.

The failures are the server's health too: `problems()` goes with every heartbeat, and the
coordinator shows it in `list_servers` (`tally servers`) and assigns new buckets elsewhere.
"""

from __future__ import annotations

import logging
import shutil

from merge_engine.kv.storage import reopen_bytes
from tally.errors import StorageError
from tally.server.tablet.periodic import PeriodicDuty
from tally.server.tablet.tablets import HostedTablet, TabletHost, TabletKey

log = logging.getLogger(__name__)

# Room kept beyond the write-ahead log for what an open writes besides (manifest, options, the
# first writes after it): reopening into a disk that fills again at once would only fail again.
REOPEN_HEADROOM = 1 << 20


class StorageHealth:
    """Reports and repairs the failed buckets of one TabletHost (see the module docstring)."""

    def __init__(self, host: TabletHost, interval: float) -> None:
        self._host = host
        self._loop = PeriodicDuty(self.repair, interval, "storage repair")
        self._logged: set[TabletKey] = set()  # failed buckets already in the log

    def start(self) -> None:
        self._loop.start()

    def close(self) -> None:
        self._loop.close()

    def failed(self) -> list[HostedTablet]:
        return [h for h in self._host.all_hosted() if h.tablet.storage_failure is not None]

    def problems(self) -> list[str]:
        """One line per failed bucket, e.g. "bucket 3 of db.t: no space left on device while
        writing": what the heartbeat reports."""
        return [str(h.tablet.storage_failure) for h in self.failed()]

    def repair(self) -> list[str]:
        """Reopen every failed bucket whose disk has room now; the labels of those reopened."""
        reopened = []
        for hosted in self.failed():
            if hosted.key not in self._logged:
                self._logged.add(hosted.key)
                log.warning("%s; it refuses writes until it is reopened, once its disk has room",
                            hosted.tablet.storage_failure)
            path = self._host.path(hosted.key)
            try:
                if shutil.disk_usage(path).free < reopen_bytes(path) + REOPEN_HEADROOM:
                    continue
                self._host.reopen(hosted)
            except (StorageError, OSError) as e:  # OSError: dropped (and deleted) meanwhile
                log.warning("%s could not be reopened yet: %s", hosted.label, e)
                continue
            self._logged.discard(hosted.key)
            log.info("%s reopened after a storage failure; it takes writes again", hosted.label)
            reopened.append(hosted.label)
        return reopened

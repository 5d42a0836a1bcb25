"""The KvTablets a tablet server hosts, opened on first use and kept open.

A bucket's tablet lives in `<data_dir>/tablets/<table_id>/<partition_id>/<bucket>`. The table id
is part of the path, so a dropped and re-created table never sees its predecessor's data. Each
hosted tablet has its own lock: one put, delete or read at a time per bucket, many buckets in
parallel (KvTablet makes each put atomic and durable; the lock keeps its API single-threaded).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import shutil
import threading
import time
import uuid
from typing import Callable

from merge_engine import TableDescriptor
from merge_engine.kv.budget import MemoryBudget
from merge_engine.kv.tablet import KvTablet
from tally.errors import StaleMetadataError
from tally.wire.routing import TableRouting

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class TabletKey:
    table_id: int
    partition_id: int
    bucket: int

    def describe(self, routing: TableRouting | None = None, partition: str | None = None) -> str:
        name = routing.name if routing else f"table id {self.table_id}"
        where = f" partition '{partition}'" if partition is not None else ""
        return f"bucket {self.bucket} of {name}{where}"


@dataclasses.dataclass
class HostedTablet:
    key: TabletKey
    tablet: object            # merge_engine.kv.tablet.KvTablet
    routing: TableRouting
    partition: str | None
    lock: threading.Lock = dataclasses.field(default_factory=threading.Lock)
    # The highest offset known acknowledged here: the high watermark this copy last led at,
    # or last heard from its leader as a follower. A new leader starts its high watermark
    # there, so what readers and offsets were shown never goes back after a failover.
    acknowledged: int = 0

    @property
    def label(self) -> str:
        return self.key.describe(self.routing, self.partition)


class TabletHost:
    """Opens, caches and closes the KvTablets under one data directory."""

    def __init__(self, data_dir: str, memory_budget: int | None = None, metrics=None,
                 clock: Callable[[], float] = time.time) -> None:
        """`metrics`: the server's ServerMetrics, told of every bucket opened (None: nobody).
        `clock`: the time the row TTL of hosted buckets is judged by (tests move it)."""
        self.root = os.path.join(data_dir, "tablets")
        self.metrics = metrics
        self.clock = clock
        self.budget = MemoryBudget(memory_budget) if memory_budget else None
        os.makedirs(self.root, exist_ok=True)
        self._tablets: dict[TabletKey, HostedTablet] = {}
        self._opening: dict[TabletKey, threading.Lock] = {}
        # table ids are never reused: a dropped one is never opened again, whatever a role
        # refresh that was under way during the drop still says
        self._dropped: set[int] = set()
        self._lock = threading.Lock()

    def path(self, key: TabletKey) -> str:
        return os.path.join(self.root, str(key.table_id), str(key.partition_id), str(key.bucket))

    def get(self, key: TabletKey) -> HostedTablet | None:
        with self._lock:
            return self._tablets.get(key)

    def open(self, key: TabletKey, descriptor_json: str, routing: TableRouting,
             partition: str | None) -> HostedTablet:
        """The hosted tablet for `key`, opening it (once, even under concurrent callers)."""
        with self._lock:
            self._check_not_dropped(key)
            found = self._tablets.get(key)
            if found is not None:
                return found
            opening = self._opening.setdefault(key, threading.Lock())
        with opening:
            with self._lock:
                found = self._tablets.get(key)
            if found is not None:
                return found
            path = self.path(key)
            label = key.describe(routing, partition)
            started = time.perf_counter()
            tablet = KvTablet.open(path, TableDescriptor.from_json(descriptor_json), self.budget,
                                   name=label, clock=self.clock)
            hosted = HostedTablet(key, tablet, routing, partition)
            if self.metrics is not None:
                self.metrics.opened(hosted, started)
            with self._lock:
                self._opening.pop(key, None)
                if key.table_id in self._dropped:  # dropped while it opened
                    tablet.close()
                    shutil.rmtree(path, ignore_errors=True)
                    self._check_not_dropped(key)
                self._tablets[key] = hosted
            log.info("opened %s at %s", hosted.label, path)
            return hosted

    def reopen(self, hosted: HostedTablet, descriptor: TableDescriptor | None = None) -> None:
        """Close a bucket and open it again (its disk refused a write: storage_health), or with
        a new `descriptor` (add_column). When the open fails, the bucket stays closed and
        failed, and the next repair tries again."""
        with hosted.lock:
            if self.get(hosted.key) is not hosted:
                return  # dropped meanwhile
            old = hosted.tablet
            old.close()
            if descriptor is not None:  # the routing's schema is what requests are checked by
                hosted.routing = TableRouting.from_descriptor(
                    hosted.routing.name, hosted.key.table_id, descriptor)
            started = time.perf_counter()
            hosted.tablet = KvTablet.open(self.path(hosted.key), descriptor or old.descriptor,
                                          self.budget, name=hosted.label, clock=self.clock)
            if self.metrics is not None:
                self.metrics.opened(hosted, started)

    def install(self, key: TabletKey, directory: str, descriptor_json: str,
                routing: TableRouting, partition: str | None,
                still: Callable[[], bool] = lambda: True) -> HostedTablet:
        """Make the bucket directory `directory` (a checkpoint: its RocksDB in `rocksdb`) the
        bucket's, in place of what the bucket held, and open it. `directory` must be on this
        data directory's file system: it is renamed into place, never copied. `still` is
        asked under the bucket's lock: when false (the bucket's role changed meanwhile),
        nothing is replaced and StaleMetadataError is raised."""
        hosted = self.get(key)
        if hosted is not None:
            with hosted.lock:
                if not still():
                    raise StaleMetadataError(f"{hosted.label} changed role while its copy was "
                                             f"being built; the copy was not installed")
                hosted.tablet.close()
                self._swap(key, directory)
                started = time.perf_counter()
                hosted.tablet = KvTablet.open(self.path(key), hosted.tablet.descriptor,
                                              self.budget, name=hosted.label, clock=self.clock)
                if self.metrics is not None:
                    self.metrics.opened(hosted, started)
            log.info("replaced %s with a copy", hosted.label)
            return hosted
        self._swap(key, directory)
        return self.open(key, descriptor_json, routing, partition)

    def _swap(self, key: TabletKey, directory: str) -> None:
        path = self.path(key)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        old = f"{path}.replaced-{uuid.uuid4().hex[:8]}"
        if os.path.lexists(path):
            os.rename(path, old)
        os.rename(directory, path)
        shutil.rmtree(old, ignore_errors=True)

    def all_hosted(self) -> list[HostedTablet]:
        with self._lock:
            return list(self._tablets.values())

    def hosted(self, table_id: int) -> list[HostedTablet]:
        """The open tablets of one table."""
        with self._lock:
            return [h for k, h in self._tablets.items() if k.table_id == table_id]

    def table_ids(self) -> list[int]:
        """Table ids with tablets open or on disk."""
        ids = {k.table_id for k in self._tablets}
        ids.update(int(d) for d in os.listdir(self.root) if d.isdigit())
        return sorted(ids)

    def _check_not_dropped(self, key: TabletKey) -> None:
        if key.table_id in self._dropped:
            raise StaleMetadataError(f"{key.describe()}: table id {key.table_id} was dropped")

    def drop_table(self, table_id: int) -> None:
        """Close and delete every tablet of a dropped table."""
        with self._lock:
            self._dropped.add(table_id)
            doomed = [h for k, h in self._tablets.items() if k.table_id == table_id]
            for hosted in doomed:
                del self._tablets[hosted.key]
        for hosted in doomed:
            with hosted.lock:
                hosted.tablet.close()
        shutil.rmtree(os.path.join(self.root, str(table_id)), ignore_errors=True)
        log.info("deleted the tablets of dropped table id %d", table_id)

    def close(self) -> None:
        with self._lock:
            hosted, self._tablets = list(self._tablets.values()), {}
        for h in hosted:
            with h.lock:
                h.tablet.close()

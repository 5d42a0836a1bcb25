"""Bringing a bucket copy back from the remote directory on a tablet server.

Two cases. A follower whose leader's log starts past the follower's log end (its disk was
wiped, or it was away while the log was truncated) cannot catch up from the log alone: it
downloads the newest remote snapshot whose offset lies in the leader's log (at or above its
log start and at or below its high watermark), puts it in place of its copy and fetches the
rest from the leader as usual. And when every copy of a bucket is gone, the coordinator's
`restore_bucket` has one live server build the bucket from the newest snapshot and the remote
segments after it (`restore_bucket_copy`); what lies past the last segment is lost, and the
coordinator says so.

A copy is built in a scratch directory beside the tablets and renamed into place once whole,
so a crash midway leaves the bucket as it was.
"""

from __future__ import annotations

import logging
import os
import shutil
import uuid

from tally.errors import RemoteStorageError
from tally.server.remote.changelog_segments import decode_segment
from tally.server.remote.snapshots import RemoteSnapshots
from tally.server.tablet.snapshot_uploads import bucket_path
from tally.server.tablet.tablets import HostedTablet, TabletKey
from tally.wire.messages import field
from tally.wire.routing import TableRouting

log = logging.getLogger(__name__)


class SnapshotLoads:
    """Added to a TabletServer that has a remote directory."""

    def __init__(self, server, remote: RemoteSnapshots) -> None:
        self.server = server
        self.remote = remote
        self.scratch = os.path.join(os.path.dirname(server.host.root), "snapshot-downloads")
        shutil.rmtree(self.scratch, ignore_errors=True)  # what a crash left half-built
        os.makedirs(self.scratch, exist_ok=True)
        server.actions["restore_bucket_copy"] = self.restore

    def _workdir(self, key: TabletKey) -> str:
        return os.path.join(self.scratch, f"{key.table_id}-{key.partition_id}-{key.bucket}-"
                                          f"{uuid.uuid4().hex[:8]}")

    def rebuild(self, hosted: HostedTablet, log_start: int, high_watermark: int,
                still=lambda: True):
        """Replace a follower's copy with the newest remote snapshot in [log_start,
        high_watermark] of its leader's log, if `still()` holds once it is downloaded; the
        SnapshotInfo used."""
        bucket = bucket_path(hosted.key)
        usable = [s for s in self.remote.snapshots(bucket)
                  if log_start <= s.offset <= high_watermark]
        if not usable:
            raise RemoteStorageError(
                f"{hosted.label}: no remote snapshot lies in its leader's log [{log_start}, "
                f"{high_watermark}]")
        snapshot = usable[-1]
        work = self._workdir(hosted.key)
        try:
            self.remote.download(snapshot, os.path.join(work, "rocksdb"))
            self.server.host.install(hosted.key, work, "", hosted.routing, hosted.partition,
                                     still)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        log.warning("%s rebuilt from remote %s; fetching the rest from its leader",
                    hosted.label, snapshot)
        return snapshot

    def restore(self, body: dict) -> dict:
        """Build a bucket from its newest remote snapshot and the segments after it, and host
        it here (the coordinator then makes this server its leader)."""
        from merge_engine import TableDescriptor
        from merge_engine.kv.tablet import KvTablet

        key = TabletKey(field(body, "table_id", int), field(body, "partition_id", int),
                        field(body, "bucket", int))
        descriptor_json = field(body, "descriptor", str)
        routing = TableRouting.from_json(field(body, "routing", dict))
        partition = None if body.get("partition") is None else field(body, "partition", str)
        label = key.describe(routing, partition)
        bucket = bucket_path(key)
        snapshot = self.remote.latest(bucket)
        work = self._workdir(key)
        try:
            if snapshot is not None:
                self.remote.download(snapshot, os.path.join(work, "rocksdb"))
            tablet = KvTablet.open(work, TableDescriptor.from_json(descriptor_json),
                                   name=label)
            try:
                replayed = self._replay(tablet, bucket)
                end, start = tablet.log_end_offset, tablet.log_start_offset
            finally:
                tablet.close()
            self.server.host.install(key, work, descriptor_json, routing, partition)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        log.warning("%s restored from the remote directory: %s, then %d segment(s), up to "
                    "offset %d", label, snapshot or "no snapshot", replayed, end)
        return {"snapshot_id": snapshot.snapshot_id if snapshot else None,
                "snapshot_offset": snapshot.offset if snapshot else None,
                "segments": replayed, "log_start": start, "log_end": end}

    def _replay(self, tablet, bucket) -> int:
        """Append the remote segments from the tablet's log end on, as long as they continue
        it (segments of different leaders may overlap: their entries are the same); the
        number of segments applied."""
        applied = 0
        for segment in self.remote.segments(bucket, tablet.log_end_offset):
            end = tablet.log_end_offset
            if segment.first_offset > end:
                log.warning("%s: the remote log stops at offset %d (the next segment starts "
                            "at %d)", bucket, end, segment.first_offset)
                break
            entries = [e for e in decode_segment(segment, self.remote.read_segment(segment))
                       if e.first_offset >= end]
            if not entries:
                continue
            if entries[0].first_offset != end:
                raise RemoteStorageError(f"{segment} has no entry starting at offset {end}, "
                                         f"where the restored log ends")
            tablet.apply_replicated(entries)
            applied += 1
        return applied

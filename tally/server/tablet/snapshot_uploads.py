"""A tablet server's uploads of the buckets it leads to the remote directory (`--remote-dir`).

Two duties. Every segment interval, each led bucket's changelog from the end of its last
uploaded segment up to the high watermark goes up as one or more remote segments: only what
every in-sync copy holds, so a segment never carries records a later leader could lack or hold
differently. Every snapshot interval, each led bucket whose log end moved since its last
snapshot is checkpointed (under the bucket's lock; the upload runs outside it) and uploaded
once the high watermark has reached the checkpoint's offset, then old snapshots are retained
away. After either, the leader registers what it uploaded with the coordinator under its
leader epoch, which the coordinator refuses from a deposed leader; the snapshot's id carries
the epoch too, so a deposed leader's late upload never outranks the current leader's.

Leaders also report their high watermarks with every heartbeat, so the coordinator knows the
last acknowledged offset of each bucket and a restore can state exactly what was lost.
"""

from __future__ import annotations

import logging
import os
import shutil
import threading
import time

from tally.errors import NotLeaderError, TallyError
from tally.server.remote.changelog_segments import encode_segment
from tally.server.remote.snapshots import BucketPath, RemoteSnapshots
from tally.server.settings import SEGMENT_INTERVAL, SNAPSHOT_INTERVAL
from tally.server.tablet.periodic import PeriodicDuty
from tally.server.tablet.tablets import HostedTablet, TabletKey
from tally.wire.messages import field

log = logging.getLogger(__name__)

SEGMENT_BYTES = 16 << 20      # changelog bytes per remote segment, at most (one entry more)
REPLICATED_WAIT = 30.0        # how long a checkpoint waits for its offset to be in sync


def bucket_path(key: TabletKey) -> BucketPath:
    return BucketPath(key.table_id, key.partition_id, key.bucket)


class SnapshotUploads:
    """Added to a TabletServer that has a remote directory."""

    def __init__(self, server, remote: RemoteSnapshots,
                 snapshot_interval: float = SNAPSHOT_INTERVAL,
                 segment_interval: float = SEGMENT_INTERVAL) -> None:
        self.server = server
        self.remote = remote
        self.scratch = os.path.join(os.path.dirname(server.host.root), "snapshot-scratch")
        shutil.rmtree(self.scratch, ignore_errors=True)  # a crash's half-made checkpoints
        os.makedirs(self.scratch, exist_ok=True)
        # per (bucket, leader epoch): the uploaded log end, the last snapshot's offset; a new
        # leadership starts from what the remote directory holds
        self._segment_end: dict[tuple[TabletKey, int], int] = {}
        self._snapshot_offset: dict[tuple[TabletKey, int], int] = {}
        self._registered_end: dict[tuple[TabletKey, int], int] = {}  # told the coordinator
        self._busy: dict[TabletKey, threading.Lock] = {}
        self._guard = threading.Lock()
        server.actions["upload_snapshots"] = self.upload_all
        self._segments = PeriodicDuty(self.upload_segments, segment_interval, "segment uploads")
        self._snapshots = PeriodicDuty(self.upload_snapshots, snapshot_interval,
                                       "snapshot uploads")

    def start(self) -> None:
        self._segments.start()
        self._snapshots.start()

    def close(self) -> None:
        self._segments.close()
        self._snapshots.close()

    def _led(self) -> list[HostedTablet]:
        return [h for h in self.server.host.all_hosted() if self.server.replicas.leads(h.key)]

    def _bucket_lock(self, key: TabletKey) -> threading.Lock:
        with self._guard:
            return self._busy.setdefault(key, threading.Lock())

    # --- passes -----------------------------------------------------------------------------

    def upload_all(self, body: dict) -> dict:
        """Upload every led bucket's segments and (unless `segments_only`) snapshot now, as
        the duties would: for operators before a planned risk, and for tests."""
        segments = self.upload_segments()
        only = field(body, "segments_only", bool, False)
        return {"segments": segments, "snapshots": {} if only else self.upload_snapshots()}

    def upload_segments(self) -> dict:
        """{bucket label: uploaded log end} for the led buckets this pass uploaded."""
        done = {}
        for hosted in self._led():
            try:
                with self._bucket_lock(hosted.key):
                    end = self._upload_segments(hosted)
                if end is not None:
                    done[hosted.label] = end
            except NotLeaderError:
                continue
            except TallyError as e:
                log.warning("segment upload of %s failed (retried): %s", hosted.label, e)
        return done

    def upload_snapshots(self) -> dict:
        """{bucket label: snapshot offset} for the led buckets this pass snapshotted."""
        done = {}
        for hosted in self._led():
            try:
                with self._bucket_lock(hosted.key):
                    offset = self._upload_snapshot(hosted)
                if offset is not None:
                    done[hosted.label] = offset
            except NotLeaderError:
                continue
            except TallyError as e:
                log.warning("snapshot upload of %s failed (retried): %s", hosted.label, e)
        return done

    # --- one bucket -------------------------------------------------------------------------

    def _upload_segments(self, hosted: HostedTablet) -> int | None:
        lead = self.server.replicas.leadership(hosted.key, hosted.label)
        bucket = bucket_path(hosted.key)
        start = self._segment_end.get((hosted.key, lead.epoch))
        if start is None:
            start = self._remote_log_end(bucket)
        hw = lead.high_watermark()
        with hosted.lock:
            log_start = hosted.tablet.log_start_offset
        if start < log_start:
            log.warning("%s: offsets [%d, %d) left the log before they were uploaded; a "
                        "restore from the remote directory cannot replay them", hosted.label,
                        start, log_start)
            start = log_start
        while start < hw:
            with hosted.lock:
                entries = hosted.tablet.replication_entries(start, SEGMENT_BYTES)
            entries = [e for e in entries if e.end_offset <= hw]
            if not entries:
                break
            self.remote.upload_segment(bucket, start, entries[-1].end_offset,
                                       encode_segment(entries))
            start = entries[-1].end_offset
        self._segment_end[(hosted.key, lead.epoch)] = start
        if self._registered_end.get((hosted.key, lead.epoch)) == start:
            return None
        self._register(hosted, lead, segment_end=start)
        self._registered_end[(hosted.key, lead.epoch)] = start
        return start

    def _remote_log_end(self, bucket: BucketPath) -> int:
        """Where the remote log of a bucket this server just began to lead ends: the end of
        its last segment, or of its newest snapshot when that is further."""
        segments = self.remote.segments(bucket)
        latest = self.remote.latest(bucket)
        ends = [s.end_offset for s in segments] + ([latest.offset] if latest else [])
        return max(ends, default=0)

    def _upload_snapshot(self, hosted: HostedTablet) -> int | None:
        lead = self.server.replicas.leadership(hosted.key, hosted.label)
        bucket = bucket_path(hosted.key)
        last = self._snapshot_offset.get((hosted.key, lead.epoch))
        if last is None:
            latest = self.remote.latest(bucket)
            last = latest.offset if latest else -1
        with hosted.lock:
            if hosted.tablet.log_end_offset == last:
                return None
        directory = os.path.join(self.scratch, f"{hosted.key.table_id}-{hosted.key.partition_id}"
                                               f"-{hosted.key.bucket}-{time.time_ns()}")
        try:
            with hosted.lock:
                offset = hosted.tablet.checkpoint(directory)
            # a snapshot holds only what every in-sync copy holds: a later leader never
            # lacks, nor holds differently, any of its records
            lead.wait_replicated(offset, timeout=REPLICATED_WAIT, writing=False)
            info = self.remote.upload(bucket, os.path.join(directory, "rocksdb"), offset,
                                      lead.epoch)
        finally:
            shutil.rmtree(directory, ignore_errors=True)
        self._snapshot_offset[(hosted.key, lead.epoch)] = offset
        log.info("%s: uploaded %s (%d of %d bytes sent)", hosted.label, info,
                 info.uploaded_bytes, info.total_bytes)
        self._register(hosted, lead, snapshot=info)
        self.remote.retain(bucket)
        return offset

    def _register(self, hosted: HostedTablet, lead, snapshot=None,
                  segment_end: int | None = None) -> None:
        body = {"table_id": hosted.key.table_id, "partition_id": hosted.key.partition_id,
                "bucket": hosted.key.bucket, "leader": self.server.server_id,
                "leader_epoch": lead.epoch, "high_watermark": lead.high_watermark()}
        if snapshot is not None:
            body["snapshot"] = {"snapshot_id": snapshot.snapshot_id, "offset": snapshot.offset}
        if segment_end is not None:
            body["segment_end"] = segment_end
        self.server.coordinator("snapshot_register", body)

    # --- what the server's other parts call -------------------------------------------------

    def high_watermarks(self) -> list[list[int]]:
        """[[table id, partition id, bucket, leader epoch, high watermark], ...] of the led
        buckets, for the heartbeat."""
        out = []
        for hosted in self._led():
            try:
                lead = self.server.replicas.leadership(hosted.key, hosted.label)
                out.append([hosted.key.table_id, hosted.key.partition_id, hosted.key.bucket,
                            lead.epoch, int(lead.high_watermark())])
            except TallyError:
                continue
        return out

    def drop_table(self, table_id: int) -> None:
        try:
            self.remote.drop(table_id)
        except TallyError as e:
            log.warning("remote data of dropped table id %d stays: %s", table_id, e)

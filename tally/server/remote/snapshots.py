"""Remote snapshots of buckets: incremental RocksDB checkpoints and changelog segments in a
remote directory, from which a bucket is rebuilt elsewhere (the newest snapshot, then the
segments from its offset on). Knows nothing of the cluster: a bucket is its three ids.

Below the root, per bucket (<table id>/<partition id>/<bucket>):

    shared/<stem>-<sha256>.sst        table files, stored once for every snapshot that has them
    snapshots/<id>/<name>             a snapshot's own small files (MANIFEST, CURRENT, OPTIONS, WAL)
    snapshots/<id>.json               its manifest: offset, files, sizes, checksums
    log/<first>-<end>.seg             changelog entries of [first, end)

ids and offsets are zero-padded to 20 digits so a listing sorts numerically. A snapshot's id
carries the leader epoch it was taken under (`leader_epoch * EPOCH_SPAN + n`), so the ids of
different epochs never collide and every snapshot of a newer leader sorts after every snapshot
of an older one: a deposed leader that still uploads can neither overwrite nor outrank the
current leader's snapshots. A snapshot exists
once its manifest does, and the manifest is written last, whole or not at all: a crash during
an upload leaves only files no manifest names, which the next `retain` deletes.

One bucket's calls are serialised by a lock of the bucket's (uploads of one bucket come from
one thread, but retention may run on another); different buckets proceed in parallel.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import tempfile
import threading
import time

import pyarrow.fs as pafs

from tally.errors import InvalidOptionError, OffsetOutOfRangeError, RemoteStorageError, StorageError
from tally.fsync import fsync_dir
from tally.server.remote.files import RemoteFiles, file_chunks, is_temporary
from tally.server.remote.manifest import (DIGITS, EPOCH_SPAN, LOG, SHARED, SNAPSHOTS, BucketPath,
                                          SegmentInfo, SnapshotFile, SnapshotInfo, own_file_key,
                                          segment_key, shared_file_key)

__all__ = ["BucketPath", "RemoteSnapshots", "SegmentInfo", "SnapshotFile", "SnapshotInfo"]

_MANIFEST = re.compile(rf"^(\d{{{DIGITS}}})\.json$")
_SNAPSHOT_DIR = re.compile(rf"^(\d{{{DIGITS}}})$")
_SEGMENT = re.compile(rf"^(\d{{{DIGITS}}})-(\d{{{DIGITS}}})\.seg$")


def _digest(path: str) -> tuple[int, str]:
    sha, size = hashlib.sha256(), 0
    for data in file_chunks(path):
        sha.update(data)
        size += len(data)
    return size, sha.hexdigest()


class RemoteSnapshots:
    """The remote snapshots and log segments of every bucket under one remote directory.

    `uri`: a local path or a pyarrow filesystem URI (file:///..., s3://...). `keep`: how many
    snapshots `retain` keeps per bucket. `filesystem`: use this pyarrow filesystem, `uri` being
    the root's path on it.
    """

    def __init__(self, uri: str, keep: int = 3, filesystem: pafs.FileSystem | None = None):
        if keep < 1:
            raise InvalidOptionError(f"remote snapshots to keep per bucket must be at least 1, "
                                     f"got {keep}")
        self.keep = keep
        self.files = RemoteFiles(uri, filesystem)
        self._guard = threading.Lock()
        self._locks: dict[BucketPath, threading.Lock] = {}
        # Per bucket, the checksums of the table files of its last upload, by (name, size,
        # modification time, inode): a checkpoint hard-links the same immutable files each
        # time, so only new table files are read to be hashed.
        self._digests: dict[BucketPath, dict[tuple, str]] = {}

    def _lock(self, bucket: BucketPath) -> threading.Lock:
        with self._guard:
            return self._locks.setdefault(bucket, threading.Lock())

    # --- snapshots --------------------------------------------------------------------------

    def upload(self, bucket: BucketPath, checkpoint_dir: str, offset: int,
               leader_epoch: int = 0) -> SnapshotInfo:
        """Store the RocksDB checkpoint in `checkpoint_dir` as the bucket's next snapshot, taken
        at log end offset `offset` by the leader of `leader_epoch`. Table files already stored
        are not sent again."""
        if not 0 <= leader_epoch < 10 ** DIGITS // EPOCH_SPAN:
            raise InvalidOptionError(f"cannot upload a snapshot of {bucket} under leader epoch "
                                     f"{leader_epoch}")
        with self._lock(bucket):
            try:
                names = sorted(e.name for e in os.scandir(checkpoint_dir) if e.is_file())
            except OSError as exc:
                raise StorageError(f"cannot read the checkpoint of {bucket} at offset {offset}: "
                                   f"{exc.strerror}") from None
            snapshot_id = self._next_id(bucket, leader_epoch)
            stored = {f.key: f.size for f in self.files.list(f"{bucket.prefix()}/{SHARED}")}
            digests: dict[tuple, str] = {}
            entries, sent_files, sent_bytes = [], 0, 0
            for name in names:
                local = os.path.join(checkpoint_dir, name)
                size, sha = self._checksum(bucket, local, digests)
                if name.endswith(".sst"):
                    key = shared_file_key(name, sha)
                else:
                    key = own_file_key(snapshot_id, name)
                entries.append(SnapshotFile(name, key, size, sha))
                if stored.get(f"{bucket.prefix()}/{key}") == size:
                    continue
                self._put(bucket, snapshot_id, offset, f"{bucket.prefix()}/{key}",
                          file_chunks(local), name)
                sent_files += 1
                sent_bytes += size
            with self._guard:  # drop walks the checksums of every bucket
                self._digests[bucket] = digests
            info = SnapshotInfo(bucket, snapshot_id, offset, tuple(names),
                                sum(e.size for e in entries), int(time.time() * 1000),
                                tuple(entries), sent_files, sent_bytes)
            manifest = json.dumps(info.to_json(), indent=1).encode()
            self._put(bucket, snapshot_id, offset, info.manifest_key(), [manifest], "manifest")
            return info

    def _checksum(self, bucket: BucketPath, path: str,
                  digests: dict[tuple, str]) -> tuple[int, str]:
        """Size and SHA-256 of a checkpoint file; a table file's from the last upload when it is
        the very same file (table files never change once written)."""
        if not path.endswith(".sst"):
            return _digest(path)
        st = os.stat(path)
        identity = (os.path.basename(path), st.st_size, st.st_mtime_ns, st.st_dev, st.st_ino)
        sha = self._digests.get(bucket, {}).get(identity)
        if sha is None:
            size, sha = _digest(path)
            if size != st.st_size:  # changed while read: not a checkpoint's file, don't remember
                return size, sha
        digests[identity] = sha
        return st.st_size, sha

    def _put(self, bucket, snapshot_id, offset, key, chunks, name) -> None:
        try:
            self.files.write(key, chunks)
        except OSError as exc:
            raise RemoteStorageError(f"uploading snapshot {snapshot_id} (offset {offset}) of "
                                     f"{bucket}: cannot write {name}: {exc}") from None

    def _next_id(self, bucket: BucketPath, leader_epoch: int) -> int:
        """One past every snapshot id of the epoch in use, manifests and the directories of
        interrupted uploads alike, so a new snapshot never mixes its files with a crashed
        one's."""
        low, high = leader_epoch * EPOCH_SPAN, (leader_epoch + 1) * EPOCH_SPAN
        used = [low]
        for f in self.files.list(f"{bucket.prefix()}/{SNAPSHOTS}"):
            base = f.key.rsplit("/", 1)[-1]
            match = (_SNAPSHOT_DIR if f.is_dir else _MANIFEST).match(base)
            if match and low <= int(match.group(1)) < high:
                used.append(int(match.group(1)))
        return max(used) + 1

    def snapshots(self, bucket: BucketPath) -> list[SnapshotInfo]:
        """The bucket's complete snapshots, oldest first."""
        found = []
        for f in self.files.list(f"{bucket.prefix()}/{SNAPSHOTS}"):
            if not f.is_dir and _MANIFEST.match(f.key.rsplit("/", 1)[-1]):
                found.append(self._read_manifest(bucket, f.key))
        return sorted(found, key=lambda s: s.snapshot_id)

    def _read_manifest(self, bucket: BucketPath, key: str) -> SnapshotInfo:
        try:
            data = json.loads(self.files.read(key))
        except OSError as exc:
            raise RemoteStorageError(f"cannot read the manifest {key} of {bucket}: {exc}") from None
        except ValueError as exc:
            raise RemoteStorageError(f"corrupt manifest {key} of {bucket}: {exc}") from None
        info = SnapshotInfo.from_json(data)
        if info.bucket != bucket or info.manifest_key() != key:
            raise RemoteStorageError(f"manifest {key} of {bucket} describes {info}")
        return info

    def latest(self, bucket: BucketPath) -> SnapshotInfo | None:
        found = self.snapshots(bucket)
        return found[-1] if found else None

    def download(self, snapshot: SnapshotInfo, dest_dir: str) -> None:
        """Write the snapshot's checkpoint into the new directory `dest_dir`, every file checked
        against its size and checksum. Complete or nothing: the files go to a temporary
        directory beside it, renamed to `dest_dir` once all are there and on disk."""
        if [e.name for e in snapshot.entries] != list(snapshot.files):
            raise RemoteStorageError(f"{snapshot} does not say where its files are stored: "
                                     f"take it from snapshots() or latest()")
        if os.path.lexists(dest_dir):
            raise StorageError(f"cannot download {snapshot}: its destination already exists")
        parent = os.path.dirname(os.path.abspath(dest_dir))
        os.makedirs(parent, exist_ok=True)
        temporary = tempfile.mkdtemp(prefix=os.path.basename(dest_dir) + ".tmp-", dir=parent)
        try:
            for entry in snapshot.entries:
                self._fetch(snapshot, entry, temporary)
            os.rename(temporary, dest_dir)
        except BaseException:
            shutil.rmtree(temporary, ignore_errors=True)
            raise
        fsync_dir(parent)

    def _fetch(self, snapshot: SnapshotInfo, entry: SnapshotFile, directory: str) -> None:
        if os.path.basename(entry.name) != entry.name or entry.name in ("", ".", ".."):
            raise RemoteStorageError(f"{snapshot} names a file outside its directory: "
                                     f"{entry.name!r}")
        try:
            chunks = self.files.chunks(f"{snapshot.bucket.prefix()}/{entry.key}")
        except OSError:
            raise RemoteStorageError(f"{snapshot}: file {entry.name} is missing from the "
                                     f"remote directory") from None
        sha, size = hashlib.sha256(), 0
        with open(os.path.join(directory, entry.name), "wb") as out:
            try:
                for data in chunks:
                    sha.update(data)
                    size += len(data)
                    out.write(data)
            except OSError as exc:
                raise RemoteStorageError(f"{snapshot}: cannot read file {entry.name}: "
                                         f"{exc}") from None
            out.flush()
            os.fsync(out.fileno())
        if (size, sha.hexdigest()) != (entry.size, entry.sha256):
            raise RemoteStorageError(f"{snapshot}: file {entry.name} is corrupt: {size} bytes "
                                     f"with SHA-256 {sha.hexdigest()[:12]}..., expected "
                                     f"{entry.size} bytes with {entry.sha256[:12]}...")

    # --- log segments -----------------------------------------------------------------------

    def upload_segment(self, bucket: BucketPath, first_offset: int, end_offset: int,
                       data: bytes) -> SegmentInfo:
        """Store the changelog entries of [first_offset, end_offset), whole or not at all; a
        segment of the same range is replaced."""
        if not 0 <= first_offset < end_offset:
            raise OffsetOutOfRangeError(f"log segment [{first_offset}, {end_offset}) of {bucket} "
                                        f"holds no offsets")
        segment = SegmentInfo(bucket, first_offset, end_offset,
                              segment_key(bucket, first_offset, end_offset), len(data))
        with self._lock(bucket):
            try:
                self.files.write(segment.path, [data])
            except OSError as exc:
                raise RemoteStorageError(f"cannot write {segment}: {exc}") from None
        return segment

    def segments(self, bucket: BucketPath, start: int = 0) -> list[SegmentInfo]:
        """The bucket's segments that hold offsets at or after `start`, in offset order."""
        found = []
        for f in self.files.list(f"{bucket.prefix()}/{LOG}"):
            match = None if f.is_dir else _SEGMENT.match(f.key.rsplit("/", 1)[-1])
            if match and int(match.group(2)) > start:
                found.append(SegmentInfo(bucket, int(match.group(1)), int(match.group(2)),
                                         f.key, f.size))
        return sorted(found, key=lambda s: (s.first_offset, s.end_offset))

    def read_segment(self, segment: SegmentInfo) -> bytes:
        try:
            data = self.files.read(segment.path)
        except OSError as exc:
            raise RemoteStorageError(f"cannot read {segment}: {exc}") from None
        if len(data) != segment.bytes:
            raise RemoteStorageError(f"{segment} is corrupt: {len(data)} bytes, expected "
                                     f"{segment.bytes}")
        return data

    # --- retention --------------------------------------------------------------------------

    def retain(self, bucket: BucketPath) -> None:
        """Keep the bucket's newest `keep` snapshots and what they need: delete older
        manifests first (so a snapshot vanishes before any of its files), then every file no
        kept snapshot names (also what interrupted uploads left), then the segments wholly
        below the offset of the oldest kept snapshot, which no restore will replay."""
        with self._lock(bucket):
            try:
                self._retain(bucket)
            except OSError as exc:
                raise RemoteStorageError(f"retention of {bucket} stopped: {exc}; the next "
                                         f"one finishes it") from None

    def _retain(self, bucket: BucketPath) -> None:
        found = self.snapshots(bucket)
        kept = found[-self.keep:]
        for old in found[:-self.keep]:
            self.files.delete(old.manifest_key())
        prefix = bucket.prefix()
        needed = {s.manifest_key() for s in kept}
        needed.update(f"{prefix}/{e.key}" for s in kept for e in s.entries)
        kept_dirs = {f"{prefix}/{own_file_key(s.snapshot_id, '')}".rstrip("/") for s in kept}
        for f in self.files.list(f"{prefix}/{SNAPSHOTS}"):
            if f.is_dir and f.key not in kept_dirs:
                self.files.delete_tree(f.key)
        for area in (f"{prefix}/{SHARED}", *sorted(kept_dirs), f"{prefix}/{SNAPSHOTS}"):
            for f in self.files.list(area):
                if not f.is_dir and f.key not in needed:
                    self.files.delete(f.key)
        for f in self.files.list(f"{prefix}/{LOG}"):
            if is_temporary(f.key):
                self.files.delete(f.key)
        floor = min((s.offset for s in kept), default=-1)  # no snapshot: replay needs them all
        for segment in self.segments(bucket):
            if segment.end_offset <= floor:
                self.files.delete(segment.path)

    def drop(self, table_id: int) -> None:
        """Delete everything stored for table `table_id` (a dropped table)."""
        with self._guard:
            for bucket in [b for b in self._digests if b.table_id == table_id]:
                del self._digests[bucket]
        try:
            self.files.delete_tree(str(table_id))
        except OSError as exc:
            raise RemoteStorageError(f"cannot delete the remote data of table {table_id}: "
                                     f"{exc}") from None


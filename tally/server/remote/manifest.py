"""What a remote snapshot and a remote changelog segment are: the bucket they belong to, their
offsets and files, and the manifest JSON a snapshot is known by.

A manifest lists every file with its size and SHA-256, so a download can prove it got exactly
what was uploaded and a retention pass knows which remote files a snapshot still needs.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tally.errors import RemoteStorageError

MANIFEST_FORMAT = 1


@dataclass(frozen=True)
class BucketPath:
    """Where one bucket's remote data lives."""

    table_id: int
    partition_id: int
    bucket: int

    def prefix(self) -> str:
        return f"{self.table_id}/{self.partition_id}/{self.bucket}"

    def __str__(self) -> str:
        return f"bucket {self.bucket} of table {self.table_id} partition {self.partition_id}"


@dataclass(frozen=True)
class SnapshotFile:
    """One file of a checkpoint: `name` in the checkpoint directory, `key` where it is stored
    below the bucket's prefix (shared table files are stored once for many snapshots)."""

    name: str
    key: str
    size: int
    sha256: str

    def to_json(self) -> dict:
        return {"name": self.name, "key": self.key, "size": self.size, "sha256": self.sha256}

    @classmethod
    def from_json(cls, data: dict) -> "SnapshotFile":
        return cls(str(data["name"]), str(data["key"]), int(data["size"]), str(data["sha256"]))


@dataclass(frozen=True)
class SnapshotInfo:
    """A complete remote snapshot: the bucket's RocksDB as of changelog offset `offset` (the
    log end offset it holds, so the changelog resumes there). `files` are the checkpoint's file
    names, `entries` the same files with where they are stored, sizes and checksums.

    `uploaded_files` and `uploaded_bytes` say what the upload that made it transferred (files
    already stored remotely were not sent again); a snapshot read back reports 0 for both, and
    neither takes part in equality."""

    bucket: BucketPath
    snapshot_id: int
    offset: int
    files: tuple[str, ...]
    total_bytes: int
    created_ms: int
    entries: tuple[SnapshotFile, ...] = ()
    uploaded_files: int = field(default=0, compare=False)
    uploaded_bytes: int = field(default=0, compare=False)

    def manifest_key(self) -> str:
        return manifest_key(self.bucket, self.snapshot_id)

    @property
    def leader_epoch(self) -> int:
        """The leader epoch the snapshot was taken under (encoded in its id)."""
        return self.snapshot_id // EPOCH_SPAN

    def to_json(self) -> dict:
        return {"format": MANIFEST_FORMAT, "table_id": self.bucket.table_id,
                "partition_id": self.bucket.partition_id, "bucket": self.bucket.bucket,
                "snapshot_id": self.snapshot_id, "offset": self.offset,
                "created_ms": self.created_ms, "files": [e.to_json() for e in self.entries]}

    @classmethod
    def from_json(cls, data: dict) -> "SnapshotInfo":
        """The snapshot a manifest describes; RemoteStorageError for one this version cannot
        read (a newer format, or fields missing)."""
        try:
            if data.get("format") != MANIFEST_FORMAT:
                raise ValueError(f"manifest format {data.get('format')!r}")
            bucket = BucketPath(int(data["table_id"]), int(data["partition_id"]),
                                int(data["bucket"]))
            entries = tuple(SnapshotFile.from_json(e) for e in data["files"])
            return cls(bucket, int(data["snapshot_id"]), int(data["offset"]),
                       tuple(e.name for e in entries), sum(e.size for e in entries),
                       int(data["created_ms"]), entries)
        except (KeyError, TypeError, ValueError) as exc:
            raise RemoteStorageError(f"unreadable snapshot manifest {data.get('snapshot_id')!r} "
                                     f"of table {data.get('table_id')!r} bucket "
                                     f"{data.get('bucket')!r}: {exc}") from None

    def __str__(self) -> str:
        return f"snapshot {self.snapshot_id} (offset {self.offset}) of {self.bucket}"


@dataclass(frozen=True)
class SegmentInfo:
    """Changelog entries of [first_offset, end_offset) stored remotely at `path` (a key below
    the remote root), `bytes` long."""

    bucket: BucketPath
    first_offset: int
    end_offset: int
    path: str
    bytes: int

    def __str__(self) -> str:
        return f"log segment [{self.first_offset}, {self.end_offset}) of {self.bucket}"


# --- where things are stored below a bucket's prefix ---------------------------------------------

SHARED = "shared"
SNAPSHOTS = "snapshots"
LOG = "log"
DIGITS = 20  # zero-padded ids and offsets list in numeric order
EPOCH_SPAN = 10 ** 10  # snapshot ids per leader epoch: id = epoch * EPOCH_SPAN + n


def manifest_key(bucket: BucketPath, snapshot_id: int) -> str:
    return f"{bucket.prefix()}/{SNAPSHOTS}/{snapshot_id:0{DIGITS}d}.json"


def own_file_key(snapshot_id: int, name: str) -> str:
    """Below the bucket's prefix: a file only snapshot `snapshot_id` has (MANIFEST, CURRENT,
    OPTIONS, write-ahead log)."""
    return f"{SNAPSHOTS}/{snapshot_id:0{DIGITS}d}/{name}"


def shared_file_key(name: str, sha256: str) -> str:
    """Below the bucket's prefix: a table file, by its name and content. A RocksDB created anew
    reuses file numbers, so the name alone could meet another file's bytes; with the checksum
    in the key, one key always means one content."""
    stem = name[:-len(".sst")] if name.endswith(".sst") else name
    return f"{SHARED}/{stem}-{sha256}.sst"


def segment_key(bucket: BucketPath, first_offset: int, end_offset: int) -> str:
    return f"{bucket.prefix()}/{LOG}/{first_offset:0{DIGITS}d}-{end_offset:0{DIGITS}d}.seg"

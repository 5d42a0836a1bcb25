"""Remote snapshots: real RocksDB checkpoints of a tablet uploaded incrementally and restored;
random uploads, crashes and retention against a model of what must survive; log segments;
downloads of damaged snapshots."""

from __future__ import annotations

import os
import shutil
import tempfile
from concurrent.futures import ThreadPoolExecutor

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st
from rocksdict import Checkpoint

from merge_engine.kv.tablet import KvTablet
from tally.errors import InvalidOptionError, OffsetOutOfRangeError, RemoteStorageError, StorageError
from tally.server.remote.snapshots import BucketPath, RemoteSnapshots, SnapshotInfo
from tests.crashing_filesystem import SimulatedCrash, crashing_filesystem
from tests.tablet_helpers import one_column_tablet

BUCKET = BucketPath(7, 0, 3)


def checkpoint(tablet: KvTablet, path) -> str:
    Checkpoint(tablet._store.db).create_checkpoint(str(path))
    return str(path)


def write_checkpoint(path, files: dict[str, bytes]) -> str:
    os.makedirs(path)
    for name, data in files.items():
        with open(os.path.join(path, name), "wb") as f:
            f.write(data)
    return str(path)


def read_dir(path) -> dict[str, bytes]:
    out = {}
    for name in os.listdir(path):
        with open(os.path.join(path, name), "rb") as f:
            out[name] = f.read()
    return out


def remote_files(remote: RemoteSnapshots, bucket: BucketPath) -> set[str]:
    return {f.key for f in remote.files.list(bucket.prefix(), recursive=True) if not f.is_dir}


# --- real checkpoints of a tablet -----------------------------------------------------------------


def test_second_upload_sends_only_new_table_files_and_each_snapshot_restores(tmp_path):
    remote = RemoteSnapshots(f"file://{tmp_path}/remote")
    expected = []
    with one_column_tablet(tmp_path / "tablet", "sum", pa.int64()) as tablet:
        tablet.put([{"k": k, "v": k * 10} for k in range(200)])
        tablet.flush()
        first_dir = checkpoint(tablet, tmp_path / "cp1")
        first = remote.upload(BUCKET, first_dir, tablet.log_end_offset)
        expected.append((first, tablet.to_arrow(), tablet.log_end_offset))

        tablet.put([{"k": k, "v": 1} for k in range(100, 300)])
        tablet.flush()
        second_dir = checkpoint(tablet, tmp_path / "cp2")
        second = remote.upload(BUCKET, second_dir, tablet.log_end_offset)
        expected.append((second, tablet.to_arrow(), tablet.log_end_offset))

    assert first.uploaded_files == len(first.files)
    assert first.uploaded_bytes == first.total_bytes
    old_tables = {n: os.path.getsize(os.path.join(first_dir, n))
                  for n in os.listdir(first_dir) if n.endswith(".sst")}
    shared = {n for n in os.listdir(second_dir) if n in old_tables}
    assert shared, "the second checkpoint should still have the first one's table file"
    assert second.uploaded_files == len(second.files) - len(shared)
    assert second.uploaded_bytes == second.total_bytes - sum(old_tables[n] for n in shared)
    assert second.snapshot_id > first.snapshot_id
    assert remote.snapshots(BUCKET) == [first, second]
    assert remote.latest(BUCKET) == second

    for info, rows, end in expected:
        restored = tmp_path / f"restored-{info.snapshot_id}"
        remote.download(info, str(restored / "rocksdb"))
        with one_column_tablet(restored, "sum", pa.int64()) as tablet:
            assert tablet.log_end_offset == end == info.offset
            assert tablet.to_arrow().equals(rows)


def test_manifest_round_trips_through_json(tmp_path):
    remote = RemoteSnapshots(str(tmp_path / "remote"))
    files = {"1.sst": b"x", "CURRENT": b"y"}
    info = remote.upload(BUCKET, write_checkpoint(tmp_path / "cp", files), 5)
    assert SnapshotInfo.from_json(info.to_json()) == info
    assert info.files == ("1.sst", "CURRENT") and info.total_bytes == 2


# --- random uploads, crashes and retention against a model ----------------------------------------

upload_op = st.fixed_dictionaries({
    "op": st.just("upload"),
    "keep_tables": st.lists(st.booleans(), max_size=6),  # which previous table files stay
    "new_tables": st.integers(0, 3),
    "recreate": st.booleans(),  # a RocksDB made anew: file numbers start over, new contents
    "crash_after": st.none() | st.integers(0, 9),
    "advance": st.integers(0, 50),
})
segment_op = st.fixed_dictionaries({"op": st.just("segment"), "length": st.integers(1, 30),
                                    "crash_after": st.none() | st.integers(0, 1)})
retain_op = st.fixed_dictionaries({"op": st.just("retain")})


class Model:
    """What the remote side must hold: the complete snapshots' files, and the segments."""

    def __init__(self, keep: int):
        self.keep = keep
        self.snapshots: list[tuple[SnapshotInfo, dict[str, bytes]]] = []
        self.segments: dict[tuple[int, int], bytes] = {}

    def retain(self) -> None:
        self.snapshots = self.snapshots[-self.keep:]
        if self.snapshots:
            floor = min(info.offset for info, _ in self.snapshots)
            self.segments = {r: d for r, d in self.segments.items() if r[1] > floor}


class FakeRocksDb:
    """Checkpoint directories as a RocksDB would make them: table files hard-linked from one
    checkpoint to the next, numbered on, and renumbered from 1 after the database is re-created."""

    def __init__(self, root: str):
        self.root, self.count, self.number, self.generation = root, 0, 0, 0
        self.tables: list[str] = []
        self.last_dir: str | None = None

    def checkpoint(self, keep_tables, new_tables, recreate) -> tuple[str, dict[str, bytes]]:
        self.count += 1
        directory = os.path.join(self.root, f"cp{self.count}")
        os.makedirs(directory)
        if recreate:
            self.generation, self.number, self.tables = self.generation + 1, 0, []
        kept = [n for n, keep in zip(self.tables, keep_tables) if keep]
        kept += self.tables[len(keep_tables):]
        for name in kept:
            os.link(os.path.join(self.last_dir, name), os.path.join(directory, name))
        fresh = []
        for _ in range(new_tables):
            self.number += 1
            fresh.append(f"{self.number:06d}.sst")
        small = {"CURRENT": b"MANIFEST-%d\n" % self.count,
                 f"MANIFEST-{self.count:06d}": b"m" * self.count,
                 f"{self.count:06d}.log": b"w" * (self.count % 3)}
        for name in fresh:
            small[name] = f"gen{self.generation}-{name}-".encode() * (1 + self.number % 4)
        for name, data in small.items():
            with open(os.path.join(directory, name), "wb") as f:
                f.write(data)
        self.tables, self.last_dir = kept + fresh, directory
        return directory, read_dir(directory)


def check_downloads(remote: RemoteSnapshots, model: Model, scratch: str) -> None:
    for info, files in model.snapshots:
        dest = tempfile.mkdtemp(dir=scratch)
        os.rmdir(dest)
        remote.download(info, dest)
        assert read_dir(dest) == files
        shutil.rmtree(dest)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=st.lists(st.one_of(upload_op, upload_op, upload_op, segment_op, retain_op), max_size=24),
       keep=st.integers(1, 3))
def test_uploads_crashes_and_retention_keep_exactly_what_kept_snapshots_need(ops, keep):
    with tempfile.TemporaryDirectory() as tmp:
        filesystem, crashes = crashing_filesystem()
        remote = RemoteSnapshots(os.path.join(tmp, "remote"), keep, filesystem=filesystem)
        rocksdb, model, offset = FakeRocksDb(tmp), Model(keep), 0
        for op in ops:
            if op["op"] == "upload":
                offset += op["advance"]
                directory, files = rocksdb.checkpoint(op["keep_tables"], op["new_tables"],
                                                      op["recreate"])
                crashes.crash_after = op["crash_after"]
                try:
                    info = remote.upload(BUCKET, directory, offset)
                except SimulatedCrash:
                    remote = RemoteSnapshots(os.path.join(tmp, "remote"), keep,
                                             filesystem=filesystem)  # a restarted process
                else:
                    if model.snapshots:
                        assert info.snapshot_id > model.snapshots[-1][0].snapshot_id
                    model.snapshots.append((info, files))
                crashes.crash_after = None
            elif op["op"] == "segment":
                first = max((end for _, end in model.segments), default=0)
                data = os.urandom(op["length"])
                crashes.crash_after = op["crash_after"]
                try:
                    remote.upload_segment(BUCKET, first, first + op["length"], data)
                except SimulatedCrash:
                    pass
                else:
                    model.segments[(first, first + op["length"])] = data
                crashes.crash_after = None
            else:
                remote.retain(BUCKET)
                model.retain()
                needed = {info.manifest_key() for info, _ in model.snapshots}
                needed |= {f"{BUCKET.prefix()}/{e.key}" for info, _ in model.snapshots
                           for e in info.entries}
                needed |= {remote_segment.path for remote_segment in remote.segments(BUCKET)}
                assert remote_files(remote, BUCKET) == needed
            assert remote.snapshots(BUCKET) == [info for info, _ in model.snapshots]
            segments = remote.segments(BUCKET)
            assert [(s.first_offset, s.end_offset) for s in segments] == sorted(model.segments)
            assert [remote.read_segment(s) for s in segments] == \
                [model.segments[r] for r in sorted(model.segments)]
            check_downloads(remote, model, tmp)


# --- log segments -------------------------------------------------------------------------------


def test_segments_list_from_an_offset_read_back_and_retain_below_oldest_snapshot(tmp_path):
    remote = RemoteSnapshots(str(tmp_path / "remote"), keep=1)
    ranges = [(0, 10), (10, 25), (25, 40), (40, 41)]
    for first, end in ranges:
        data = f"entries {first}-{end}".encode()
        info = remote.upload_segment(BUCKET, first, end, data)
        assert (info.first_offset, info.end_offset, info.bytes) == (first, end, len(data))
    assert [(s.first_offset, s.end_offset) for s in remote.segments(BUCKET)] == ranges
    assert [(s.first_offset, s.end_offset) for s in remote.segments(BUCKET, 10)] == ranges[1:]
    assert [(s.first_offset, s.end_offset) for s in remote.segments(BUCKET, 12)] == ranges[1:]
    assert remote.segments(BUCKET, 41) == []
    assert [remote.read_segment(s) for s in remote.segments(BUCKET)] == \
        [f"entries {a}-{b}".encode() for a, b in ranges]

    replaced = remote.upload_segment(BUCKET, 0, 10, b"written again")
    assert remote.read_segment(remote.segments(BUCKET)[0]) == b"written again"
    assert remote.segments(BUCKET)[0] == replaced

    remote.retain(BUCKET)  # no snapshot yet: every segment may still be needed
    assert len(remote.segments(BUCKET)) == 4
    remote.upload(BUCKET, write_checkpoint(tmp_path / "cp1", {"1.sst": b"a"}), 10)
    remote.upload(BUCKET, write_checkpoint(tmp_path / "cp2", {"2.sst": b"b"}), 25)
    remote.retain(BUCKET)
    assert [(s.first_offset, s.end_offset) for s in remote.segments(BUCKET)] == ranges[2:]
    assert [s.offset for s in remote.snapshots(BUCKET)] == [25]


def test_segment_without_offsets_is_refused(tmp_path):
    remote = RemoteSnapshots(str(tmp_path / "remote"))
    with pytest.raises(OffsetOutOfRangeError, match=r"\[5, 5\)"):
        remote.upload_segment(BUCKET, 5, 5, b"")


def test_truncated_segment_is_reported(tmp_path):
    remote = RemoteSnapshots(str(tmp_path / "remote"))
    segment = remote.upload_segment(BUCKET, 0, 3, b"abc")
    with open(os.path.join(remote.files.root, segment.path), "wb") as f:
        f.write(b"ab")
    with pytest.raises(RemoteStorageError, match=r"\[0, 3\).*corrupt"):
        remote.read_segment(segment)


# --- damaged snapshots --------------------------------------------------------------------------


def uploaded(tmp_path) -> tuple[RemoteSnapshots, SnapshotInfo]:
    remote = RemoteSnapshots(str(tmp_path / "remote"))
    files = {"000011.sst": b"table" * 100, "CURRENT": b"MANIFEST-000005\n",
             "MANIFEST-000005": b"manifest"}
    return remote, remote.upload(BUCKET, write_checkpoint(tmp_path / "cp", files), 42)


def stored_path(remote: RemoteSnapshots, info: SnapshotInfo, name: str) -> str:
    entry = next(e for e in info.entries if e.name == name)
    return os.path.join(remote.files.root, BUCKET.prefix(), entry.key)


@pytest.mark.parametrize("damage", ["flip", "truncate", "delete"])
@pytest.mark.parametrize("name", ["000011.sst", "MANIFEST-000005"])
def test_damaged_file_fails_the_download_and_leaves_nothing(tmp_path, damage, name):
    remote, info = uploaded(tmp_path)
    path = stored_path(remote, info, name)
    data = open(path, "rb").read()
    if damage == "delete":
        os.remove(path)
    else:
        with open(path, "wb") as f:
            f.write(data[:-1] + b"?" if damage == "flip" else data[:-1])
    word = "missing" if damage == "delete" else "corrupt"
    message = rf"snapshot {info.snapshot_id} .*{name} is {word}"
    with pytest.raises(RemoteStorageError, match=message):
        remote.download(info, str(tmp_path / "restore" / "rocksdb"))
    assert os.listdir(tmp_path / "restore") == []


def test_download_needs_a_snapshot_that_says_where_its_files_are(tmp_path):
    remote, info = uploaded(tmp_path)
    bare = SnapshotInfo(info.bucket, info.snapshot_id, info.offset, info.files, info.total_bytes,
                        info.created_ms)
    with pytest.raises(RemoteStorageError, match=f"snapshot {info.snapshot_id} "):
        remote.download(bare, str(tmp_path / "restore"))
    assert not os.path.exists(tmp_path / "restore")


def test_keeping_no_snapshot_is_refused(tmp_path):
    with pytest.raises(InvalidOptionError, match="at least 1"):
        RemoteSnapshots(str(tmp_path), keep=0)


def test_download_refuses_an_existing_destination(tmp_path):
    remote, info = uploaded(tmp_path)
    (tmp_path / "there").mkdir()
    with pytest.raises(StorageError, match="already exists"):
        remote.download(info, str(tmp_path / "there"))


# --- several buckets, tables ---------------------------------------------------------------------


def test_buckets_upload_in_parallel_and_drop_removes_one_table(tmp_path):
    remote = RemoteSnapshots(str(tmp_path / "remote"))
    buckets = [BucketPath(1, 0, b) for b in range(4)] + [BucketPath(2, 5, 0)]

    def upload_some(bucket: BucketPath) -> list[SnapshotInfo]:
        made = []
        for n in range(3):
            files = {f"{n}.sst": f"{bucket}-{n}".encode(), "CURRENT": bytes([n])}
            path = write_checkpoint(tmp_path / f"cp-{bucket.prefix().replace('/', '-')}-{n}", files)
            made.append(remote.upload(bucket, path, n * 10))
        remote.upload_segment(bucket, 0, 30, b"log")
        return made

    with ThreadPoolExecutor(4) as pool:
        made = dict(zip(buckets, pool.map(upload_some, buckets)))
    for bucket in buckets:
        assert remote.snapshots(bucket) == made[bucket]

    remote.drop(1)
    for bucket in buckets[:4]:
        assert remote.snapshots(bucket) == [] and remote.segments(bucket) == []
    assert remote.snapshots(buckets[4]) == made[buckets[4]]
    assert len(remote.segments(buckets[4])) == 1

"""A KvTablet on a full disk: typed errors without paths, refused writes leave no trace, and a
reopen once space is back has every acknowledged write.

The disk is a small tmpfs (tests/small_disk.py), so RocksDB meets the kernel's own ENOSPC.
"""

from __future__ import annotations

import os

import pyarrow as pa
import pytest

from merge_engine import Schema, TableDescriptor
from merge_engine.kv.storage import without_paths
from merge_engine.kv.tablet import KvTablet
from tally.errors import DiskFullError, StorageWriteError
from tests.small_disk import fill, small_filesystem

SIZE = 8 << 20
NAME = "bucket 0 of shop.t"
SCHEMA = Schema.builder().column("k", pa.int64()).column("v", pa.string()).primary_key("k").build()
ROWS_PER_WRITE = 50


@pytest.fixture
def disk(tmp_path):
    with small_filesystem(str(tmp_path / "disk"), SIZE) as path:
        yield path


def open_tablet(path: str) -> KvTablet:
    return KvTablet.open(os.path.join(path, "bucket"), TableDescriptor(SCHEMA), name=NAME)


def batch(first_key: int) -> pa.Table:
    keys = range(first_key, first_key + ROWS_PER_WRITE)
    return pa.table({"k": pa.array(keys, pa.int64()),
                     "v": [os.urandom(1000).hex() for _ in keys]})


def write_until_full(tablet: KvTablet, acknowledged: dict) -> tuple[DiskFullError, pa.Table]:
    """Write new keys until the disk refuses one; the error and the refused rows."""
    for n in range(10_000):
        rows = batch(n * ROWS_PER_WRITE)
        try:
            tablet.put(rows)
        except DiskFullError as e:
            return e, rows
        acknowledged.update(zip(rows.column("k").to_pylist(), rows.column("v").to_pylist()))
    raise AssertionError("the disk never filled")


def test_a_full_disk_refuses_writes_typed_and_a_reopen_has_every_acknowledged_write(disk):
    filler = fill(disk, leave_bytes=2 << 20)
    tablet = open_tablet(disk)
    acknowledged: dict[int, str] = {}
    error, refused = write_until_full(tablet, acknowledged)
    assert str(error).startswith(f"{NAME}: no space left on device"), error
    assert "/" not in str(error)
    assert isinstance(tablet.storage_failure, DiskFullError)
    # RocksDB stays read-only: later writes are refused with the same error, even small ones
    # that would fit, while reads go on.
    with pytest.raises(DiskFullError):
        tablet.put([{"k": -1, "v": "x"}])
    some_key = next(iter(acknowledged))
    assert tablet.lookup({"k": some_key}) == {"k": some_key, "v": acknowledged[some_key]}
    # The refused put's rows were prepared for the row buffer while its (large, compressed)
    # changelog entry was encoded: they never join it.
    assert tablet.lookup({"k": refused.column("k")[0].as_py()}) is None
    tablet.close()  # its closing flush is refused too; nothing is lost by that

    os.remove(filler)
    with open_tablet(disk) as reopened:
        assert reopened.storage_failure is None
        stored = reopened.to_arrow()
        assert dict(zip(stored.column("k").to_pylist(), stored.column("v").to_pylist())) \
            == acknowledged
        assert reopened.lookup({"k": refused.column("k")[0].as_py()}) is None
        reopened.put([{"k": -1, "v": "after"}])
        assert reopened.lookup({"k": -1}) == {"k": -1, "v": "after"}


def test_opening_a_new_bucket_on_a_full_disk_is_refused_typed(disk):
    filler = fill(disk, leave_bytes=0)
    with pytest.raises(StorageWriteError) as refused:
        open_tablet(disk)
    assert str(refused.value).startswith(f"{NAME}: ") and "/" not in str(refused.value)
    os.remove(filler)
    with open_tablet(disk) as tablet:
        tablet.put([{"k": 1, "v": "a"}])
        assert tablet.lookup({"k": 1}) == {"k": 1, "v": "a"}


def test_paths_are_cut_to_their_last_part():
    assert without_paths("IO error: No space left on device: While appending to file: "
                         "/srv/data/tablets/7/0/3/rocksdb/000004.log: No space left on device") \
        == ("IO error: No space left on device: While appending to file: 000004.log: "
            "No space left on device")
    assert without_paths("[Errno 28] No space left on device: '/srv/data/x'") \
        == "[Errno 28] No space left on device: 'x'"
    assert without_paths("a/b and 1.5/2 stay") == "a/b and 1.5/2 stay"

"""Large changelog entries are stored LZ4-compressed, their contribution counts compact;
readers, replay after kill -9 and followers see exactly the records of plain entries, and
entries written zstd-compressed or with counts as lists (by earlier versions) read back the
same."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from merge_engine.kv import changelog as log
from merge_engine.kv.tablet import KvTablet
from merge_engine.table.hidden_columns import CONTRIBUTIONS
from tally.bench.workload import Workload, table_descriptor

ROOT = Path(__file__).resolve().parent.parent
WORKLOAD = Workload(rows=30_000, keys=5_000, batch=10_000, seed=7)


def _write(path: Path) -> KvTablet:
    tablet = KvTablet.open(str(path), table_descriptor())
    for batch in WORKLOAD.batches():
        tablet.put(batch)
    tablet.put(WORKLOAD.make_batch(0).slice(0, 3))  # a small entry: stored plain
    return tablet


def _entries(tablet: KvTablet) -> list[tuple[int, bytes]]:
    return list(tablet._store.log_entries(0))


def _plain(monkeypatch) -> None:
    monkeypatch.setattr(log, "COMPRESS_FROM_BYTES", float("inf"))


def test_large_entries_are_compressed_and_read_back_as_plain_ones(tmp_path, monkeypatch):
    with _write(tmp_path / "compressed") as compressed:
        records = compressed.changelog(0, compressed.log_end_offset)
        rows = compressed.to_arrow()
        stored = _entries(compressed)
    _plain(monkeypatch)
    with _write(tmp_path / "plain") as plain:
        assert records.equals(plain.changelog(0, plain.log_end_offset))
        assert rows.equals(plain.to_arrow())
        plain_sizes = [len(data) for _, data in _entries(plain)]
    sizes = [len(data) for _, data in stored]
    assert len(sizes) == len(plain_sizes) == 4
    assert all(s * 3 < p * 2 for s, p in zip(sizes[:3], plain_sizes[:3]))  # the large ones
    assert sizes[3] == plain_sizes[3]  # the small one is stored as it was


def _written_as_before(path: Path, monkeypatch, name: str, value) -> None:
    """A bucket written as an earlier version wrote it: the changelog module's `name` set to
    `value` while it is written."""
    monkeypatch.setattr(log, name, value)
    _write(path).close()
    monkeypatch.undo()


def _continued(path: Path) -> tuple[pa.Table, pa.Table]:
    """A bucket reopened (its rows replayed) and given one more batch: its records and rows."""
    with KvTablet.open(str(path), table_descriptor()) as tablet:
        tablet.put(WORKLOAD.make_batch(1))
        return tablet.changelog(0, tablet.log_end_offset), tablet.to_arrow()


def _same(left: tuple[pa.Table, pa.Table], right: tuple[pa.Table, pa.Table]) -> bool:
    return all(a.equals(b) for a, b in zip(left, right))


def test_entries_written_with_zstd_read_back_as_plain_ones(tmp_path, monkeypatch):
    """A bucket written before entries were LZ4-compressed: its zstd entries are read, replayed
    after a reopen, and continued by new (LZ4) writes, with the records of plain entries."""
    with _write(tmp_path / "lz4"):
        pass
    _written_as_before(tmp_path / "zstd", monkeypatch, "_COMPRESSED",
                       pa.ipc.IpcWriteOptions(compression="zstd"))
    old = _continued(tmp_path / "zstd")
    _plain(monkeypatch)
    assert _same(old, _continued(tmp_path / "lz4"))


_KILLED_WRITER = """
import os, sys
sys.path.insert(0, {root!r})
from tests.test_changelog_compression import _write
_write(__import__("pathlib").Path({path!r}))
os._exit(0)  # no close, no flush: the rows exist only in the changelog
"""


def test_replay_after_a_crash_reads_compressed_entries(tmp_path, monkeypatch):
    path = tmp_path / "crashed"
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    subprocess.run([sys.executable, "-c", _KILLED_WRITER.format(root=str(ROOT), path=str(path))],
                   check=True, env=env, cwd=ROOT, timeout=600)
    with KvTablet.open(str(path), table_descriptor()) as reopened:
        assert reopened.replayed_records > 0
        rows = reopened.to_arrow()
        records = reopened.changelog(0, reopened.log_end_offset)
    _plain(monkeypatch)
    with _write(tmp_path / "plain") as plain:
        assert rows.equals(plain.to_arrow())
        assert records.drop_columns(["_offset"]).equals(
            plain.changelog(0, plain.log_end_offset).drop_columns(["_offset"]))


@pytest.mark.parametrize("nulls", [False, True])
def test_serialize_round_trips_every_column_kind(nulls):
    n = 20_000
    rng = np.random.default_rng(3)
    mask = rng.random(n) < 0.3 if nulls else None
    table = pa.table({
        "i": pa.array(rng.integers(-5, 5, n), mask=mask),
        "s": pa.array([f"v{i % 97}" for i in range(n)], mask=mask),
        "l": pa.array([[f"t{i % 5}"] * (i % 3) for i in range(n)]),
    })
    assert table.nbytes >= log.COMPRESS_FROM_BYTES
    data = log.serialize(table)
    assert len(data) < table.nbytes
    restored = pa.ipc.open_stream(pa.py_buffer(data)).read_all()
    assert restored.equals(table)


def _encode_in_child(records: pa.Table) -> None:
    from merge_engine.kv.pending_write import encoder

    data = encoder().submit(log.serialize, records).result()
    os._exit(0 if log.decode(data).equals(records) else 1)


def test_a_forked_child_encodes_large_entries_too(tmp_path):
    """Large entries are encoded on a worker thread; a child forked after the parent used the
    pool inherits no threads, and its encodings must still complete. (The child does not
    touch RocksDB, whose threads do not survive a fork either.)"""
    import multiprocessing

    from merge_engine.kv.pending_write import encoder

    with _write(tmp_path / "parent") as parent:  # starts the parent's encoding threads
        records = parent.changelog(0, parent.log_end_offset).drop_columns(["_offset"])
    assert encoder().submit(len, records).result() == records.num_rows
    child = multiprocessing.get_context("fork").Process(target=_encode_in_child,
                                                        args=(records,))
    child.start()
    child.join(timeout=600)  # generous: a hang is the failure, not a slow machine
    if child.is_alive():
        child.kill()
        pytest.fail("the forked child's encoding never finished")
    assert child.exitcode == 0


def _counts_table(lists: list) -> pa.Table:
    """Records with these contribution lists, and a column making the entry large enough to
    be stored compressed (the compact counts go with compression)."""
    n = len(lists)
    return pa.table({
        "s": pa.array([f"filler-{i % 89}-" * (1 + log.COMPRESS_FROM_BYTES // n // 8)
                       for i in range(n)]),
        CONTRIBUTIONS: pa.array(lists, type=pa.list_(pa.int64())),
    })


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(1, 3).flatmap(lambda width: st.lists(
    st.lists(st.sampled_from([0, 1, 2, -1, 127, -128, 128, 32767, -32769, 2**31, -2**63,
                              2**63 - 1]) | st.integers(-300, 300),
             min_size=width, max_size=width), min_size=1, max_size=200)))
def test_contribution_counts_are_stored_compact_and_read_back_exactly(lists):
    """Every record holding as many counts: stored as a fixed-size list of the narrowest
    integer holding them all (int64 only when one needs it), read back as the same lists."""
    table = _counts_table(lists)
    assert table.nbytes >= log.COMPRESS_FROM_BYTES
    data = log.serialize(table)
    stored = pa.ipc.open_stream(pa.py_buffer(data)).read_all().schema.field(CONTRIBUTIONS).type
    flat = [c for row in lists for c in row]
    width = next(t for t in (8, 16, 32, 64)
                 if all(-2 ** (t - 1) <= c < 2 ** (t - 1) for c in flat))
    assert pa.types.is_fixed_size_list(stored)
    assert stored.list_size == len(lists[0]) and stored.value_type.bit_width == width
    assert log.decode(data).equals(table)


@pytest.mark.parametrize("lists", [
    [[1, 2], [3], [4, 5]],          # records holding different numbers of counts
    [[1], None, [2]],               # a record without counts
    [[], [], []],                   # a table without counted columns
])
def test_contribution_counts_of_other_shapes_are_stored_as_lists(lists):
    table = _counts_table(lists)
    data = log.serialize(table)
    stored = pa.ipc.open_stream(pa.py_buffer(data)).read_all()
    assert stored.schema.field(CONTRIBUTIONS).type == pa.list_(pa.int64())
    assert log.decode(data).equals(table)


def test_entries_with_count_lists_written_before_read_back_the_same(tmp_path, monkeypatch):
    """A bucket whose large entries hold counts as lists of int64 (as earlier versions wrote
    them) reads, replays and continues exactly as one written with compact counts."""
    with _write(tmp_path / "compact") as compact:
        assert any(pa.types.is_fixed_size_list(
            pa.ipc.open_stream(pa.py_buffer(data)).read_all().schema.field(CONTRIBUTIONS).type)
            for _, data in _entries(compact))
    _written_as_before(tmp_path / "lists", monkeypatch, "_compact_counts", lambda records: records)
    assert _same(_continued(tmp_path / "lists"), _continued(tmp_path / "compact"))



def test_an_entry_past_its_buffer_bound_is_encoded_all_the_same(monkeypatch):
    """Large entries are encoded into one buffer sized for the worst case; should an entry
    outgrow it after all, it is encoded as before, to the same bytes."""
    rng = np.random.default_rng(5)
    table = pa.table({"b": pa.array([rng.bytes(64) for _ in range(4_000)], pa.binary())})
    assert table.nbytes >= log.COMPRESS_FROM_BYTES
    expected = log.serialize(table)  # incompressible: the bound holds all the same
    assert log.decode(expected).equals(table)
    monkeypatch.setattr(log.pa, "allocate_buffer", lambda size: pa.py_buffer(bytearray(1024)))
    assert log.serialize(table) == expected

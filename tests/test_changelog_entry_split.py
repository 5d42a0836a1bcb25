"""A large write's records are stored as two changelog entries (those of each half of its
keys), encoded side by side.

The split must change nothing a reader sees: the records, their offsets, replay, undo and a
reopen are those of one entry; and no entry ends between a key's -U and its +U (a reader
that takes one entry at a time always sees whole updates).
"""

from __future__ import annotations

from hypothesis import given, settings, strategies as st

from merge_engine.kv import pending_write
from merge_engine.kv.pending_write import _entry_keys
from merge_engine.kv.tablet import KvTablet
from recovery import undo_bucket
from tally.bench.workload import Workload, table_descriptor
from tests import crash_model

WORKLOAD = Workload(rows=30_000, keys=5_000, batch=10_000, seed=11)


@settings(max_examples=200, deadline=None)
@given(keys=st.integers(0, 100), image_bytes=st.integers(0, 2 * pending_write.SPLIT_FROM_BYTES))
def test_entries_cover_every_key_once_in_order(keys, image_bytes):
    """A slice's keys make one entry, or two (each half of its keys) once its images hold
    SPLIT_FROM_BYTES: every key in exactly one entry, in key order, none empty."""
    ranges = _entry_keys(keys, image_bytes)
    assert [k for start, stop in ranges for k in range(start, stop)] == list(range(keys))
    split = image_bytes >= pending_write.SPLIT_FROM_BYTES and keys >= 2
    assert len(ranges) == (2 if split else 1)
    assert all(stop > start for start, stop in ranges) or keys == 0


def _written(path, split: bool) -> KvTablet:
    saved = pending_write.SPLIT_FROM_BYTES
    pending_write.SPLIT_FROM_BYTES = 0 if split else float("inf")
    try:
        tablet = KvTablet.open(str(path), table_descriptor())
        for batch in WORKLOAD.batches():
            tablet.put(batch)
        return tablet
    finally:
        pending_write.SPLIT_FROM_BYTES = saved


def test_split_entries_read_replay_and_undo_as_one(tmp_path):
    split, whole = _written(tmp_path / "split", True), _written(tmp_path / "whole", False)
    with split, whole:
        spans = split.log_entry_spans()
        assert len(spans) == 2 * len(whole.log_entry_spans())
        changelog = split.changelog()
        assert changelog.equals(whole.changelog())
        types = changelog.column("_change_type").to_pylist()
        for first, _, _ in spans[1:]:  # no entry starts with the +U of an update
            assert types[first] != "+U"
        assert split.to_arrow().equals(whole.to_arrow())
        middle = spans[len(spans) // 2][0]
        for tablet in (split, whole):
            undo_bucket(tablet, middle)
        assert split.to_arrow().equals(whole.to_arrow())
    # Reopened (the rows replayed from the changelog past the last flush): still equal, and
    # each changelog replays to its rows (undo, which reads the range an entry at a time, may
    # order its own records differently).
    with KvTablet.open(str(tmp_path / "split"), table_descriptor()) as split, \
            KvTablet.open(str(tmp_path / "whole"), table_descriptor()) as whole:
        assert split.to_arrow().equals(whole.to_arrow())
        for tablet in (split, whole):
            assert crash_model.replay(tablet.changelog()) == \
                crash_model.table_state(tablet.to_arrow())

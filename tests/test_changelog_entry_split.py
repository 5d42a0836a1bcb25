"""A large write's records are stored as two changelog entries, encoded side by side.

The split must change nothing a reader sees: the records, their offsets, replay, undo and a
reopen are those of one entry; and no entry ends between a key's -U and its +U (a reader
that takes one entry at a time always sees whole updates).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from merge_engine import KvTablet
from merge_engine import changelog as log
from merge_engine import pending_write
from merge_engine.hidden_columns import CHANGE_CODE
from merge_engine.pending_write import _entries_of
from recovery import undo_bucket
from tests import crash_model
from tally.bench.workload import Workload, table_descriptor

WORKLOAD = Workload(rows=30_000, keys=5_000, batch=10_000, seed=11)
CODES = {name: code for code, name in enumerate(log.CHANGE_TYPES.to_pylist())}


@st.composite
def change_codes(draw):
    """A write's change types in key order: per key +I, -D, or -U then +U."""
    kinds = draw(st.lists(st.sampled_from(["+I", "-D", "update"]), min_size=1, max_size=60))
    codes = []
    for kind in kinds:
        codes += [CODES["-U"], CODES["+U"]] if kind == "update" else [CODES[kind]]
    return codes


@settings(max_examples=200, deadline=None)
@given(codes=change_codes())
def test_a_split_keeps_every_record_and_every_update_whole(codes):
    records = pa.table({CHANGE_CODE: pa.array(codes, pa.int8()),
                        "v": pa.array(np.arange(len(codes)), pa.int64())})
    saved = pending_write.SPLIT_FROM_BYTES
    pending_write.SPLIT_FROM_BYTES = 0
    try:
        parts = _entries_of(records)
    finally:
        pending_write.SPLIT_FROM_BYTES = saved
    assert pa.concat_tables(parts).equals(records)
    assert len(parts) == (2 if len(codes) >= 4 else 1)
    for part in parts:
        assert part.num_rows > 0
        kinds = part.column(CHANGE_CODE).to_pylist()
        assert kinds[0] != CODES["+U"] and kinds[-1] != CODES["-U"], kinds


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

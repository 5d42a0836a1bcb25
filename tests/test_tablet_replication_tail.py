"""Cutting a bucket's log tail (truncate_tail), leader epochs, checkpoints and the typed errors
of replication.

The property: a bucket that took random writes up to offset X and more after it, cut back to
X, equals a twin bucket that only took the writes up to X (changelog, every stored row's bytes,
snapshot rows and lookups, idempotent writers' states, leader epochs); then both take the same
further writes (the dropped ones again, with their writer sequences: a retry whose first
application was cut must apply again) and stay equal.
"""

from __future__ import annotations

import shutil
import tempfile

import pytest
from hypothesis import given, settings, strategies as st

from merge_engine.kv.replica_entries import ReplicatedEntry
from merge_engine.testing.profiles import examples, load_profile
from tally.errors import (FencedLeaderEpochError, InvalidInputError, OffsetOutOfRangeError,
                          StorageError)
from tests import replica_workload as rw
from tests.test_tablet_replication import apply_write

load_profile()


@st.composite
def write_runs(draw, kind: str, sequences: dict, size: int):
    """(op, seconds the clock moves before it): writes, some as idempotent writers."""
    run = []
    for _ in range(draw(st.integers(0, size))):
        op = draw(rw.writes(kind))
        writer = draw(st.sampled_from([None, "w1", "w2"]))
        if writer is not None:
            sequences[writer] = sequences.get(writer, 0) + 1
            op = type(op)(**{**op.__dict__, "writer": (writer, sequences[writer])})
        run.append((op, draw(st.integers(0, 6))))
    return run


def writers_after_cut(history: list, cut: int) -> dict:
    """The writers' states truncate_tail(cut) leaves: a writer whose last write ended at or
    below the cut keeps it; one that wrote past it gets its last write that changed rows and
    ended at or below the cut (writes that changed nothing leave no entry to find), or none."""
    states = {}
    for writer, sequence, end, changed in history:
        last = [h for h in history if h[0] == writer][-1]
        if last[2] <= cut:
            states[writer] = (last[1], last[2])
        elif changed and end <= cut:
            states[writer] = (sequence, end)
    return states


def same_bucket(tablet, twin) -> None:
    assert tablet.log_end_offset == twin.log_end_offset
    assert tablet.changelog().equals(twin.changelog())
    assert rw.rows_of(tablet) == rw.rows_of(twin)
    assert rw.lookups_of(tablet) == rw.lookups_of(twin)
    assert rw.stored_rows(tablet) == rw.stored_rows(twin)
    assert tablet.leader_epochs == twin.leader_epochs


@settings(max_examples=examples(60), deadline=None)
@given(data=st.data(), kind=st.sampled_from(rw.KINDS), slice_rows=st.sampled_from([None, 2]),
       buffer_size=st.sampled_from([None, "1kb"]), reopen=st.booleans(), inside=st.booleans())
def test_truncate_tail_equals_a_twin_that_stopped_there(data, kind, slice_rows, buffer_size,
                                                         reopen, inside):
    sequences: dict[str, int] = {}
    before = data.draw(write_runs(kind, sequences, 8), label="before")
    after = data.draw(write_runs(kind, sequences, 6), label="after")
    directory = tempfile.mkdtemp(prefix="tally-tail-")
    clock = rw.Clock()
    tablet = rw.open_bucket(f"{directory}/bucket", kind, clock, buffer_size, slice_rows)
    twin = rw.open_bucket(f"{directory}/twin", kind, clock, buffer_size, slice_rows)
    try:
        for bucket in (tablet, twin):
            bucket.record_leader_epoch(1, 0)
        history = []  # (writer, sequence, end, changed) of the writers' accepted writes
        for op, seconds in before:
            clock.now += seconds
            start = tablet.log_end_offset
            end = apply_write(tablet, op)
            assert apply_write(twin, op) == end
            if op.writer is not None and end is not None:
                history.append((*op.writer, end, end > start))
        cut = tablet.log_end_offset
        for bucket in (tablet, twin):
            bucket.record_leader_epoch(2, cut)
        for op, seconds in after:
            clock.now += seconds
            start = tablet.log_end_offset
            end = apply_write(tablet, op)
            if op.writer is not None and end is not None:
                history.append((*op.writer, end, end > start))
        if tablet.log_end_offset > cut:
            tablet.record_leader_epoch(3, tablet.log_end_offset)
        offset = cut
        spans = [span for span in tablet.log_entry_spans() if span[0] == cut]
        if inside and spans and spans[0][1] - cut > 1:
            offset = cut + 1  # inside the first dropped entry: cut at its start
        if reopen:
            tablet.close()
            tablet = rw.open_bucket(f"{directory}/bucket", kind, clock, buffer_size, slice_rows)
        assert tablet.truncate_tail(offset) == cut
        same_bucket(tablet, twin)
        expected = writers_after_cut(history, cut)
        assert tablet.writer_states() == expected

        # The same writes again on both (the cut ones' sequences apply anew), then more; not
        # those whose sequences the bucket kept (writes that changed nothing at the cut).
        further = [(op, s) for op, s in after
                   if op.writer is None or op.writer[1] > expected.get(op.writer[0], (0,))[0]]
        further += data.draw(write_runs(kind, sequences, 4), label="further")
        wrote = set()
        for op, seconds in further:
            clock.now += seconds
            end = apply_write(tablet, op)
            assert apply_write(twin, op) == end
            if op.writer is not None and end is not None:
                wrote.add(op.writer[0])
        same_bucket(tablet, twin)
        twin_states = twin.writer_states()
        assert tablet.writer_states() == {
            **expected, **{w: twin_states[w] for w in wrote if w in twin_states}}
    finally:
        tablet.close()
        twin.close()
        shutil.rmtree(directory, ignore_errors=True)


# --- examples -----------------------------------------------------------------------------------


def bucket(tmp_path, name="bucket", kind="aggregation", **options):
    return rw.open_bucket(tmp_path / name, kind, rw.Clock(), **options)


def test_a_retry_of_a_cut_write_applies_again(tmp_path):
    with bucket(tmp_path) as tablet:
        tablet.put([{"k": 1, "qty": 1}], writer=("w", 1))
        cut = tablet.log_end_offset
        tablet.put([{"k": 1, "qty": 2}, {"k": 2, "qty": 5}], writer=("w", 2))
        assert tablet.put([{"k": 1, "qty": 2}, {"k": 2, "qty": 5}], writer=("w", 2)) == 4
        assert tablet.truncate_tail(cut) == cut
        assert tablet.writer_states() == {"w": (1, cut)}
        assert tablet.lookup({"k": 1})["qty"] == 1 and tablet.lookup({"k": 2}) is None
        assert tablet.put([{"k": 1, "qty": 2}, {"k": 2, "qty": 5}], writer=("w", 2)) == 4
        assert tablet.lookup({"k": 1})["qty"] == 3


def test_a_writer_whose_only_writes_were_cut_is_forgotten(tmp_path):
    with bucket(tmp_path) as tablet:
        tablet.put([{"k": 1, "qty": 1}], writer=("a", 7))
        tablet.put([{"k": 2, "qty": 1}], writer=("b", 3))
        assert tablet.truncate_tail(1) == 1
        assert tablet.writer_states() == {"a": (7, 1)}
        assert tablet.truncate_tail(0) == 0
        assert tablet.writer_states() == {} and tablet.to_arrow().num_rows == 0


def test_a_write_of_several_entries_names_its_writer_on_the_last(tmp_path):
    with bucket(tmp_path, slice_rows=1) as tablet:
        end = tablet.put([{"k": k, "qty": k} for k in range(3)], writer=("w", 1))
        entries = tablet.replication_entries(0)
        assert [(e.first_offset, e.end_offset, e.writer) for e in entries] == \
            [(0, 1, None), (1, 2, None), (2, 3, ("w", 1))]
        with bucket(tmp_path, "follower") as follower:
            follower.apply_replicated(entries[:2])
            assert follower.writer_states() == {}  # half a write is not the writer's write
            follower.apply_replicated(entries[2:])
            assert follower.writer_states() == {"w": (1, end)}


def test_replication_entries_stop_at_max_bytes_with_whole_entries(tmp_path):
    with bucket(tmp_path) as tablet:
        for k in range(5):
            tablet.put([{"k": k, "qty": k}])
        sizes = [len(e.data) for e in tablet.replication_entries(0)]
        assert len(sizes) == 5
        assert len(tablet.replication_entries(1, max_bytes=1)) == 1
        assert len(tablet.replication_entries(1, max_bytes=sizes[1] + 1)) == 2
        assert tablet.replication_entries(5) == []


def test_retention_drops_the_writer_records_with_their_entries(tmp_path):
    with bucket(tmp_path) as tablet:
        for seq in range(1, 4):
            tablet.put([{"k": seq, "qty": 1}], writer=("w", seq))
        tablet.truncate_log(2)
        assert [first for first, _, _ in tablet._store.entry_writers_below(10)] == [2]
        assert [e.writer for e in tablet.replication_entries(2)] == [("w", 3)]


def test_leader_epochs(tmp_path):
    with bucket(tmp_path) as tablet:
        assert tablet.leader_epochs == [] and tablet.epoch_end_offset(4) == 0
        tablet.record_leader_epoch(2, 0)
        for k in range(3):
            tablet.put([{"k": k, "qty": 1}])
        tablet.record_leader_epoch(5, 3)
        tablet.record_leader_epoch(5, 3)  # the same record again: nothing
        tablet.put([{"k": 9, "qty": 1}])
        assert tablet.leader_epochs == [(2, 0), (5, 3)]
        assert [tablet.epoch_end_offset(e) for e in (1, 2, 3, 5, 6)] == [0, 3, 3, 4, 4]
        with pytest.raises(FencedLeaderEpochError, match="epoch 5"):
            tablet.record_leader_epoch(4, 4)
        with pytest.raises(FencedLeaderEpochError):
            tablet.record_leader_epoch(5, 4)
        with pytest.raises(OffsetOutOfRangeError):
            tablet.record_leader_epoch(6, 2)
        assert tablet.leader_epochs == [(2, 0), (5, 3)]
        tablet.truncate_tail(2)
        assert tablet.leader_epochs == [(2, 0)]
    with bucket(tmp_path) as tablet:
        assert tablet.leader_epochs == [(2, 0)]


def test_nothing_is_applied_from_entries_that_do_not_continue_the_log(tmp_path):
    with bucket(tmp_path, "leader") as leader, bucket(tmp_path, "follower") as follower:
        for seq in range(1, 5):
            leader.put([{"k": seq, "qty": seq}], writer=("w", seq))
        entries = leader.replication_entries(0)
        follower.apply_replicated(entries[:1])
        damaged = ReplicatedEntry(2, 3, b"not arrow", 0)
        bad = {"a gap": entries[2:], "an overlap": entries[:2], "a gap inside": [entries[1], entries[3]]}
        for name, chosen in bad.items():
            with pytest.raises(OffsetOutOfRangeError, match="nothing was applied"):
                follower.apply_replicated(chosen)
        with pytest.raises(InvalidInputError):
            follower.apply_replicated([entries[1], damaged])
        with pytest.raises(InvalidInputError):
            follower.apply_replicated([ReplicatedEntry(1, 3, entries[1].data, 0)])
        assert follower.log_end_offset == 1 and follower.writer_states() == {"w": (1, 1)}
        assert follower.changelog().equals(leader.changelog(0, 1))
        assert follower.apply_replicated(entries[1:]) == 4


def test_offsets_out_of_range_are_refused(tmp_path):
    with bucket(tmp_path, slice_rows=1) as tablet:
        tablet.put([{"k": k, "qty": 1} for k in range(4)])
        tablet.truncate_log(2)
        for offset in (-1, 1, 5, "3"):
            with pytest.raises(OffsetOutOfRangeError):
                tablet.truncate_tail(offset)
            with pytest.raises(OffsetOutOfRangeError):
                tablet.replication_entries(offset)
        assert tablet.log_end_offset == 4 and tablet.to_arrow().num_rows == 4


def test_a_checkpoint_opens_as_the_bucket_it_copied(tmp_path):
    with bucket(tmp_path, kind="row-ttl", buffer_size="1kb") as tablet:
        tablet.record_leader_epoch(1, 0)
        for seq in range(1, 30):
            tablet.put([{"k": seq % 6, "qty": seq, "tags": "a"}], writer=(f"w{seq % 3}", seq))
            tablet.delete([{"k": seq % 5}], target_columns=["k", "tags"])
        state = (rw.rows_of(tablet), rw.lookups_of(tablet), tablet.changelog(),
                 tablet.writer_states(), tablet.leader_epochs)
        assert tablet.checkpoint(str(tmp_path / "copy")) == tablet.log_end_offset
        with pytest.raises(StorageError, match="exists"):
            tablet.checkpoint(str(tmp_path / "copy"))
        tablet.put([{"k": 1, "qty": 1}])
        raw = rw.stored_rows(tablet)
    shutil.copytree(tmp_path / "copy", tmp_path / "moved")
    with rw.open_bucket(tmp_path / "moved", "row-ttl", rw.Clock()) as copy:
        assert (rw.rows_of(copy), rw.lookups_of(copy), copy.changelog(), copy.writer_states(),
                copy.leader_epochs) == state
        copy.put([{"k": 1, "qty": 1}])
        assert rw.stored_rows(copy) == raw


def test_entries_travel_as_arrow(tmp_path):
    with bucket(tmp_path) as tablet:
        tablet.put([{"k": 1, "qty": 1}], writer=("w", 4))
        tablet.put([{"k": 2, "qty": 1}])
        entries = tablet.replication_entries(0)
        table = ReplicatedEntry.to_arrow(entries)
        assert table.column_names == ["first_offset", "end_offset", "written_ms", "data",
                                      "writer_id", "writer_sequence"]
        assert ReplicatedEntry.from_arrow(table) == entries
        assert ReplicatedEntry.from_arrow(table.set_column(
            3, "data", table.column("data").cast("binary"))) == entries

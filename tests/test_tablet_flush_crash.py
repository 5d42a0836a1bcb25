"""A crash inside a flush of the row buffer loses nothing and shows nothing half-applied.

Rows reach RocksDB after their write's changelog has committed, in write batches of their own,
with the offset they are applied up to in the last one; a write whose rows alone outgrow the
buffer has them read back from its changelog and written the same way. The buffer tests'
writer process (a 1 KB buffer and two rows per write batch, so flushes take many batches) is
ended right after its N-th RocksDB commit, for N spread over its first writes: the
crash lands right after a changelog commit and between the batches of both kinds of flush
(rows are written without RocksDB's write-ahead log, so half the crashes first flush
RocksDB's memtables, as it does when one fills up, and leave the rows of a cut-short flush). The
reopened tablet must equal the reference model fed the acknowledged writes, plus the write in
flight when its changelog had committed, and the replay of its own changelog.
"""

from __future__ import annotations

from merge_engine.kv.tablet import KvTablet
from merge_engine.testing import ReferenceTable
from tests import buffer_writer as bw
from tests.test_tablet_buffer import check_tablet, feed, live_rows_at, props, run_writer, stored

SIZE, SEED, WRITES = "1kb", 11, 40
COMMITS = range(1, 184, 7)  # the first 40 writes make 183 commits, flushes included


def test_a_crash_between_a_commit_and_the_end_of_its_flush_loses_nothing(tmp_path):
    mid_flush = 0
    for n in COMMITS:
        path = tmp_path / f"died-at-{n}"
        # every other crash finds RocksDB's memtables just flushed (as when one fills up):
        # only then do the rows of a flush cut short outlive the process
        die = "die-persisted" if n % 2 else "die"
        run = run_writer(path, props(SIZE), SEED, "batch-rows:2", f"{die}:{n}",
                         f"write:0:{WRITES}")
        assert run.died, f"the writer made fewer than {n} commits"
        model = ReferenceTable(bw.spec())
        assert run.outcomes == feed(model, SEED, range(len(run.outcomes)))
        disk = stored(path)
        in_flight = len(run.outcomes)
        if disk.end != model.log_end_offset:  # the write in flight had committed its changelog
            feed(model, SEED, [in_flight])
        assert disk.end == model.log_end_offset, f"died at commit {n}: {disk}"
        # RocksDB holds rows past the applied offset: the crash split a flush
        mid_flush += disk.rows != live_rows_at(model.changelog, disk.applied)
        with KvTablet.open(str(path), bw.spec(props(SIZE)).descriptor()) as tablet:
            check_tablet(tablet, model)
    assert mid_flush >= 3, f"only {mid_flush} crashes landed inside a flush"

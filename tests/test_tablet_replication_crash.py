"""A crash while a follower applies its leader's entries, or while a bucket cuts its log tail,
leaves a bucket that reopens consistent.

The buffer tests' writer process (tests/buffer_writer: its table and workload, a 1 KB row
buffer and two rows per RocksDB write batch, so a flush takes many batches) is ended right
after its N-th RocksDB commit, for N spread over the whole operation, and also killed with
SIGKILL after a random delay. The reopened bucket must hold its changelog's replay (checked
with the reference model), be exactly a prefix of the leader's log (a follower) or the log
before or after the cut (truncate_tail), and hold the writers' states of that log.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time

from merge_engine.kv.tablet import KvTablet
from merge_engine.testing import ReferenceTable, records_from_arrow, same_row
from tests import buffer_writer as bw
from tests.test_tablet_buffer import ROOT, props, run_writer

SIZE, SEED, WRITES = "1kb", 5, 60


def leader_bucket(tmp_path):
    """A closed leader bucket that took the workload; its changelog, rows and writer states."""
    path = tmp_path / "leader"
    run_writer(path, props(SIZE), SEED, f"write:0:{WRITES}")
    with KvTablet.open(str(path), bw.descriptor(props(SIZE))) as leader:
        return (path, leader.changelog(), leader.to_arrow().to_pylist(), leader.writer_states(),
                leader.replication_entries(0))


def writers_up_to(entries, end: int) -> dict:
    states = {}
    for entry in entries:
        if entry.end_offset <= end and entry.writer is not None:
            states[entry.writer[0]] = (entry.writer[1], entry.end_offset)
    return states


def check_consistent(path) -> KvTablet:
    """Reopen the bucket at `path` (the caller closes it): its rows are its changelog's replay."""
    tablet = KvTablet.open(str(path), bw.descriptor(props(SIZE)))
    changelog = tablet.changelog()
    assert changelog.column("_offset").to_pylist() == list(range(tablet.log_end_offset))
    rows = tablet.to_arrow().to_pylist()
    replayed = ReferenceTable(bw.spec()).replay(records_from_arrow(changelog, bw.spec().names)).rows()
    assert len(rows) == len(replayed) and all(map(same_row, rows, replayed)), \
        "the rows differ from the replay of the changelog"
    return tablet


def spawn(path, *steps) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    return subprocess.Popen(
        [sys.executable, "-m", "tests.buffer_writer", str(path), json.dumps(props(SIZE)),
         str(SEED), *steps], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env, cwd=ROOT)


def test_a_follower_killed_while_it_applies_reopens_as_a_prefix_of_its_leader(tmp_path):
    source, changelog, rows, writers, entries = leader_bucket(tmp_path)
    follower = tmp_path / "follower"
    rnd = random.Random(SEED)
    n, kills, died = 1, 0, 0
    while True:
        # now and then a real SIGKILL after a random delay, once the crashes at a commit
        # (which do not depend on the machine's speed) have had their turns
        if died >= 3 and kills % 3 == 2:
            child = spawn(follower, "batch-rows:2", f"follow:{source}:{rnd.choice([1, 2000])}")
            time.sleep(rnd.uniform(0.3, 1.5))
            if child.poll() is None:
                child.send_signal(signal.SIGKILL)
            child.wait()
            done = False
        else:
            run = run_writer(follower, props(SIZE), SEED, "batch-rows:2", f"die:{n}",
                             f"follow:{source}:{rnd.choice([1, 700])}")
            done = not run.died
            died += run.died
            n += 2
        kills += 1
        with check_consistent(follower) as tablet:
            end = tablet.log_end_offset
            assert end in {e.first_offset for e in entries} | {changelog.num_rows}
            assert tablet.changelog().equals(changelog.slice(0, end))
            assert tablet.writer_states() == writers_up_to(entries, end)
            if done:
                assert end == changelog.num_rows
                assert all(map(same_row, tablet.to_arrow().to_pylist(), rows))
                break
    # counted on the deterministic crashes only (at the n-th commit): the SIGKILLs after a
    # random delay land wherever the machine's speed puts them
    assert died >= 3, f"only {died} crashes at a commit: the follower caught up too soon"


def test_a_bucket_killed_while_it_cuts_its_tail_reopens_before_or_after_the_cut(tmp_path):
    source, changelog, _, _, entries = leader_bucket(tmp_path)
    cut = entries[len(entries) // 3].first_offset
    # More writes whose rows stay in the row buffer (the default size), so the cut's flush
    # comes first and takes many batches: crashes land in it and right after the cut.
    more = f"write:{WRITES}:8"
    shutil.copytree(source, tmp_path / "full")
    run_writer(tmp_path / "full", props(None), SEED, more)
    with KvTablet.open(str(tmp_path / "full"), bw.descriptor()) as tablet:
        full = tablet.changelog()
        full_writers = tablet.writer_states()
    expected_after = ReferenceTable(bw.spec()).replay(
        records_from_arrow(changelog.slice(0, cut), bw.spec().names)).rows()
    outcomes = set()
    for n in range(1, 200, 2):
        path = tmp_path / f"cut-{n}"
        shutil.copytree(source, path)
        run = run_writer(path, props(None), SEED, more, "batch-rows:2", f"die:{n}",
                         f"tail:{cut}")
        with check_consistent(path) as tablet:
            end = tablet.log_end_offset
            assert end in (cut, full.num_rows), f"died at commit {n}: log end {end}"
            assert tablet.changelog().equals(full.slice(0, end))
            if end == cut:
                assert all(map(same_row, tablet.to_arrow().to_pylist(), expected_after))
                assert tablet.writer_states() == {
                    writer: state for writer, state in full_writers.items() if state[1] <= cut
                } | {writer: state for writer, state in writers_up_to(entries, cut).items()
                     if full_writers[writer][1] > cut}
            else:
                assert tablet.writer_states() == full_writers
            outcomes.add(end)
        shutil.rmtree(path)
        if not run.died:
            break
    assert outcomes == {cut, full.num_rows}, f"the crashes left only the log ends {outcomes}"

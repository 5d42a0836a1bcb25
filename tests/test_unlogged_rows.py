"""Rows written without RocksDB's write-ahead log survive kill -9 through the changelog.

A child process (tests.unlogged_rows_job) writes with a small row buffer, so its rows reach
RocksDB's memtables every few writes, and between writes it truncates the changelog, cuts
the log's tail and makes checkpoints: each of those deletes changelog entries or copies the
database, the moments a lost memtable could take rows with it. It then kills itself. The
reopened bucket, and every checkpoint, must hold exactly the rows of the writes that stand
(computed in plain Python by the crash model), with the log offsets the child reported.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings, strategies as st

from tests import crash_model
from tests.crash_writer import descriptor, make_write

ROOT = Path(__file__).resolve().parent.parent
CHILD_TIMEOUT = 300.0  # generous: a loaded machine only makes it slower

STEPS = st.one_of(
    st.tuples(st.just("write"), st.integers(1, 6)),
    st.tuples(st.just("truncate")),
    st.tuples(st.just("cut"), st.integers(1, 3)),
    st.tuples(st.just("checkpoint")),
)
# Each plan writes before and after its other steps, so they find rows to lose.
PLANS = st.lists(STEPS, min_size=1, max_size=6).map(
    lambda steps: [("write", 3)] + steps + [("write", 2)])


def run_child(path: Path, seed: int, plan: list) -> dict:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    child = subprocess.run(
        [sys.executable, "-m", "tests.unlogged_rows_job", str(path), str(seed), json.dumps(plan)],
        capture_output=True, text=True, env=env, cwd=ROOT, timeout=CHILD_TIMEOUT)
    assert child.returncode == -signal.SIGKILL, child.stderr[-3000:]
    return json.loads(child.stdout.strip().splitlines()[-1])


def expected(seed: int, kept: list[int]) -> crash_model.State:
    state: crash_model.State = {}
    for seq in kept:
        state = crash_model.apply(state, make_write(seed, seq))
    return {key: dict(row) for key, row in state.items()}


def stored(path: str) -> tuple[crash_model.State, int, int]:
    from merge_engine.kv.tablet import KvTablet

    with KvTablet.open(path, descriptor()) as tablet:
        return (crash_model.table_state(tablet.to_arrow()), tablet.log_end_offset,
                tablet.log_start_offset)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(plan=PLANS, seed=st.integers(0, 10_000))
def test_rows_survive_kill_after_truncations_cuts_and_checkpoints(plan, seed):
    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / "bucket"
        done = run_child(path, seed, plan)
        rows, end, start = stored(str(path))
        assert (end, start) == (done["end"], done["start"])
        assert rows == expected(seed, done["kept"])
        for copy, kept in done["checkpoints"]:
            assert stored(copy)[0] == expected(seed, kept), f"checkpoint {copy}"


def test_truncation_right_after_a_flush_keeps_the_rows():
    """The plainest case: rows flushed (to the memtables only), the whole changelog dropped,
    the process killed. Without the memtables flushed first, the rows would be gone."""
    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / "bucket"
        done = run_child(path, 7, [("write", 12), ("truncate",)])
        rows, end, start = stored(str(path))
        assert start == end == done["end"] > 0
        assert rows and rows == expected(7, done["kept"])

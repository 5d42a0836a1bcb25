"""kill -9 of a tablet server at random points during writes, many times over one cluster.

Each trial makes a fresh table (4 buckets x 2 partitions over both tablet servers, deletes
allowed so changelogs carry -D too), starts a writer process (tests/cluster/write_process.py)
that prints `ACK i` after each acknowledged flush, and SIGKILLs one tablet server after a random
number of acknowledgements plus a random sub-write delay. Then, alternating:

- **the writer survives**: the server is restarted after a random pause; the writer's retries
  (same writer id and sequence) must land every write exactly once, so the table equals the
  fold of every write;
- **the writer dies too** (SIGKILL at the same moment): the write in flight is lost on the
  client side. Per bucket, the table must equal the fold of the acknowledged writes, or of those
  plus the in-flight write's part for that bucket: whole, never partial (one request per bucket
  is one atomic KvTablet write).

In both, every bucket's rows must equal the replay of its changelog. The server is restarted on
its data directory each trial, so later trials also run against tablets that survived earlier
kills. `TALLY_KILL9_TRIALS` sets the number of trials per metadata store (default 30).
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
import threading
import time

import pytest

from tests.cluster import reference_workload
from tests.cluster.write_process import ACK, READY
from tests.reliability.consistency import assert_kv_matches_changelog, split_by_bucket

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TRIALS = int(os.environ.get("TALLY_KILL9_TRIALS", "30"))
STEPS, ROWS, DELETE_SHARE = 16, 400, 0.15
DESCRIPTOR_PROPERTIES = {"table.delete.behavior": "allow"}


class AckedWriter:
    """A writer process started ahead of its trial (it waits for `go`), and the
    acknowledgements it printed so far (read on a thread)."""

    def __init__(self, url: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.cluster.write_process", url, "-", "0", str(STEPS),
             str(ROWS), "--acks", "--delete-share", str(DELETE_SHARE)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT,
            env={**os.environ, "PYTHONPATH": ROOT})
        self.ready = threading.Event()
        self.acks: list[int] = []
        self.finished = False
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            text = line.decode().strip()
            if text == READY:
                self.ready.set()
            elif text.startswith(ACK):
                self.acks.append(int(text.split()[1]))
            elif text.startswith("{"):
                self.finished = True

    def go(self, table: str, seed: int) -> None:
        assert self.ready.wait(60), f"the writer did not start: {self.stderr()}"
        self.proc.stdin.write(f"{table} {seed}\n".encode())
        self.proc.stdin.close()

    def wait_for_acks(self, count: int, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while len(self.acks) < count:
            assert self.proc.poll() is None or len(self.acks) >= count, self.stderr()
            assert time.monotonic() < deadline, f"only {len(self.acks)} acks within {timeout}s"
            time.sleep(0.001)

    def kill(self) -> None:
        self.proc.kill()
        self.join()

    def join(self, timeout: float = 120) -> int:
        self.proc.wait(timeout)
        self._reader.join(timeout)
        return self.proc.returncode

    def stderr(self) -> str:
        return self.proc.stderr.read().decode()[-3000:] if self.proc.poll() is not None else ""


@pytest.fixture(scope="module")
def spare_writers(cluster):
    """Hands out writer processes, starting the next one as soon as one is taken."""
    spare = [AckedWriter(cluster.url)]

    def take() -> AckedWriter:
        writer = spare.pop()
        spare.append(AckedWriter(cluster.url))
        return writer

    yield take
    for writer in spare:
        writer.kill()


@pytest.mark.parametrize("trial", range(TRIALS))
def test_kill9_tablet_server_loses_no_acknowledged_write(cluster, conn, table_name,
                                                          spare_writers, trial):
    rng = random.Random(f"kill9-{cluster.store_kind}-{trial}")
    writer_dies = trial % 2 == 1
    victim = rng.randrange(len(cluster.tablet_servers))
    conn.admin.create_table(table_name,
                            reference_workload.descriptor(buckets=4, **DESCRIPTOR_PROPERTIES))
    writes = reference_workload.steps(trial, STEPS, ROWS, delete_share=DELETE_SHARE)
    writer = spare_writers()
    try:
        writer.go(table_name, trial)
        writer.wait_for_acks(rng.randrange(1, STEPS // 2))
        time.sleep(rng.uniform(0, 0.01))  # land anywhere inside the next write
        cluster.kill_tablet_server(victim)
        if writer_dies:
            writer.kill()
        killed_during_writes = not writer.finished
        time.sleep(rng.uniform(0, 0.3))
        cluster.start_tablet_server(victim)
        if not writer_dies:
            assert writer.join() == 0, writer.stderr()
    finally:
        if writer.proc.poll() is None:
            writer.kill()
    assert killed_during_writes, "the kill must land while the writer is still writing"

    acked = writer.acks
    assert acked == list(range(len(acked))), f"acknowledgements out of order: {acked}"
    by_bucket = assert_kv_matches_changelog(conn, table_name)
    routing = conn.table(table_name).routing
    if not writer_dies:
        assert len(acked) == STEPS
        assert by_bucket == split_by_bucket(routing, reference_workload.fold_steps(writes))
    else:
        assert len(acked) < STEPS
        without = split_by_bucket(routing, reference_workload.fold_steps(writes[:len(acked)]))
        with_next = split_by_bucket(routing, reference_workload.fold_steps(writes[:len(acked) + 1]))
        for where in set(by_bucket) | set(without) | set(with_next):
            got = by_bucket.get(where, {})
            assert got in (without.get(where, {}), with_next.get(where, {})), \
                f"bucket {where} after {len(acked)} acknowledged writes is neither without nor " \
                f"with write {len(acked)}: acknowledged data lost or a write applied partially"
    conn.admin.drop_table(table_name)

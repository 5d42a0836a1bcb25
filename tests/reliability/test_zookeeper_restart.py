"""ZooKeeper stopped and restarted during a Spark streaming job into Tally: the job recovers and
the table is exact.

A private ZooKeeper (stopping the session one would disturb other tests) backs a LocalCluster;
a streaming job (tests/spark/stream_job.py, a subprocess with its own JVM) aggregates a
replayable file source through TallySink, one file per micro-batch. Twice, once the job has
committed a given epoch, ZooKeeper is stopped for 10 s (longer than the 6 s session timeout,
and several micro-batches long), then started again on its data. While it is down the
coordinator cannot read or write metadata, so the job's epoch baselines, commits and lease
renewals fail as unavailable and are retried by the client; writes to tablet servers go on.
(ZooKeeper restores sessions from its log with a fresh timeout, so the servers' ephemeral nodes
usually survive; the cluster re-creates them when they do not.) The job must finish (a restart
from its checkpoint is allowed, and reported, as a supervisor would do it), and the table must
equal the fold of every source row exactly once for sum, count, string_agg, array_agg and
last_value_ignore_nulls.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time

import pytest

from tally import client
from tally.server import LocalCluster
from tests.zookeeper_server import ZooKeeperServer

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OUTAGE_SECONDS = 10.0   # above the 6 s ZooKeeper session timeout of servers and coordinator
OUTAGES_AFTER_EPOCHS = (0, 4)
FILES, ROWS_PER_FILE, KEYS = 10, 200, 40
TABLE = "zk.totals"

pytestmark = pytest.mark.skipif(shutil.which("java") is None,
                                reason="Spark needs Java (make test installs it)")


def start_job(spec: dict) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": ROOT, "PYSPARK_PYTHON": sys.executable}
    return subprocess.Popen([sys.executable, "-m", "tests.spark.stream_job", json.dumps(spec)],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


def wait_for_commit(conn, job: subprocess.Popen, epoch: int, timeout: float = 180) -> int:
    """The job owner's last committed epoch, once it is `epoch` or later."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert job.poll() is None, f"the job ended early: {job.communicate()[1][-3000:]}"
        for lock in conn.locks.describe(TABLE):
            found = conn.locks.last_commit(TABLE, lock["owner_id"])
            if found is not None and found[0] >= epoch:
                return found[0]
        time.sleep(0.1)
    raise AssertionError(f"the job did not commit epoch {epoch} in time")


def test_zookeeper_outage_during_a_streaming_job(tmp_path):
    from tests.spark import sink_data

    zookeeper = ZooKeeperServer(str(tmp_path / "zookeeper"))
    zookeeper.start()
    try:
        with LocalCluster(str(tmp_path / "cluster"), tablet_servers=2,
                          zookeeper=f"{zookeeper.hosts}/tally-zk-outage") as cluster, \
                client.connect(cluster.url, retry_timeout=120) as conn:
            sink_data.create_table(conn, TABLE)
            batches = sink_data.write_source_files(str(tmp_path / "source"), FILES,
                                                  ROWS_PER_FILE, KEYS, seed=5)
            spec = {"url": cluster.url, "table": TABLE, "source": str(tmp_path / "source"),
                    "checkpoint": str(tmp_path / "checkpoint"), "schema": sink_data.SCHEMA_DDL,
                    "options": {"client.column-lock.ttl": "60"}}
            job = start_job(spec)
            outages = []  # (last committed epoch when ZooKeeper stopped, the job still running)
            try:
                for epoch in OUTAGES_AFTER_EPOCHS:
                    committed = wait_for_commit(conn, job, epoch)
                    zookeeper.stop()
                    outages.append((committed, job.poll() is None))
                    time.sleep(OUTAGE_SECONDS)
                    zookeeper.start()
                out, err = job.communicate(timeout=600)
            finally:
                if job.poll() is None:
                    job.kill()
            restarted = job.returncode != 0
            if restarted:  # recovery by a restart from the checkpoint, as a supervisor would
                print(f"the job failed across the outage ({err[-2000:]}); restarting it")
                job = start_job(spec)
                out, err = job.communicate(timeout=600)
            assert job.returncode == 0, err[-3000:]
            assert all(running and epoch < FILES - 1 for epoch, running in outages), \
                f"ZooKeeper must go down while the job has micro-batches to run: {outages}"
            rows = [r for batch in batches for r in batch]
            assert sink_data.table_state(conn, TABLE) == sink_data.expected(rows)
            servers = conn.admin.list_servers()
            assert all(s["live"] for s in servers), servers
            print(f"outages after epochs {[e for e, _ in outages]}; job restarted: {restarted}")
    finally:
        zookeeper.stop()

"""The exactly-once stream into a replicated table, with a tablet server killed (kill -9) in
the middle of a micro-batch: the job goes on, its writes find the new leaders, and the table
ends exactly once.

A cluster of three tablet servers of its own (every bucket has three copies, two must hold a
write before it is acknowledged); the killed server is the leader of bucket 0, killed from
inside a write task of the second micro-batch after half of that task's writes.
"""

from __future__ import annotations

import pytest

import tally
from tally.server import LocalCluster
from tests.cluster.replica_checks import leader_index, wait_fully_in_sync
from tests.spark import sink_data
from tests.spark.test_kill_restart import run_job


@pytest.fixture(scope="module")
def replicated(tmp_path_factory):
    data_dir = tmp_path_factory.mktemp("replicated-stream")
    with LocalCluster(str(data_dir), tablet_servers=3, session_timeout=3.0) as cluster:
        yield cluster


def test_stream_ends_exact_when_a_leader_dies_mid_batch(replicated, tmp_path):
    name = "default.replicated_stream"
    with tally.connect(replicated.url, retry_timeout=120) as conn:
        sink_data.create_table(conn, name)
        leader = conn.admin.bucket_replicas(name)[(None, 0)]["leader"]
        victim = leader_index(replicated, leader)
        files = sink_data.write_source_files(str(tmp_path / "source"), 4, 30, 10, seed=41)
        spec = {"url": replicated.url, "table": name, "source": str(tmp_path / "source"),
                "checkpoint": str(tmp_path / "checkpoint"), "schema": sink_data.SCHEMA_DDL,
                "options": {"client.column-lock.ttl": "30"},
                "kill": {"point": "server", "epoch": 2,
                         "server_pid": replicated.tablet_servers[victim].proc.pid}}
        done = run_job(spec)
        assert done.returncode == 0, done.stderr[-3000:]
        assert not replicated.tablet_servers[victim].running  # the kill did happen
        after = conn.admin.bucket_replicas(name)[(None, 0)]
        assert after["leader"] != leader and after["leader_epoch"] > 0
        rows = [r for batch in files for r in batch]
        assert sink_data.table_state(conn, name) == sink_data.expected(rows)
        replicated.start_tablet_server(victim)
        wait_fully_in_sync(conn, name)
        assert sink_data.table_state(conn, name) == sink_data.expected(rows)

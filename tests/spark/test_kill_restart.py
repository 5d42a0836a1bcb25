"""SIGKILL a streaming job at random points and restart it from its checkpoint: exactly once.

Each cycle runs tests/spark/stream_job.py in a subprocess (its own JVM) over a directory of
JSON-lines files (one file per micro-batch, a replayable source) and kills it with SIGKILL at a
randomly chosen micro-batch and point: inside a write task after half its writes, after every
task wrote but before the sink's commit, or after the sink's commit but before Spark's commit
log. The next cycle restarts from the same checkpoint. The full-row writer's small batches take
the driver delivery (its kills inside a bucket's write hit the driver), the partial writer
runs the task delivery. After the last kill, a clean run
finishes the stream, and the table must equal the fold of every source row exactly once for
sum, count, string_agg, array_agg and last_value_ignore_nulls.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys

import pytest

from tests.spark import sink_data
from tests.spark.conftest import ROOT

POINTS = ["task", "before_commit", "after_commit"]


def run_job(spec: dict, timeout: float = 900) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    return subprocess.run([sys.executable, "-m", "tests.spark.stream_job", json.dumps(spec)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)


def kill_schedule(seed: int, cycles: int) -> list[dict]:
    """Kill points at random micro-batches, never going back: a kill may hit the replay of the
    batch killed before it, except after a kill past that batch's commit (its replay is
    skipped, so nothing would be killed)."""
    rng = random.Random(seed)
    points = [POINTS[i % 3] for i in range(cycles)]
    rng.shuffle(points)
    schedule, epoch, previous = [], 1, None
    for point in points:
        if previous is not None:
            epoch += 1 if previous == "after_commit" else rng.randrange(2)
        schedule.append({"point": point, "epoch": epoch})
        previous = point
    return schedule


def run_with_kills(cluster, conn, tmp_path, name, seed, cycles, columns=None,
                   rows_per_file=30, keys=10, delivery="auto"):
    batches = cycles + 3
    files = sink_data.write_source_files(str(tmp_path / "source"), batches, rows_per_file, keys,
                                        seed)
    spec = {"url": cluster.url, "table": name, "source": str(tmp_path / "source"),
            "checkpoint": str(tmp_path / "checkpoint"), "schema": sink_data.SCHEMA_DDL,
            "columns": columns,
            "options": {"client.column-lock.ttl": "30", "delivery": delivery}}
    if columns is not None:
        # the source has every column; a partial writer selects its own in the job
        spec["select"] = ["k", *columns]
    for kill in kill_schedule(seed, cycles):
        done = run_job({**spec, "kill": kill})
        assert done.returncode == -9, (kill, done.returncode, done.stderr[-3000:])
    done = run_job(spec)
    assert done.returncode == 0, done.stderr[-3000:]
    wanted = columns or ("v", "c", "s", "a", "l")
    rows = [r for batch in files for r in batch]
    assert sink_data.project(sink_data.table_state(conn, name), wanted) == \
        sink_data.project(sink_data.expected(rows, wanted), wanted)
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_kill_restart_full_row_writer(cluster, conn, tmp_path, table_name):
    """Small batches: `auto` takes the driver delivery, killed inside its bucket writes."""
    sink_data.create_table(conn, table_name)
    result = run_with_kills(cluster, conn, tmp_path, table_name, seed=11, cycles=3)
    owner = result["owners"][0] if result["owners"] else None
    assert owner is None or owner.startswith(f"spark-query:{result['query_id']}/{table_name}/")


@pytest.mark.slow
def test_kill_restart_partial_writer(cluster, conn, tmp_path, table_name):
    """The task delivery, killed inside a bucket's write task."""
    sink_data.create_table(conn, table_name)
    run_with_kills(cluster, conn, tmp_path, table_name, seed=23, cycles=3,
                   columns=["v", "s", "a"], delivery="tasks")


def test_kill_restart_data_source_stream_inside_its_commit(cluster, conn, tmp_path, table_name):
    """writeStream.format("tally") SIGKILLed inside its commit (the driver, its JVM and the
    commit process) after bucket 0 was written and half of a later bucket, twice (the second
    time in the replay of the same micro-batch), then restarted: exactly once."""
    sink_data.create_table(conn, table_name)
    files = sink_data.write_source_files(str(tmp_path / "source"), 3, 30, 10, seed=31)
    spec = {"url": cluster.url, "table": table_name, "source": str(tmp_path / "source"),
            "checkpoint": str(tmp_path / "checkpoint"), "schema": sink_data.SCHEMA_DDL,
            "format": "tally", "options": {"client.column-lock.ttl": "30"}}
    for bucket in (1, 2):
        done = run_job({**spec, "kill": {"point": "task", "epoch": 1, "bucket": bucket}})
        assert done.returncode == -9, (bucket, done.returncode, done.stderr[-3000:])
        state = sink_data.table_state(conn, table_name)
        assert state != sink_data.expected(files[0])                  # part of batch 1 is in
        assert state != sink_data.expected(files[0] + files[1])
    done = run_job(spec)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [r for batch in files for r in batch]
    assert sink_data.table_state(conn, table_name) == sink_data.expected(rows)

"""End to end over real processes: concurrent client processes, then reads of every kind."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pyarrow as pa

from tests.cluster import reference_workload

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_three_client_processes_fold_to_the_reference(cluster, conn, table_name):
    """4 buckets x 2 partition values, 3 writer processes at once: the table equals the fold."""
    conn.admin.create_table(table_name, reference_workload.descriptor(buckets=4))
    seeds, count, rows = [11, 22, 33], 6, 400
    env = {**os.environ, "PYTHONPATH": ROOT}
    procs = [subprocess.Popen([sys.executable, "-m", "tests.cluster.write_process", cluster.url,
                               table_name, str(s), str(count), str(rows)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT, env=env)
             for s in seeds]
    outputs = [p.communicate(timeout=120) for p in procs]
    for p, (out, err) in zip(procs, outputs):
        assert p.returncode == 0, err.decode()[-2000:]
    expected = reference_workload.fold(
        [b for s in seeds for b in reference_workload.batches(s, count, rows)])
    table = conn.table(table_name)
    got = reference_workload.as_state(table.to_arrow())
    # The writers interleave, so last_value `label` may come from any writer's last label for
    # the key; every commutative column must equal the fold exactly.
    per_writer = [reference_workload.fold(reference_workload.batches(s, count, rows))
                  for s in seeds]
    assert got.keys() == expected.keys()
    for key, row in got.items():
        assert row["label"] in {w[key]["label"] for w in per_writer if key in w}
        assert {**row, "label": None} == {**expected[key], "label": None}
    assert sorted(conn.admin.list_partitions(table_name)) == reference_workload.REGIONS

    # Offsets: every writer's flushed offsets are at most the final ends, which list_offsets
    # reports for all 8 buckets, and each bucket's changelog is exactly that long.
    ends = conn.admin.list_offsets(table_name)
    assert len(ends) == 8
    assert conn.admin.list_log_offsets(table_name) == {k: (0, e) for k, e in ends.items()}
    for out, _ in outputs:
        for key, end in json.loads(out).items():
            partition, bucket = key.split(":")
            assert end <= ends[(partition, int(bucket))]
    for (partition, bucket), end in ends.items():
        log = table.changelog(bucket, 0, partition=partition)
        assert log.num_rows == end
        assert log.column("_offset").to_pylist() == list(range(end))

    # Point lookups agree with the scan, across partitions and buckets.
    for (k, region), row in list(got.items())[:25]:
        assert table.lookup({"k": k, "region": region}) == row
    assert table.lookup({"k": 10**9, "region": "eu"}) is None
    assert table.lookup({"k": 1, "region": "nowhere"}) is None


def test_partial_writer_deletes_and_overwrite(conn, table_name):
    conn.admin.create_table(table_name, reference_workload.descriptor(
        buckets=3, partitioned=False, **{"table.delete.behavior": "allow"}))
    table = conn.table(table_name)
    w = table.upsert_writer(target_columns=["k", "region", "total"])
    w.upsert([{"k": i, "region": "eu", "total": i} for i in range(30)])
    w.upsert(pa.table({"k": [1, 2], "region": ["eu", "eu"], "total": [10, 20]}))
    offsets = w.flush()
    assert set(offsets) <= {(None, b) for b in range(3)}
    assert table.lookup({"k": 1, "region": "eu"}) == {
        "k": 1, "region": "eu", "total": 11, "peak": None, "hits": 0, "label": None}
    w.delete([{"k": 1, "region": "eu"}, {"k": 2, "region": "eu"}])
    w.flush()
    assert table.lookup({"k": 1, "region": "eu"}) is None
    assert table.to_arrow().num_rows == 28
    from merge_engine import MergeMode

    over = table.upsert_writer(mode=MergeMode.OVERWRITE)
    over.upsert([{"k": 3, "region": "eu", "total": -5, "peak": 1.5, "hits": 7, "label": "x"}])
    over.flush()
    assert table.lookup({"k": 3, "region": "eu"}) == {
        "k": 3, "region": "eu", "total": -5, "peak": 1.5, "hits": 7, "label": "x"}


def test_admin_catalog_round_trip(conn, table_name):
    admin = conn.admin
    admin.create_database("analytics", ignore_if_exists=True)
    assert "analytics" in admin.list_databases()
    name = "analytics." + table_name.split(".")[1]
    table_id = admin.create_table(name, reference_workload.descriptor(buckets=2))
    assert admin.create_table(name, reference_workload.descriptor(buckets=2),
                              ignore_if_exists=True) == table_id
    info = admin.describe_table(name)
    assert info.table_id == table_id and info.bucket_count == 2
    assert info.descriptor == reference_workload.descriptor(buckets=2)
    assert admin.create_partition(name, {"region": "apac"}) == "apac"
    assert admin.list_partitions(name) == ["apac"]
    assert admin.list_offsets(name) == {("apac", 0): 0, ("apac", 1): 0}
    assert name.split(".")[1] in admin.list_tables("analytics")
    admin.drop_table(name)
    # Re-created under the same name: a new table id, and none of the old data.
    new_id = admin.create_table(name, reference_workload.descriptor(buckets=2))
    assert new_id != table_id
    assert conn.table(name).to_arrow().num_rows == 0
    servers = admin.list_servers()
    assert len([s for s in servers if s["live"]]) == 2


def test_one_connection_shared_by_threads(conn, table_name):
    """Writers and readers on several threads share one connection."""
    import threading

    conn.admin.create_table(table_name, reference_workload.descriptor(buckets=4))
    seeds = [101, 102, 103, 104]
    errors = []

    def work(seed):
        try:
            table = conn.table(table_name)
            writer = table.upsert_writer()
            for batch in reference_workload.batches(seed, 3, 200):
                writer.upsert(batch)
                writer.flush()
                table.lookup({"k": 0, "region": "eu"})
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(s,)) for s in seeds]
    [t.start() for t in threads]
    [t.join(60) for t in threads]
    assert not errors, errors
    got = reference_workload.as_state(conn.table(table_name).to_arrow())
    expected = reference_workload.fold(
        [b for s in seeds for b in reference_workload.batches(s, 3, 200)])
    assert {k: {**r, "label": None} for k, r in got.items()} == \
        {k: {**r, "label": None} for k, r in expected.items()}

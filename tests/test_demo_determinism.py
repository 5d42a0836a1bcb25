"""The demo's check cannot depend on chance (docs/guide.md, "The demo"): file modification
times, Spark's recorded batches, the model's fold order, leftover processes, ZooKeeper chroots.
These run without Spark; test_cli.py runs the whole demo."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from tally.demo.crash import JOB_MARKER, end_job_processes, job_processes
from tally.demo.orders import (MTIME_STEP_S, expected_totals, file_name, orders_of_batches,
                               sink_order, spark_batches, stamp_in_order, write_orders)
from tally.demo.run import demo_zookeeper


def test_files_get_strictly_increasing_modification_times_in_file_order(tmp_path):
    source = tmp_path / "orders"
    batches = write_orders(str(source), 6, 5)
    stamps = [os.stat(source / file_name(i)).st_mtime_ns for i in range(6)]
    assert [b - a for a, b in zip(stamps, stamps[1:])] == [MTIME_STEP_S * 10**9] * 5
    assert stamps[-1] < time.time_ns()
    ids = [o["order_id"] for batch in batches for o in batch]
    assert ids == sorted(ids) and len(set(ids)) == len(ids)
    # the same content every time (seeded), so every run's expected result is the same
    assert write_orders(str(tmp_path / "again"), 6, 5) == batches


def test_write_orders_refuses_a_directory_that_exists(tmp_path):
    with pytest.raises(FileExistsError):
        write_orders(str(tmp_path), 1, 1)


def test_files_written_within_one_millisecond_are_still_ordered(tmp_path):
    for i in range(3):
        (tmp_path / file_name(i)).write_text("{}\n")
        os.utime(tmp_path / file_name(i), ns=(10**18, 10**18))  # all tied
    stamps = stamp_in_order(str(tmp_path), 3, now=2_000_000_000.5)
    assert stamps == [(2_000_000_000 - 30 + 10 * i) * 10**9 for i in range(3)]


def _source_log(checkpoint, name: str, entries: list[tuple[str, int]]) -> None:
    log = checkpoint / "sources" / "0"
    log.mkdir(parents=True, exist_ok=True)
    lines = ["v1"] + [json.dumps({"path": path, "timestamp": 1, "batchId": b})
                      for path, b in entries]
    (log / name).write_text("\n".join(lines) + "\n")


def test_spark_batches_reads_the_source_log_in_batch_order(tmp_path):
    _source_log(tmp_path, "1", [("file:///tmp/a%20b/orders-005.json", 1)])
    _source_log(tmp_path, "0", [("file:///tmp/a%20b/orders-000.json", 0),
                                ("file:///tmp/a%20b/orders-001.json", 0)])
    (tmp_path / "sources" / "0" / ".1.crc").write_bytes(b"\0")
    assert spark_batches(str(tmp_path)) == [(0, ["orders-000.json", "orders-001.json"]),
                                            (1, ["orders-005.json"])]


def test_spark_batches_reads_compacted_logs(tmp_path):
    _source_log(tmp_path, "9.compact", [(f"file:///s/orders-{i:03d}.json", i) for i in range(10)])
    _source_log(tmp_path, "10", [("file:///s/orders-010.json", 10)])
    assert spark_batches(str(tmp_path)) == [(i, [f"orders-{i:03d}.json"]) for i in range(11)]


def _order(order_id, product="kayak", status=None, tags="gift"):
    return {"order_id": order_id, "product": product, "amount": "1.00", "price": "1.00",
            "tags": tags, "status": status}


def test_the_model_folds_a_batch_by_order_id_nulls_first_then_position():
    batch = [_order(3, status="paid"), _order(None, status="placed"), _order(1, status="shipped"),
             _order(None, status="new")]
    assert [o["status"] for o in sink_order(batch)] == ["placed", "new", "shipped", "paid"]
    assert expected_totals([batch])["kayak"]["order_ids"] == [None, None, 1, 3]


def test_the_model_applies_batches_in_the_order_spark_ran_them():
    first, second = [_order(1, status="paid", tags="sale")], [_order(2, tags="gift,sale")]
    files = [first, second]
    in_order = orders_of_batches(files, [(0, [file_name(0)]), (1, [file_name(1)])])
    swapped = orders_of_batches(files, [(0, [file_name(1)]), (1, [file_name(0)])])
    assert expected_totals(in_order)["kayak"]["order_ids"] == [1, 2]
    assert expected_totals(swapped)["kayak"]["order_ids"] == [2, 1]
    assert expected_totals(in_order)["kayak"]["tags"] == "sale,gift"
    assert expected_totals(swapped)["kayak"]["tags"] == "gift,sale"
    assert expected_totals(swapped)["kayak"]["status"] == "paid"


def test_each_zookeeper_demo_gets_a_chroot_of_its_own():
    assert demo_zookeeper("h:2181", "tally-demo-x1") == (
        "h:2181/tally/demo-tally-demo-x1", "h:2181/tally", "demo-tally-demo-x1")
    assert demo_zookeeper("a:1,b:2/apps/t/", "r") == ("a:1,b:2/apps/t/demo-r", "a:1,b:2/apps/t",
                                                       "demo-r")


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="needs /proc")
def test_leftover_processes_of_a_job_are_ended(tmp_path):
    marker = f"{tmp_path}:job"
    env = dict(os.environ, **{JOB_MARKER: marker})
    # a child that forks a grandchild into its own process group, as PySpark's daemon does
    code = ("import os, time, subprocess, sys\n"
            "subprocess.Popen([sys.executable, '-c', 'import os, time; os.setpgid(0, 0); "
            "time.sleep(600)'])\n"
            "time.sleep(600)\n")
    proc = subprocess.Popen([sys.executable, "-c", code], env=env)
    try:
        while len(job_processes(marker)) < 2:
            time.sleep(0.05)
        assert len(end_job_processes(marker)) == 2
        assert job_processes(marker) == []
        assert proc.wait() != 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert end_job_processes(marker) == []

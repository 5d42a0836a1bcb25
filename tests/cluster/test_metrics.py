"""The servers' Prometheus metrics, scraped over real HTTP from a LocalCluster while the tests
write, get refused, undo and truncate: each counter must move by exactly what the test did.

Counters are compared as differences between two scrapes, so the tests do not depend on
each other's order; everything the tests do goes through one cluster of this module.
"""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import pyarrow as pa
import pytest
from prometheus_client.parser import text_string_to_metric_families

from merge_engine import Schema, TableDescriptor
from recovery import recover
from tally import client
from tally.errors import (AuthenticationError, ColumnLockConflict, InvalidInputError,
                          LeaseLostError, NotFoundError, PermissionDeniedError,
                          TableRecreatedError, UnrecoveredLockError)
from tally.server import LocalCluster
from tally.server.clock import SkewedClock
from tally.wire.channel import FlightChannel
from tests.conftest import zookeeper_chroot

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    data_dir = tmp_path_factory.mktemp("metrics")
    with LocalCluster(str(data_dir), tablet_servers=2, authenticate=True, metrics=True,
                      lock_clock_file=str(data_dir / "lock-clock")) as c:
        c.lock_clock = SkewedClock(str(data_dir / "lock-clock"))
        yield c


@pytest.fixture(scope="module")
def admin(cluster):
    with client.connect(cluster.url, token=cluster.tokens["admin"]) as c:
        yield c


_names = iter(range(10**6))


def make_table(conn, buckets=4, **properties):
    name = f"default.m{next(_names)}"
    schema = (Schema.builder().column("k", pa.int64()).agg_column("a", pa.int64(), "sum")
              .agg_column("b", pa.int64(), "sum").primary_key("k").build())
    conn.admin.create_table(name, TableDescriptor(schema, bucket_count=buckets, properties={
        "table.merge-engine": "aggregation", "table.delete.behavior": "allow", **properties}))
    return conn.table(name)


def scrape(url: str) -> dict[tuple[str, frozenset], float]:
    """{(sample name, labels): value} of one endpoint, parsed by prometheus_client."""
    with urllib.request.urlopen(url, timeout=30) as answer:
        assert answer.headers.get_content_type() == "text/plain"
        text = answer.read().decode()
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def total(samples: dict, name: str, **labels) -> float:
    """The sum of the samples named `name` whose labels include `labels`."""
    wanted = set(labels.items())
    return sum(v for (n, ls), v in samples.items() if n == name and wanted <= ls)


class Scrapes:
    """One scrape of every server of the cluster, summed over the tablet servers."""

    def __init__(self, cluster) -> None:
        self.coordinator = scrape(cluster.coordinator.metrics)
        self.tablets = [scrape(h.metrics) for h in cluster.tablet_servers]

    def tablet(self, name: str, **labels) -> float:
        return sum(total(s, name, **labels) for s in self.tablets)

    def coord(self, name: str, **labels) -> float:
        return total(self.coordinator, name, **labels)


def test_every_server_reports_its_own_metrics_url_on_loopback(cluster):
    urls = [cluster.coordinator.metrics] + [h.metrics for h in cluster.tablet_servers]
    assert all(u.startswith("http://127.0.0.1:") and u.endswith("/metrics") for u in urls)
    assert len(set(urls)) == 3  # a port each: nothing is shared between processes


def test_writes_rows_and_bytes_per_table_count_what_was_applied(cluster, admin):
    table, other = make_table(admin), make_table(admin)
    before = Scrapes(cluster)
    requests = 0
    with client.connect(cluster.url, token=cluster.tokens["write"]) as conn:
        writes = conn.table(table.name)
        for start in (0, 100, 250):
            with writes.upsert_writer() as w:
                w.upsert([{"k": k, "a": 1, "b": 2} for k in range(start, start + 100)])
        with writes.upsert_writer() as w:
            w.delete([{"k": k} for k in range(7)])
        with conn.table(other.name).upsert_writer() as w:
            w.upsert([{"k": k, "a": 1, "b": 1} for k in range(5)])
    after = Scrapes(cluster)

    def moved(name, **labels):
        return after.tablet(name, **labels) - before.tablet(name, **labels)

    assert moved("tally_written_rows_total", table=table.name, op="put") == 300
    assert moved("tally_written_rows_total", table=table.name, op="delete") == 7
    assert moved("tally_written_rows_total", table=other.name, op="put") == 5
    requests = moved("tally_writes_total", table=table.name)
    # each writer's flush sends one request per bucket it has rows for: 4 buckets each
    assert 4 <= requests <= 4 * 4
    assert moved("tally_written_bytes_total", table=table.name, op="put") >= 300 * 3 * 8
    # every applied write was timed as its op, and no refusal happened meanwhile
    assert moved("tally_request_seconds_count", call="do_put:put") \
        == moved("tally_writes_total", op="put")
    assert moved("tally_refusals_total") == 0
    # the rows sit in the row buffer and the changelog's memtable of the table's buckets
    assert after.tablet("tally_row_buffer_bytes", table=table.name) > 0
    assert after.tablet("tally_memtable_bytes", table=table.name) > 0
    # the coordinator answered the metadata calls and hosts no tablet
    assert after.coord("tally_request_seconds_count", call="table_info") \
        > before.coord("tally_request_seconds_count", call="table_info")
    assert after.coord("tally_written_rows_total") == 0


def wait_for(condition, what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"not within {timeout} s: {what}"
        time.sleep(0.05)


def test_a_scan_is_timed_until_its_stream_ends(cluster, admin):
    table = make_table(admin, buckets=3)
    with table.upsert_writer() as w:
        w.upsert([{"k": k, "a": 1, "b": 1} for k in range(30)])
    before = Scrapes(cluster).tablet("tally_request_seconds_count", call="do_get:scan")
    assert table.to_arrow().num_rows == 30
    # one scan per bucket, observed once the server has seen the end of each stream (which
    # may come just after the client has its last batch)
    wait_for(lambda: Scrapes(cluster).tablet("tally_request_seconds_count", call="do_get:scan")
             - before == 3, "three scans timed")


def test_refusals_are_counted_by_reason(cluster, admin):
    table = make_table(admin)
    before = Scrapes(cluster)
    with client.connect(cluster.url, token=cluster.tokens["read"]) as reader:
        with pytest.raises(PermissionDeniedError):
            with reader.table(table.name).upsert_writer() as w:
                w.upsert([{"k": 1, "a": 1, "b": 1}])
        with pytest.raises(PermissionDeniedError):
            reader.admin.drop_table(table.name)
    with pytest.raises(AuthenticationError):
        FlightChannel(cluster.url, "not-a-token").action("list_servers")
    after = Scrapes(cluster)
    assert after.tablet("tally_refusals_total", reason="permission_denied", call="do_put:put") \
        - before.tablet("tally_refusals_total", reason="permission_denied", call="do_put:put") \
        == 1
    assert after.coord("tally_refusals_total", reason="permission_denied", call="drop_table") \
        - before.coord("tally_refusals_total", reason="permission_denied", call="drop_table") == 1
    # counted under the Flight method: the call's name is in a body nobody read
    assert after.coord("tally_refusals_total", reason="unauthenticated", call="do_action") \
        - before.coord("tally_refusals_total", reason="unauthenticated", call="do_action") == 1
    assert after.tablet("tally_written_rows_total", table=table.name) == 0  # nothing applied


def test_fencing_refusals_and_lock_holders(cluster, admin):
    table = make_table(admin, buckets=1)
    before = Scrapes(cluster)
    with client.connect(cluster.url, token=cluster.tokens["write"]) as conn:
        lease = conn.locks.acquire(table.name, "owner-a", ["a"], ttl=60)
        held = Scrapes(cluster)
        assert held.coord("tally_lock_holders", table=table.name, state="live") == 1
        assert held.coord("tally_lock_holders", table=table.name, state="expired") == 0
        with pytest.raises(ColumnLockConflict):  # no lease: the locked column is fenced
            with conn.table(table.name).upsert_writer(target_columns=["k", "a"]) as w:
                w.upsert([{"k": 1, "a": 1}])
        stale = conn.locks.acquire(table.name, "owner-b", ["b"], ttl=60)
        conn.locks.release(stale)
        with pytest.raises(LeaseLostError):  # a released lease writes nothing more
            with conn.table(table.name).upsert_writer(target_columns=["k", "b"],
                                                      lease=stale) as w:
                w.upsert([{"k": 1, "b": 1}])
        conn.locks.release(lease)
        # an owner that stops renewing: its expired lock still holds the column until undone
        conn.locks.acquire(table.name, "owner-gone", ["a"], ttl=1)
        cluster.lock_clock.advance(3600)  # every server's lock clock, an hour on
        with pytest.raises(UnrecoveredLockError):
            with conn.table(table.name).upsert_writer(target_columns=["k", "a"]) as w:
                w.upsert([{"k": 1, "a": 1}])
    after = Scrapes(cluster)

    def refused(reason):
        return after.tablet("tally_refusals_total", reason=reason) \
            - before.tablet("tally_refusals_total", reason=reason)

    assert refused("lock_conflict") == 1
    assert refused("lease_lost") == 1
    assert refused("unrecovered_lock") == 1
    assert after.coord("tally_lock_holders", table=table.name, state="live") == 0
    assert after.coord("tally_lock_holders", table=table.name, state="expired") == 1


def test_lock_holders_are_read_from_zookeeper_too(zookeeper, tmp_path):
    # the module's cluster keeps its metadata embedded; the lock nodes' paths are the same
    # in ZooKeeper, under the cluster's chroot
    with LocalCluster(str(tmp_path), tablet_servers=1, zookeeper=zookeeper_chroot(zookeeper),
                      metrics=True) as zk_cluster:
        with client.connect(zk_cluster.url) as conn:
            table = make_table(conn, buckets=1)
            leases = [conn.locks.acquire(table.name, owner, [column], ttl=60)
                      for owner, column in (("x", "a"), ("y", "b"))]
            held = scrape(zk_cluster.coordinator.metrics)
            for lease in leases:
                conn.locks.release(lease)
            released = scrape(zk_cluster.coordinator.metrics)
    assert total(held, "tally_lock_holders", table=table.name, state="live") == 2
    assert total(released, "tally_lock_holders", table=table.name) == 0


def test_an_undo_run_is_counted_by_the_coordinator(cluster, admin):
    table = make_table(admin, buckets=2)
    with client.connect(cluster.url, token=cluster.tokens["write"]) as conn:
        lease = conn.locks.acquire(table.name, "job", ["a"], ttl=60)
        handle = conn.table(table.name)
        with handle.upsert_writer(target_columns=["k", "a"], lease=lease) as w:
            w.upsert([{"k": k, "a": 1} for k in range(20)])
        assert conn.locks.commit(lease, 0, conn.admin.list_offsets(table.name))
        with handle.upsert_writer(target_columns=["k", "a"], lease=lease) as w:
            w.upsert([{"k": k, "a": 5} for k in range(10, 30)])  # 10 updated, 10 new
        before = Scrapes(cluster)
        report = recover(conn, table.name, lease, target_columns=["k", "a"])
        after = Scrapes(cluster)
        conn.locks.release(lease)
    assert report.keys_restored == 10 and report.keys_deleted == 10

    def moved(name, **labels):
        return after.coord(name, table=table.name, **labels) \
            - before.coord(name, table=table.name, **labels)

    assert moved("tally_undo_runs_total") == len(report.buckets) == 2
    assert moved("tally_undo_keys_total", action="restored") == 10
    assert moved("tally_undo_keys_total", action="deleted") == 10
    assert moved("tally_undo_scanned_records_total") == sum(
        b.records_scanned for b in report.buckets)
    assert moved("tally_undo_seconds_count") == 2
    # the undo's own writes reached the tablet servers as OVERWRITE puts and deletes
    assert after.tablet("tally_written_rows_total", table=table.name, op="delete") \
        - before.tablet("tally_written_rows_total", table=table.name, op="delete") == 10


def test_truncations_by_admin_and_by_retention(cluster, admin):
    table = make_table(admin, buckets=1, **{"table.log.retention.offsets": "5"})
    with client.connect(cluster.url, token=cluster.tokens["write"]) as conn:
        for _ in range(4):
            with conn.table(table.name).upsert_writer() as w:
                w.upsert([{"k": k, "a": 1, "b": 1} for k in range(10)])
    before = Scrapes(cluster)
    start = admin.admin.truncate_log(table.name, 0, 10)
    assert start == 10
    for handle in cluster.tablet_servers:
        FlightChannel(handle.address, cluster.cluster_token).action("enforce_retention", {})
    after = Scrapes(cluster)
    (log_start, log_end), = admin.admin.list_log_offsets(table.name).values()
    assert log_start == log_end - 5 > 10

    def moved(name, **labels):
        return after.tablet(name, table=table.name, **labels) \
            - before.tablet(name, table=table.name, **labels)

    assert moved("tally_log_truncations_total", trigger="admin") == 1
    assert moved("tally_log_truncated_records_total", trigger="admin") == 10
    assert moved("tally_log_truncations_total", trigger="retention") == 1
    assert moved("tally_log_truncated_records_total", trigger="retention") == log_start - 10


def test_a_killed_server_replays_what_it_had_not_flushed_when_its_buckets_open(cluster, admin):
    table = make_table(admin, buckets=2)
    with table.upsert_writer() as w:
        w.upsert([{"k": k, "a": 1, "b": 1} for k in range(40)])
    for i in range(len(cluster.tablet_servers)):  # SIGKILL: no closing flush
        cluster.kill_tablet_server(i)
        cluster.start_tablet_server(i)
    # asking for the offsets opens both buckets again
    logged = sum(end for _, end in admin.admin.list_log_offsets(table.name).values())
    assert table.to_arrow().num_rows == 40
    after = Scrapes(cluster)  # counters of the restarted processes, from zero
    assert logged == 40  # one +I per key, none flushed to the rows yet
    assert after.tablet("tally_replayed_records_total", table=table.name) == logged
    assert after.tablet("tally_bucket_opens_total", table=table.name) == 2
    assert after.tablet("tally_bucket_open_seconds_count", table=table.name) == 2


def test_per_bucket_series_only_when_asked(cluster, tmp_path):
    with LocalCluster(str(tmp_path), tablet_servers=1, metrics_per_bucket=True) as small:
        with client.connect(small.url) as conn:
            table = make_table(conn, buckets=3)
            with table.upsert_writer() as w:
                w.upsert([{"k": k, "a": 1, "b": 1} for k in range(60)])
            counts = {}
            for (partition, bucket), (_, end) in conn.admin.list_log_offsets(table.name).items():
                counts[str(bucket)] = end  # one +I record per new key
        samples = scrape(small.tablet_servers[0].metrics)
    per_bucket = {dict(ls)["bucket"]: v for (n, ls), v in samples.items()
                  if n == "tally_written_rows_total" and dict(ls)["table"] == table.name}
    assert per_bucket == counts and sum(per_bucket.values()) == 60
    assert all(dict(ls).get("partition") == "" for (n, ls) in samples
               if n == "tally_row_buffer_bytes")
    # the module's cluster was not asked: its write series name tables only
    plain = scrape(cluster.tablet_servers[0].metrics)
    assert not any("bucket" in dict(ls) for (n, ls) in plain if n.startswith("tally_written"))


def test_one_process_with_both_roles_serves_both_roles_metrics(tmp_path):
    proc = subprocess.Popen([sys.executable, "-m", "tally.server", "--data-dir", str(tmp_path),
                             "--metrics-port", "0"], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, cwd=ROOT)
    try:
        line, deadline = b"", time.monotonic() + 120
        while b"\n" not in line:
            assert proc.poll() is None, "the server exited before it was ready"
            assert time.monotonic() < deadline, "the server was not ready in 120 s"
            if select.select([proc.stdout], [], [], 1)[0]:
                line += os.read(proc.stdout.fileno(), 4096)
        ready = json.loads(line.decode().split(" ", 1)[1])
        with client.connect(ready["address"]) as conn:
            table = make_table(conn, buckets=1)
            with table.upsert_writer() as w:
                w.upsert([{"k": k, "a": 1, "b": 1} for k in range(3)])
            lease = conn.locks.acquire(table.name, "solo", ["a"], ttl=60)
            samples = scrape(ready["metrics"])
            conn.locks.release(lease)
        assert total(samples, "tally_written_rows_total", table=table.name) == 3
        assert total(samples, "tally_lock_holders", table=table.name, state="live") == 1
        assert total(samples, "tally_request_seconds_count", call="lock_acquire") == 1
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0  # the endpoint shuts down with the process
        proc.stdout.close()


def test_serve_refuses_a_taken_metrics_port_in_one_line(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run(
            [sys.executable, "-m", "tally.server", "--data-dir", str(tmp_path),
             "--metrics-port", str(port)], capture_output=True, text=True, timeout=120,
            cwd=ROOT)
    assert done.returncode != 0
    assert done.stderr.strip().splitlines() == [
        f"cannot serve metrics on 127.0.0.1:{port}: Address already in use"]
    done = subprocess.run([sys.executable, "-m", "tally.server", "--data-dir", str(tmp_path),
                           "--metrics-port", "70000"], capture_output=True, text=True,
                          timeout=120, cwd=ROOT)
    assert done.returncode == 2 and "a port is a number from 0 to 65535, not '70000'" \
        in done.stderr


def test_a_malformed_undo_report_is_refused_and_counts_nothing(cluster, admin):
    table = make_table(admin)
    good = {"name": table.name, "keys_restored": 1, "keys_deleted": 0, "records_scanned": 1,
            "seconds": 0.5}
    before = Scrapes(cluster)
    with client.connect(cluster.url, token=cluster.tokens["write"], retry_timeout=5) as conn:
        for bad, error, says in [
                ({"keys_restored": -1}, InvalidInputError, "must be 64-bit integers"),
                ({"keys_deleted": 2**64}, InvalidInputError, "must be 64-bit integers"),
                ({"seconds": "1"}, InvalidInputError, "a finite number"),
                ({"records_scanned": True}, InvalidInputError, "records_scanned"),
                ({"name": "default.no_such_table"}, NotFoundError, "no_such_table"),
                ({"table_id": table.table_id + 1000}, TableRecreatedError, "re-created")]:
            with pytest.raises(error, match=says):
                conn.coordinator_action("undo_report", {**good, **bad})
    with client.connect(cluster.url, token=cluster.tokens["read"]) as reader:
        with pytest.raises(PermissionDeniedError):
            reader.coordinator_action("undo_report", good)
    after = Scrapes(cluster)
    assert after.coord("tally_undo_runs_total") == before.coord("tally_undo_runs_total")
    assert not any(dict(ls).get("table") == "default.no_such_table"
                   for (n, ls) in after.coordinator)

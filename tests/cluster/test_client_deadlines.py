"""A client whose cached routing points at a leader that stopped answering finishes its calls on
the new leader, within its retry budget: writes, lookups, scans, changelog reads, and a scan
whose stream stalls midway.

Real processes: three tablet servers, three copies of a one-bucket table, a short session
timeout. The fault is SIGSTOP of the bucket's leader, a host that holds its connections open
and answers nothing (what a cut-off host looks like to a client), kept paused for the whole
call. Before the per-attempt deadlines a call waited on such a leader for its whole request
timeout (60 s, the retry budget itself) and failed; here every call must succeed with
`retry_timeout` 45 s, which it can only do by going to the new leader. No timing is asserted.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal

import pyarrow as pa
import pytest

import tally
from tally.server import LocalCluster
from tests.cluster.replica_checks import (leader_index, restart_stopped_servers,
                                          wait_fully_in_sync)
from tests.waiting import wait_until

RETRY_BUDGET = 45.0  # below the old per-attempt deadline of 60 s
WIDE_KEYS = 3000
PAYLOAD = 8 * 1024   # bytes per row of the stalled scan: far more than gRPC and TCP buffer


@pytest.fixture(scope="module")
def trio(tmp_path_factory):
    data_dir = tmp_path_factory.mktemp("deadlines")
    with LocalCluster(str(data_dir), tablet_servers=3, replication_factor=3,
                      session_timeout=3.0) as cluster:
        yield cluster


@pytest.fixture
def conn(trio):
    with tally.connect(trio.url, retry_timeout=RETRY_BUDGET, stream_idle_timeout=5.0) as c:
        yield c
    restart_stopped_servers(trio)


def make_table(conn, name: str, payload: bool = False) -> None:
    builder = (tally.Schema.builder().column("k", pa.int64())
               .agg_column("total", pa.int64(), tally.AggFunction.SUM))
    if payload:
        builder = builder.agg_column("note", pa.string(), tally.AggFunction.LAST_VALUE)
    conn.admin.create_table(name, tally.TableDescriptor(
        builder.primary_key("k").build(), bucket_count=1,
        properties={"table.merge-engine": "aggregation"}))


def rows(keys, amount: int) -> pa.Table:
    return pa.table({"k": pa.array(keys, pa.int64()),
                     "total": pa.array([amount] * len(keys), pa.int64())})


def write(conn, name: str, table: pa.Table) -> None:
    with conn.table(name).upsert_writer() as w:
        w.upsert(table)
        w.flush()


def totals(table: pa.Table) -> dict[int, int]:
    return {r["k"]: r["total"] for r in table.select(["k", "total"]).to_pylist()}


@contextlib.contextmanager
def leader_paused(trio, conn, name: str, wait_for_election: bool = False):
    """The bucket's leader SIGSTOPped for the block (resumed, and the bucket back in sync with
    all three copies, after it)."""
    before = wait_fully_in_sync(conn, name, trio)[(None, 0)]
    pid = trio.tablet_servers[leader_index(trio, before["leader"])].proc.pid
    os.kill(pid, signal.SIGSTOP)
    try:
        if wait_for_election:
            wait_until(lambda: conn.admin.bucket_replicas(name)[(None, 0)]["leader"]
                       not in (None, before["leader"]), "another leader elected")
        yield before["leader"]
    finally:
        os.kill(pid, signal.SIGCONT)
    wait_fully_in_sync(conn, name, trio)


def test_a_write_routed_to_a_paused_leader_lands_once_on_the_new_one(trio, conn):
    name = "default.deadline_write"
    make_table(conn, name)
    keys = list(range(50))
    write(conn, name, rows(keys, 1))  # the routing and the channel are cached now
    table = conn.table(name)
    with leader_paused(trio, conn, name):
        with table.upsert_writer() as w:
            w.upsert(rows(keys, 10))
            ends = w.flush()
        assert ends[(None, 0)] > 0
        assert totals(table.to_arrow()) == {k: 11 for k in keys}  # applied exactly once
    assert totals(table.to_arrow()) == {k: 11 for k in keys}


def test_a_lookup_and_a_batch_lookup_reach_the_new_leader(trio, conn):
    name = "default.deadline_lookup"
    make_table(conn, name)
    write(conn, name, rows(list(range(20)), 3))
    table = conn.table(name)
    assert table.lookup({"k": 7})["total"] == 3  # cached
    with leader_paused(trio, conn, name):
        assert table.lookup({"k": 7}) == {"k": 7, "total": 3}
        found = table.lookup_many([{"k": 1}, {"k": 19}, {"k": 99}])
        assert found == [{"k": 1, "total": 3}, {"k": 19, "total": 3}, None]


def test_a_scan_and_a_changelog_read_reach_the_new_leader(trio, conn):
    name = "default.deadline_reads"
    make_table(conn, name)
    keys = list(range(30))
    write(conn, name, rows(keys, 2))
    table = conn.table(name)
    reader = table.changelog_reader("earliest")
    first = reader.poll()
    assert sorted(first.column("k").to_pylist()) == keys
    assert totals(table.to_arrow()) == {k: 2 for k in keys}  # cached
    with leader_paused(trio, conn, name):
        assert totals(table.to_arrow()) == {k: 2 for k in keys}
        write(conn, name, rows(keys[:5], 1))
        later = reader.poll()
        # the update's records only: nothing read twice, nothing skipped
        assert sorted(later.filter(pa.compute.equal(later.column("_change_type"), "+U"))
                      .column("k").to_pylist()) == keys[:5]
        assert totals(later.filter(pa.compute.equal(later.column("_change_type"), "+U"))) \
            == {k: 3 for k in keys[:5]}


def test_a_scan_stalled_midway_resumes_as_of_its_offset_without_duplicates(trio, conn, caplog):
    name = "default.deadline_stalled_scan"
    make_table(conn, name, payload=True)
    keys = list(range(WIDE_KEYS))
    wide = rows(keys, 1).append_column("note", pa.array(["n" * PAYLOAD] * len(keys)))
    write(conn, name, wide)
    table = conn.table(name)
    scan = table.scan(batch_size=50)
    batches = iter(scan)
    handed = [next(batches)]
    offset = scan.offsets[(None, 0)]
    with caplog.at_level(logging.WARNING, logger="tally.client.table_scan"):
        with leader_paused(trio, conn, name, wait_for_election=True):
            # changes after the scan's offset, acknowledged by the new leader: the scan must
            # not show them (updated keys keep their old totals, new keys stay out)
            write(conn, name, rows(keys[:100], 5).append_column(
                "note", pa.array(["changed"] * 100)))
            write(conn, name, rows([WIDE_KEYS + 1, WIDE_KEYS + 2], 7).append_column(
                "note", pa.array(["new"] * 2)))
            handed.extend(batches)
    assert any("resuming on its current leader" in r.getMessage() for r in caplog.records), \
        "the stream never stalled: the test did not exercise a resume"
    got = pa.Table.from_batches(handed)
    read = got.column("k").to_pylist()
    assert len(read) == len(set(read)), "a row was handed out twice"
    assert sorted(read) == keys
    assert set(got.column("total").to_pylist()) == {1}
    assert set(got.column("note").to_pylist()) == {"n" * PAYLOAD}
    assert scan.offsets[(None, 0)] == offset

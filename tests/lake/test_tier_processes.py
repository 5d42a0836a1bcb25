"""Tiering processes killed and paused: the lake neither loses nor repeats a change.

Real processes: a cluster with two tiering processes (`python -m tally.cli tier`). One is
killed with SIGKILL at every step of a round (TALLY_TIER_CRASH_AT), again and again while
writes go on, and started again; one is paused (SIGSTOP) until the other takes its table over,
then resumed. In the end the lake equals the live table, and its Delta history is a chain
(each Tally commit starts at the offsets the one before ended), so no version applied a change
twice, and after a takeover no commit of the older tiering epoch landed.
"""

from __future__ import annotations

import signal

import deltalake
import pyarrow as pa
import pytest

from merge_engine import Schema, TableDescriptor
from tally import client
from tally.lake.delta_table import DeltaLakeTable
from tally.lake.tier_round import CRASH_STEPS
from tally.server import LocalCluster
from tests.waiting import wait_until

CRASH_ENV = "TALLY_TIER_CRASH_AT"


@pytest.fixture(scope="module")
def tiered(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiered")
    with LocalCluster(str(root / "cluster"), tablet_servers=1, datalake_dir=str(root / "lake"),
                      tiering=2, tier_timeout=3.0) as cluster:
        for handle in cluster.tier_processes:  # started by each test as it needs
            handle.stop()
        yield cluster
        for handle in cluster.tier_processes:
            handle.env.pop(CRASH_ENV, None)


def create(conn, name: str, lake: bool = True) -> None:
    schema = (Schema.builder().column("k", pa.int64())
              .agg_column("n", pa.int64(), "sum").agg_column("v", pa.string(), "last_value")
              .primary_key("k").build())
    conn.admin.create_table(name, TableDescriptor(schema, bucket_count=3, properties={
        "table.merge-engine": "aggregation", "table.delete.behavior": "allow",
        "table.datalake.enabled": str(lake).lower(), "table.datalake.freshness": "200ms"}))


def write(conn, name: str, step: int) -> None:
    with conn.table(name).upsert_writer() as w:
        w.upsert([{"k": (step * 7 + j) % 40, "n": 1, "v": f"s{step}"} for j in range(12)])
        if step % 3 == 2:
            w.delete([{"k": (step * 5) % 40}])


def assert_exact(conn, name: str) -> None:
    """Once the lake caught up: it equals the live table, and its history is one chain."""
    ends = conn.admin.list_offsets(name)

    def caught_up():
        snapshot = conn.admin.lake_snapshot(name)
        return snapshot if snapshot is not None and all(
            snapshot.offsets.get(key, 0) >= end for key, end in ends.items()) else None

    snapshot = wait_until(caught_up, f"the lake of {name} catching up", deadline=180)
    lake = deltalake.DeltaTable(snapshot.path).to_pyarrow_table().sort_by("k")
    assert lake.to_pylist() == conn.table(name).to_arrow().sort_by("k").to_pylist()
    table_id = conn.table(name).table_id
    chain = DeltaLakeTable(snapshot.path, table_id, ["k"], []).load().history()
    for before, after in zip(chain, chain[1:]):
        assert after.start == before.offsets, (before, after)
        assert after.tiering_epoch >= before.tiering_epoch, (before, after)


def wait_exited(handle) -> None:
    wait_until(lambda: handle.proc.poll() is not None, f"{handle.name} killing itself",
               deadline=120)
    assert handle.proc.returncode == -signal.SIGKILL


@pytest.mark.parametrize("step", sorted(CRASH_STEPS - {"full.read"}))
def test_a_tier_process_killed_at_each_step_neither_loses_nor_repeats(tiered, step):
    name = f"default.crash_{step.replace('.', '_')}"
    handle = tiered.tier_processes[0]
    with client.connect(tiered.url, retry_timeout=60) as conn:
        create(conn, name)
        for kill in range(3):  # the same step again, each time after more writes
            for i in range(4):
                write(conn, name, kill * 4 + i)
            handle.env[CRASH_ENV] = f"{step}:1"
            handle.start(["--url", tiered.url], tiered.startup_timeout)
            if step.startswith("claim") and kill:
                handle.env.pop(CRASH_ENV)  # a claim happens once per tiering epoch
                handle.stop()
                continue
            wait_exited(handle)
        handle.env.pop(CRASH_ENV, None)
        handle.start(["--url", tiered.url], tiered.startup_timeout)
        write(conn, name, 99)
        assert_exact(conn, name)
        handle.stop()
        conn.admin.drop_table(name, purge_lake=True)


def test_enabling_the_lake_on_a_truncated_table_copies_it_whole_even_across_kills(tiered):
    """The table's changelog no longer starts at 0: the first round copies the table as it
    is (killed once in the middle of that copy), then its changes."""
    name = "default.enabled_late"
    handle = tiered.tier_processes[0]
    with client.connect(tiered.url, retry_timeout=60) as conn:
        create(conn, name, lake=False)
        for i in range(6):
            write(conn, name, i)
        for (partition, bucket), end in conn.admin.list_offsets(name).items():
            conn.admin.truncate_log(name, bucket, end - 2, partition=partition, force=True)
        conn.admin.set_table_options(name, {"table.datalake.enabled": "true",
                                            "table.datalake.freshness": "200ms"})
        handle.env[CRASH_ENV] = "full.read:1"
        handle.start(["--url", tiered.url], tiered.startup_timeout)
        wait_exited(handle)
        handle.env.pop(CRASH_ENV)
        handle.start(["--url", tiered.url], tiered.startup_timeout)
        write(conn, name, 7)
        assert_exact(conn, name)
        status = conn.admin.lake_status(name)
        assert status.error is None
        handle.stop()
        conn.admin.drop_table(name, purge_lake=True)


def test_a_paused_tier_process_is_fenced_by_the_one_that_took_its_table(tiered):
    name = "default.fenced"
    first, second = tiered.tier_processes
    with client.connect(tiered.url, retry_timeout=60) as conn:
        create(conn, name)
        first.start(["--url", tiered.url], tiered.startup_timeout)
        write(conn, name, 0)
        wait_until(lambda: (conn.admin.lake_snapshot(name) or None), "a first lake commit",
                   deadline=120)
        assert conn.admin.lake_status(name).tier_id == "local-tier-0"
        first.proc.send_signal(signal.SIGSTOP)  # a paused process: a GC pause, a partition
        try:
            second.start(["--url", tiered.url], tiered.startup_timeout)
            for i in range(1, 4):
                write(conn, name, i)
            wait_until(lambda: conn.admin.lake_status(name).tier_id == "local-tier-1",
                       "the second process taking the table over", deadline=120)
        finally:
            first.proc.send_signal(signal.SIGCONT)
        for i in range(4, 8):
            write(conn, name, i)
        assert_exact(conn, name)
        status = conn.admin.lake_status(name)
        assert status.tier_id == "local-tier-1" and status.tiering_epoch >= 2
        path = conn.admin.lake_snapshot(name).path
        chain = DeltaLakeTable(path, conn.table(name).table_id, ["k"], []).load().history()
        taken = next(c.version for c in chain if c.tiering_epoch == status.tiering_epoch)
        assert all(c.tiering_epoch == status.tiering_epoch for c in chain
                   if c.version >= taken), "a commit of the fenced epoch landed after the claim"
        first.stop()
        second.stop()
        conn.admin.drop_table(name, purge_lake=True)

"""Operating the lake against a real cluster with a real tiering process and real Delta tables:
the coordinator's lake metrics, `tally lake`, and the retention alert, which must show in
`lake_status`, the metrics and `tally lake` before retention could drop what the lake has not
copied, while retention keeps that changelog (unless the table sets ignore-lake).

One cluster serves the module; the retention test kills the tiering process and starts it again
before it ends, so the tests run in the order written.
"""

from __future__ import annotations

import json

import deltalake
import pyarrow as pa
import pytest

from merge_engine import Schema, TableDescriptor
from tally.server import LocalCluster
from tally.wire.channel import FlightChannel
from tests.cluster.lake_helpers import (lake_rows, lake_table, live_rows, run,
                                        sample, scrape, wait_tiered, write)
from tests.waiting import wait_until
from tests.cluster.cli_fixtures import conn, url  # noqa: F401 (fixtures)

OK, NOT_FOUND, USAGE = 0, 3, 2


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    data_dir = tmp_path_factory.mktemp("lake-ops")
    with LocalCluster(str(data_dir / "cluster"), tablet_servers=1,
                      datalake_dir=str(data_dir / "lake"), tiering=True, metrics=True,
                      tier_timeout=6) as c:
        yield c


def tally_commits(path: str) -> list[dict]:
    """The lake's commits of tiering rounds (whole-table copies included, claims not)."""
    return [h for h in deltalake.DeltaTable(path).history()
            if h.get("tally.kind") in ("round", "full")]


def counted(cluster, name: str, rounds: int) -> dict | None:
    """A scrape of the coordinator once it counts `rounds` rounds of `name`."""
    samples = scrape(cluster.coordinator.metrics)
    return samples if sample(samples, "tally_lake_rounds_total", name) == rounds else None


def test_metrics_follow_the_rounds(cluster, conn):
    name = lake_table(conn)
    for n in range(3):
        write(conn, name, [f"k{i}" for i in range(10)], n + 1)
    status = wait_tiered(conn, name)
    # a round is counted when its report reaches the coordinator, after its lake commit
    rounds = len(tally_commits(status.path))
    samples = wait_until(lambda: counted(cluster, name, rounds),
                         f"the coordinator counting {rounds} rounds of {name}")
    assert rounds >= 1
    assert sample(samples, "tally_lake_merged_rows_total", name) >= 10
    assert sample(samples, "tally_lake_lag_records", name) == 0
    assert sample(samples, "tally_lake_lag_seconds", name) == 0
    assert sample(samples, "tally_lake_retention_alert", name) == 0
    assert sample(samples, "tally_lake_round_errors_total", name) in (None, 0)
    assert lake_rows(status.path) == live_rows(conn, name)

    write(conn, name, ["k0", "new"], 5)
    status = wait_tiered(conn, name)
    more = len(tally_commits(status.path))
    assert more > rounds
    wait_until(lambda: counted(cluster, name, more), "the next round counted")
    assert status.lag_seconds == 0 and status.retention_alert is None and status.holder_live


def test_tally_lake_prints_every_lake_table(cluster, conn, capsys):
    name = lake_table(conn)
    write(conn, name, ["a", "b"])
    status = wait_tiered(conn, name)
    code, out, err = run(capsys, "lake", name)
    assert code == OK and err == "", err
    for column in ("TABLE", "VERSION", "LAG RECORDS", "LAG SECONDS", "STATE", "PATH"):
        assert column in out, (column, out)
    assert name in out and "ok" in out and status.path in out

    code, out, _ = run(capsys, "lake", name, "--format", "json")
    (row,) = [json.loads(line) for line in out.splitlines()]
    assert row["table"] == name and row["lag_records"] == 0 and row["lag_seconds"] == 0
    assert row["version"] == status.snapshot.version and row["state"] == "ok"
    assert row["tiered_by"] == "local-tier-0" and row["path"] == status.path

    code, out, _ = run(capsys, "lake", "--format", "json")
    assert code == OK and name in [json.loads(line)["table"] for line in out.splitlines()]


def test_tally_lake_refuses_a_table_it_cannot_show(conn, capsys):
    code, out, err = run(capsys, "lake", "default.no_such_table")
    assert code == NOT_FOUND and out == ""
    assert err.startswith("tally: ") and err.count("\n") == 1 and "no_such_table" in err
    plain = "default.plain_table"
    schema = Schema.builder().column("k", pa.string()).column("v", pa.int64()) \
        .primary_key("k").build()
    conn.admin.create_table(plain, TableDescriptor(schema, bucket_count=1))
    code, out, err = run(capsys, "lake", plain)
    assert code == USAGE and err.count("\n") == 1 and "table.datalake.enabled" in err, err


def enforce_retention(cluster) -> None:
    for handle in cluster.tablet_servers:
        FlightChannel(handle.address).action("enforce_retention", {})


def test_retention_alert_while_the_lake_lags(cluster, conn, capsys):
    name = lake_table(conn, buckets=1, **{"table.log.retention.offsets": "5"})
    aged = lake_table(conn, buckets=1, **{"table.log.retention.ms": "1500"})
    write(conn, name, [f"k{i}" for i in range(8)])
    write(conn, aged, ["x"])
    held = wait_tiered(conn, name).snapshot.offsets[(None, 0)]
    wait_tiered(conn, aged)
    assert conn.admin.lake_status(name).retention_alert is None

    cluster.kill_tier_process(0)
    try:
        write(conn, name, [f"k{i}" for i in range(20)], 2)
        write(conn, aged, ["y"])
        end = conn.admin.list_offsets(name)[(None, 0)]
        assert end - held > 5
        status = conn.admin.lake_status(name)
        assert status.retention_alert == (
            f"bucket 0: {end - held} records not in the lake, more than "
            "table.log.retention.offsets = 5: retention keeps them, past what the table allows")
        samples = scrape(cluster.coordinator.metrics)
        assert sample(samples, "tally_lake_retention_alert", name) == 1
        assert sample(samples, "tally_lake_lag_records", name) == end - held
        assert sample(samples, "tally_lake_lag_seconds", name) > 0
        code, out, _ = run(capsys, "lake", name)
        assert code == OK and f"ALERT: bucket 0: {end - held} records not in the lake" in out

        # the lake holds retention at its offset: what it has copied goes, the rest stays
        enforce_retention(cluster)
        assert conn.admin.list_log_offsets(name)[(None, 0)] == (held, end)

        # by age: the lake lags for longer than retention.ms
        alert = wait_until(lambda: conn.admin.lake_status(aged).retention_alert,
                           "the retention.ms alert")
        assert "table.log.retention.ms = 1500" in alert and "1 record not in it" in alert

        # a table made while no tiering process runs: never tiered, nobody holds it
        never = lake_table(conn)
        code, out, _ = run(capsys, "lake", never, "--format", "json")
        (row,) = [json.loads(line) for line in out.splitlines()]
        assert row["version"] == "" and row["tiered_by"] == "" and row["lag_records"] == 0
        assert row["state"] == "no tiering process; not tiered yet"
        wait_until(lambda: not conn.admin.lake_status(name).holder_live,
                   "the killed tiering process timing out")
        code, out, _ = run(capsys, "lake", name, "--format", "json")
        assert json.loads(out)["state"].endswith(
            "tiering process local-tier-0 is not heartbeating")

        # ignore-lake: retention is about to drop what the lake has not copied, then does
        conn.admin.set_table_options(name, {"table.log.retention.ignore-lake": "true"})
        assert conn.admin.lake_status(name).retention_alert.endswith(
            "retention drops them at its next pass (table.log.retention.ignore-lake)")
        enforce_retention(cluster)
        assert conn.admin.list_log_offsets(name)[(None, 0)] == (end - 5, end)
        assert conn.admin.lake_status(name).retention_alert == (
            f"bucket 0: retention dropped offsets {held} to {end - 5} before the lake copied "
            "them (table.log.retention.ignore-lake): the next round copies the whole table")
        code, out, _ = run(capsys, "lake")
        assert code == OK and "ALERT: bucket 0: retention dropped offsets" in out
    finally:
        cluster.start_tier_process(0)

    # the tiering process is back: a whole-table copy, and the alerts clear
    status = wait_tiered(conn, name)
    assert status.last_round["full_copy"] and lake_rows(status.path) == live_rows(conn, name)
    wait_tiered(conn, aged)
    wait_until(lambda: conn.admin.lake_status(aged).retention_alert is None,
               "the retention.ms alert clearing")
    samples = scrape(cluster.coordinator.metrics)
    assert sample(samples, "tally_lake_retention_alert", name) == 0
    assert sample(samples, "tally_lake_lag_records", name) == 0
    wait_tiered(conn, never)

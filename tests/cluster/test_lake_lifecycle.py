"""A lake table through its table's life, against a real cluster, tiering process and Delta
tables: columns added to the table reach the lake table (old rows null), a dropped table's lake
table stays readable and is no longer tiered, `purge_lake` / `tally drop --purge-lake` delete
it, and a table re-created under the same name refuses to continue the old lake table, which
the user sees in `lake_status`, `tally lake` and the error metric.
"""

from __future__ import annotations

import json
import os

import deltalake
import pyarrow as pa
import pytest

from merge_engine import Schema, TableDescriptor
from tally.server import LocalCluster
from tests.cluster.lake_helpers import (lake_rows, lake_table, live_rows, run, sample, scrape,
                                        wait_tiered, write)
from tests.waiting import wait_until
from tests.cluster.cli_fixtures import conn, url  # noqa: F401 (fixtures)

OK, NOT_FOUND = 0, 3


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    data_dir = tmp_path_factory.mktemp("lake-lifecycle")
    with LocalCluster(str(data_dir / "cluster"), tablet_servers=1,
                      datalake_dir=str(data_dir / "lake"), tiering=True, metrics=True) as c:
        yield c


def lake_field(path: str, column: str):
    schema = pa.schema(deltalake.DeltaTable(path).schema())
    return schema.field(column) if column in schema.names else None


def test_an_added_column_reaches_the_lake_table(conn):
    name = lake_table(conn)
    write(conn, name, [f"k{i}" for i in range(6)])
    path = wait_tiered(conn, name).path
    conn.admin.add_column(name, "note", pa.string())

    write(conn, name, ["k0", "new"], 2, note="hello")
    status = wait_tiered(conn, name)
    assert lake_field(path, "note").nullable
    rows = {r["k"]: r for r in lake_rows(path)}
    assert rows["k0"] == {"k": "k0", "n": 3, "note": "hello"}
    assert rows["new"] == {"k": "new", "n": 2, "note": "hello"}
    assert all(rows[f"k{i}"]["note"] is None for i in range(1, 6))  # old rows read null
    assert lake_rows(path) == live_rows(conn, name)
    assert status.error is None


def test_an_empty_round_after_an_added_column_widens_the_lake_table(conn):
    """A round whose only change is a new, empty partition commits an empty append: it must
    carry the new column too."""
    name = "default.by_day"
    schema = (Schema.builder().column("day", pa.string()).column("k", pa.string())
              .agg_column("n", pa.int64(), "sum").primary_key("day", "k").partition_key("day")
              .build())
    conn.admin.create_table(name, TableDescriptor(schema, bucket_count=1, properties={
        "table.merge-engine": "aggregation", "table.datalake.enabled": "true",
        "table.datalake.freshness": "1s"}))
    conn.admin.create_partition(name, "mon")
    writer = conn.table(name).upsert_writer()
    writer.upsert(pa.table({"day": ["mon", "mon"], "k": ["a", "b"], "n": [1, 2]}))
    writer.flush()
    path = wait_tiered(conn, name).path
    conn.admin.add_column(name, "note", pa.string())
    conn.admin.create_partition(name, "tue")

    wait_until(lambda: ("tue", 0) in conn.admin.lake_snapshot(name).offsets,
               "the round that takes the empty partition in")
    newest = deltalake.DeltaTable(path).history(1)[0]
    assert newest["operation"] == "WRITE" and newest["tally.kind"] == "round"
    assert lake_field(path, "note") is not None
    assert [r["note"] for r in lake_rows(path)] == [None, None]


def test_a_dropped_table_leaves_its_lake_table_readable_and_untiered(conn, capsys):
    name = lake_table(conn)
    write(conn, name, ["a", "b", "c"])
    status = wait_tiered(conn, name)
    before = lake_rows(status.path)
    conn.admin.drop_table(name)

    assert lake_rows(status.path) == before
    assert name not in [s.name for s in conn.admin.lake_statuses()]
    code, out, err = run(capsys, "lake", name)
    assert code == NOT_FOUND and out == "" and err.count("\n") == 1 and name in err
    # the tiering process has heartbeated since the drop once it tiered a table made after it
    other = lake_table(conn)
    write(conn, other, ["x"])
    wait_tiered(conn, other)
    assert deltalake.DeltaTable(status.path).version() == status.snapshot.version


def test_purge_lake_deletes_the_lake_table(conn, capsys):
    by_admin = lake_table(conn)
    write(conn, by_admin, ["a"])
    path = wait_tiered(conn, by_admin).path
    conn.admin.drop_table(by_admin, purge_lake=True)
    assert not os.path.exists(path)

    by_cli = lake_table(conn)
    write(conn, by_cli, ["a"])
    path = wait_tiered(conn, by_cli).path
    code, out, _ = run(capsys, "drop", by_cli, "--purge-lake")
    assert code == OK and out == f"dropped {by_cli} and its lake table\n"
    assert not os.path.exists(path)


def test_a_recreated_table_does_not_continue_the_old_lake_table(cluster, conn, capsys):
    name = lake_table(conn)
    write(conn, name, ["old"])
    old = wait_tiered(conn, name)
    old_id = conn.table(name).table_id
    conn.admin.drop_table(name)
    lake_table(conn, name=name)
    new_id = conn.table(name).table_id
    write(conn, name, ["new"])

    status = wait_until(lambda: (s := conn.admin.lake_status(name)).error and s,
                        "the re-created table's round failing")
    assert status.snapshot is None
    assert status.error.startswith(
        f"LakeError: the lake table at {old.path} belongs to table id {old_id}, not {new_id}")
    code, out, _ = run(capsys, "lake", name, "--format", "json")
    (row,) = [json.loads(line) for line in out.splitlines()]
    assert code == OK and row["state"].startswith("ERROR: LakeError: the lake table at")
    assert "drop with purge_lake" in row["state"] and row["version"] == ""
    assert sample(scrape(cluster.coordinator.metrics), "tally_lake_round_errors_total",
                  name) >= 1
    assert lake_rows(old.path) == [{"k": "old", "n": 1}]  # untouched
    assert deltalake.DeltaTable(old.path).version() == old.snapshot.version

    # the way out the error names: drop the new table with its lake table, and start again
    code, _, _ = run(capsys, "drop", name, "--purge-lake")
    assert code == OK and not os.path.exists(old.path)
    lake_table(conn, name=name)
    write(conn, name, ["again"])
    status = wait_tiered(conn, name)
    assert status.error is None and lake_rows(status.path) == [{"k": "again", "n": 1}]

"""Rollups on a real cluster: the catalog's records, backfills, the Python writer feeding them.

A backfilled rollup equals the source's rows grouped in plain Python; a backfill that died
midway (the rollup left building with part of its states written) keeps epochs on the source
out and, run again, is exact; a from-now rollup starts empty and follows the writes; drops of
sources are refused while they have rollups; a writer of the source writes every rollup it
feeds in the same flush, all or nothing.
"""

from __future__ import annotations

import datetime

import pyarrow as pa
import pytest

from merge_engine import MergeMode, Schema, TableDescriptor
from merge_engine.table.rollups import RollupSpec
from tally.errors import (AggregateOverflowError, ColumnLockConflict, InvalidInputError,
                          NotFoundError, PermissionDeniedError, RollupBuildingError)
from tests.test_rollup_spec import reference

AGGREGATION = {"table.merge-engine": "aggregation"}
at = datetime.datetime.fromisoformat


def events_schema(clicks_type=pa.int64()):
    return (Schema.builder().column("product", pa.string()).column("region", pa.string())
            .column("ts", pa.timestamp("us")).agg_column("clicks", clicks_type, "sum")
            .agg_column("n", pa.int64(), "count").agg_column("top", pa.int64(), "max")
            .primary_key("product", "region", "ts").build())


EVENTS = [{"product": p, "region": r, "ts": at(f"2026-01-0{d} {h:02d}:{m:02d}"),
           "clicks": c, "n": 1, "top": c % 7}
          for i, (p, r, d, h, m, c) in enumerate(
              [("kayak", "eu", 1, 10, 5, 3), ("kayak", "us", 1, 10, 55, 4),
               ("tent", "eu", 1, 11, 0, 5), ("kayak", "eu", 2, 9, 30, 6),
               ("tent", "us", 2, 9, 31, 7), ("tent", "us", 3, 23, 59, 8),
               ("kayak", "eu", 1, 10, 5, 9)])]  # the last repeats the first's key


@pytest.fixture
def events(conn, table_name):
    conn.admin.create_table(table_name, TableDescriptor(events_schema(), bucket_count=3,
                                                        properties=AGGREGATION))
    return table_name


def write(conn, table, rows, **options):
    with conn.table(table).upsert_writer(**options) as writer:
        writer.upsert(rows)


def rows_of(conn, spec: RollupSpec) -> dict:
    names = [k.name for k in spec.keys]
    return {tuple(r[n] for n in names): {c.name: r[c.name] for c in spec.columns}
            for r in conn.table(spec.name).to_arrow().to_pylist()}


HOURLY = (["product", "date_trunc('hour', ts) AS hour"],
          {"clicks": "sum(clicks)", "n": "count(n)", "top": "max(top)"})


def test_a_backfilled_rollup_equals_the_sources_rows_grouped(conn, events):
    write(conn, events, EVENTS)
    spec = conn.admin.create_rollup(events, f"{events}_hourly", *HOURLY)
    assert spec.state == "ready" and spec.start == "backfill"
    assert rows_of(conn, spec) == reference(spec, EVENTS)
    info = conn.admin.describe_table(events)
    assert [s.name for s in info.rollups] == [spec.name]
    rollup = conn.admin.describe_table(spec.name)
    assert rollup.rollup_of == spec and rollup.bucket_count == 3
    assert conn.admin.list_rollups(events) == [spec]
    # from now on the writer of the source feeds it
    write(conn, events, EVENTS[:2])
    assert rows_of(conn, spec) == reference(spec, EVENTS + EVENTS[:2])


def test_a_backfill_that_died_keeps_epochs_out_and_runs_again_exactly(conn, events):
    write(conn, events, EVENTS)
    name = f"{events}_hourly"
    # what a backfill that died midway leaves: the rollup building, part of its states written
    spec = RollupSpec.define(name, events, *HOURLY)
    answer = conn.coordinator_action("create_rollup", {"source": events, "spec": spec.to_json(),
                                                       "options": {}})
    spec = RollupSpec.from_json(answer["spec"])
    assert spec.state == "building"
    scanned = conn.table(events).to_arrow(columns=["product", "ts", "clicks", "n", "top"])
    with conn.table(name).upsert_writer(mode=MergeMode.MERGE_STATE) as writer:
        writer.upsert(spec.project(scanned.slice(0, 4), ["clicks", "n", "top"]))
    assert conn.admin.describe_table(name).rollup_of.state == "building"
    lease = conn.locks.acquire(events, "job-a", ["clicks"])
    with pytest.raises(RollupBuildingError, match=f"{name} of {events} is being backfilled"):
        conn.locks.begin_epoch(lease, 1, [0, 1, 2])
    with pytest.raises(RollupBuildingError, match="backfilled"):
        conn.table(events).upsert_writer()
    rebuilt = conn.admin.backfill_rollup(name)
    assert rebuilt.state == "ready"
    assert rows_of(conn, rebuilt) == reference(rebuilt, EVENTS)
    conn.locks.begin_epoch(lease, 1, [0, 1, 2])  # epochs begin again
    conn.locks.release(lease)


KILLED_BACKFILL = """
import os, signal, sys
import tally
from merge_engine.table.rollups import RollupSpec

project, calls = RollupSpec.project, []


def project_then_die(self, rows, fed=None):
    calls.append(1)
    if len(calls) == 3:  # two of the three buckets' states are written
        os.kill(os.getpid(), signal.SIGKILL)
    return project(self, rows, fed)


RollupSpec.project = project_then_die
with tally.connect(sys.argv[1]) as conn:
    conn.admin.create_rollup(sys.argv[2], sys.argv[3],
                             ["product", "date_trunc('hour', ts) AS hour"],
                             {"clicks": "sum(clicks)", "n": "count(n)", "top": "max(top)"})
"""


def test_a_killed_backfill_is_run_again_exactly(conn, cluster, events):
    import signal
    import subprocess
    import sys

    write(conn, events, EVENTS)
    name = f"{events}_hourly"
    done = subprocess.run([sys.executable, "-c", KILLED_BACKFILL, cluster.url, events, name],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == -signal.SIGKILL, done.stderr
    spec = conn.admin.describe_table(name).rollup_of
    assert spec.state == "building"
    assert 0 < conn.table(name).to_arrow().num_rows  # part of it was written
    lease = conn.locks.acquire(events, "job-k", ["clicks"])
    with pytest.raises(RollupBuildingError):
        conn.locks.begin_epoch(lease, 1, [0, 1, 2])
    rebuilt = conn.admin.backfill_rollup(name)
    assert rows_of(conn, rebuilt) == reference(rebuilt, EVENTS)
    conn.locks.begin_epoch(lease, 1, [0, 1, 2])
    conn.locks.release(lease)


def test_an_epoch_that_wrote_the_rollup_as_it_was_made_is_not_counted_twice(conn, events):
    from tally.client.rollup_backfill import backfill

    write(conn, events, EVENTS)
    name = f"{events}_hourly"
    spec = RollupSpec.define(name, events, *HOURLY)
    answer = conn.coordinator_action("create_rollup", {"source": events, "spec": spec.to_json(),
                                                       "options": {}})
    spec = RollupSpec.from_json(answer["spec"])
    # an epoch begun in the instant of creation, which read the rollup and fed it (its rows
    # are in the source too, where the scan finds them)
    with conn.table(name).upsert_writer() as writer:
        writer.upsert(spec.project(pa.Table.from_pylist(EVENTS[:2])))
    ready = backfill(conn, spec, int(answer["table_id"]))
    assert ready.state == "ready"
    assert rows_of(conn, ready) == reference(ready, EVENTS)


def test_a_backfill_waits_for_no_epoch_in_flight(conn, events):
    write(conn, events, EVENTS)
    lease = conn.locks.acquire(events, "job-b", ["clicks"])
    conn.locks.begin_epoch(lease, 1, [0, 1, 2])
    with pytest.raises(ColumnLockConflict, match="owner 'job-b' epoch 1"):
        conn.admin.create_rollup(events, f"{events}_h", *HOURLY)
    with pytest.raises(NotFoundError):
        conn.admin.describe_table(f"{events}_h")
    offsets = conn.admin.list_offsets(events)
    assert conn.locks.commit(lease, 1, offsets)
    spec = conn.admin.create_rollup(events, f"{events}_h", *HOURLY)
    assert rows_of(conn, spec) == reference(spec, EVENTS)
    conn.locks.release(lease)


def test_a_from_now_rollup_starts_empty_and_follows_the_writes(conn, events):
    write(conn, events, EVENTS)
    spec = conn.admin.create_rollup(events, f"{events}_regions", ["region"],
                                    {"rows": "count(*)", "clicks": "sum(clicks)"},
                                    start="from-now")
    assert spec.state == "ready" and conn.table(spec.name).to_arrow().num_rows == 0
    later = [dict(e, ts=e["ts"] + datetime.timedelta(days=30)) for e in EVENTS[:3]]
    write(conn, events, later)
    assert rows_of(conn, spec) == reference(spec, later)


def test_a_backfill_that_could_not_be_exact_is_refused_and_nothing_is_made(conn, events):
    with pytest.raises(InvalidInputError, match="'rows' = count\\(\\*\\).*from-now"):
        conn.admin.create_rollup(events, f"{events}_r", ["region"], {"rows": "count(*)"})
    with pytest.raises(InvalidInputError, match="'nosuch'"):
        conn.admin.create_rollup(events, f"{events}_r", ["nosuch"], {"c": "sum(clicks)"},
                                 start="from-now")
    with pytest.raises(NotFoundError):
        conn.admin.describe_table(f"{events}_r")
    assert conn.admin.list_rollups(events) == []


def test_drops_of_sources_and_rollups(conn, events):
    first = conn.admin.create_rollup(events, f"{events}_a", ["product"], {"c": "sum(clicks)"})
    second = conn.admin.create_rollup(events, f"{events}_b", ["region"], {"c": "sum(clicks)"})
    with pytest.raises(InvalidInputError, match=f"{first.name}, {second.name}: drop them first"):
        conn.admin.drop_table(events)
    with pytest.raises(InvalidInputError, match="itself a rollup"):
        conn.admin.create_rollup(first.name, f"{events}_c", ["product"], {"c": "sum(c)"})
    with pytest.raises(InvalidInputError, match="not a rollup"):
        conn.admin.drop_rollup(events)
    conn.admin.drop_rollup(first.name)
    conn.admin.drop_table(second.name)  # a rollup's drop_table drops it as a rollup
    conn.admin.drop_rollup(first.name, ignore_if_not_exists=True)
    with pytest.raises(NotFoundError):
        conn.admin.drop_rollup(first.name)
    assert conn.admin.list_rollups(events) == []
    conn.admin.drop_table(events)


def test_a_database_dropped_with_cascade_takes_its_rollups(conn):
    conn.admin.create_database("rollupdb", ignore_if_exists=True)
    conn.admin.create_table("rollupdb.events", TableDescriptor(events_schema(),
                                                               properties=AGGREGATION))
    conn.admin.create_rollup("rollupdb.events", "rollupdb.by_product", ["product"],
                             {"c": "sum(clicks)"})
    conn.admin.drop_database("rollupdb", cascade=True)
    assert "rollupdb" not in conn.admin.list_databases()


def test_a_writer_feeds_two_rollups_all_or_nothing(conn, table_name):
    conn.admin.create_table(table_name, TableDescriptor(events_schema(pa.int8()), bucket_count=2,
                                                        properties=AGGREGATION))
    hourly = conn.admin.create_rollup(table_name, f"{table_name}_hourly", *HOURLY,
                                      start="from-now")
    regions = conn.admin.create_rollup(table_name, f"{table_name}_regions",
                                       ["region", "date_trunc('day', ts) AS day"],
                                       {"clicks": "sum(clicks)", "rows": "count(*)"},
                                       start="from-now")
    writer = conn.table(table_name).upsert_writer()
    writer.upsert(EVENTS)
    writer.flush()
    # max cannot be taken back: a retraction writes the other columns
    with conn.table(table_name).upsert_writer(
            target_columns=["product", "region", "ts", "clicks", "n"]) as retracting:
        retracting.retract([{k: v for k, v in EVENTS[1].items() if k != "top"}])
    kept = EVENTS[:1] + EVENTS[2:]
    expected = reference(hourly, kept)
    for key, values in reference(hourly, EVENTS).items():
        expected[key]["top"] = values["top"]
    assert rows_of(conn, hourly) == expected
    expected = reference(regions, kept)
    expected[("us", at("2026-01-01"))] = {"clicks": None, "rows": 0}  # every write taken back
    assert rows_of(conn, regions) == expected
    before = {t: conn.table(t).to_arrow().to_pylist()
              for t in (table_name, hourly.name, regions.name)}
    # each new source key stays in int8, the rollups' sums overflow it: nothing anywhere applies
    writer.upsert([dict(EVENTS[2], ts=at("2026-01-01 11:30"), clicks=120),
                   dict(EVENTS[2], ts=at("2026-01-01 11:45"), clicks=100)])
    with pytest.raises(AggregateOverflowError, match="Nothing of this flush was applied"):
        writer.flush()
    assert {t: conn.table(t).to_arrow().to_pylist() for t in before} == before
    with pytest.raises(InvalidInputError, match="delete"):
        writer.delete([{k: EVENTS[0][k] for k in ("product", "region", "ts")}])
    writer.close()
    with pytest.raises(InvalidInputError, match="OVERWRITE"):
        conn.table(table_name).upsert_writer(mode=MergeMode.OVERWRITE)


def test_creating_and_dropping_rollups_needs_the_admin_role(secured_cluster):
    from tally import client

    url, tokens = secured_cluster.url, secured_cluster.tokens
    with client.connect(url, token=tokens["admin"]) as admin:
        admin.admin.create_table("default.secured_events", TableDescriptor(
            events_schema(), properties=AGGREGATION), ignore_if_exists=True)
        with client.connect(url, token=tokens["write"]) as writer:
            with pytest.raises(PermissionDeniedError, match="create_rollup"):
                writer.admin.create_rollup("default.secured_events", "default.secured_h",
                                           ["product"], {"c": "sum(clicks)"})
        spec = admin.admin.create_rollup("default.secured_events", "default.secured_h",
                                         ["product"], {"c": "sum(clicks)"})
        with client.connect(url, token=tokens["read"]) as reader:
            assert reader.admin.list_rollups("default.secured_events") == [spec]
            with pytest.raises(PermissionDeniedError, match="drop_rollup"):
                reader.admin.drop_rollup(spec.name)
        admin.admin.drop_rollup(spec.name)
        admin.admin.drop_table("default.secured_events")

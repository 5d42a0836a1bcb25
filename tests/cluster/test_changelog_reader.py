"""The changelog reader across buckets and partitions, and consumer positions, on a real cluster.

The reader's promise: every record of every bucket (and of partitions created later), in offset
order per bucket, exactly once across restarts from its saved positions; a position retention
has passed is a typed error naming the bucket, never a silent jump. A consumer's registered
position holds retention back until its bound (`table.log.retention.consumer-ms`, judged by the
coordinator's clock, which this module's cluster lets the tests move) or its removal.
"""

from __future__ import annotations

import itertools
import json

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from merge_engine import Schema, TableDescriptor
from tally import client
from tally.errors import InvalidInputError, OffsetOutOfRangeError, PermissionDeniedError
from tally.server import LocalCluster
from tally.server.clock import SkewedClock
from tally.wire.channel import FlightChannel
from tests.conftest import METADATA_STORES, zookeeper_chroot

HOUR_MS = str(3600 * 1000)


@pytest.fixture(scope="module", params=METADATA_STORES)
def cluster(request, tmp_path_factory):
    """One cluster per store whose servers' clock the tests can move (consumer bounds)."""
    zk = None
    if request.param == "zookeeper":
        zk = zookeeper_chroot(request.getfixturevalue("zookeeper"))
    data_dir = tmp_path_factory.mktemp(f"changelog-{request.param}")
    clock_file = str(data_dir / "clock")
    with LocalCluster(str(data_dir / "cluster"), tablet_servers=2, zookeeper=zk,
                      lock_clock_file=clock_file) as c:
        c.clock = SkewedClock(clock_file)
        yield c


_tables = iter(range(10**6))


def make_table(conn, partitioned=True, **props):
    name = f"default.cl{next(_tables)}"
    builder = Schema.builder()
    if partitioned:
        builder = builder.column("p", pa.string())
    builder = builder.column("k", pa.int64()).agg_column("a", pa.int64(), "sum")
    builder = builder.primary_key(*(["p"] if partitioned else []), "k")
    if partitioned:
        builder = builder.partition_key("p")
    conn.admin.create_table(name, TableDescriptor(builder.build(), bucket_count=3, properties={
        "table.merge-engine": "aggregation", **props}))
    return conn.table(name)


def write(table, rows):
    with table.upsert_writer() as writer:
        writer.upsert(rows)


def all_records(table) -> dict:
    """{(partition, bucket): [(offset, change type, key, a), ...]} straight from each bucket."""
    out = {}
    for (partition, bucket), (start, end) in table.connection.admin.list_log_offsets(
            table.name).items():
        records = table.changelog(bucket, start, end, partition=partition).to_pylist()
        out[(partition, bucket)] = [(r["_offset"], r["_change_type"], r["k"], r["a"])
                                    for r in records]
    return out


def delivered(batches) -> dict:
    out = {}
    for batch in batches:
        for r in batch.to_pylist():
            out.setdefault((r["_partition"], r["_bucket"]), []).append(
                (r["_offset"], r["_change_type"], r["k"], r["a"]))
    return out


def enforce_retention(cluster):
    for handle in cluster.tablet_servers:
        FlightChannel(handle.address).action("enforce_retention", {})


@pytest.fixture
def conn(cluster):
    with client.connect(cluster.url, retry_timeout=60) as c:
        yield c


def test_reads_every_bucket_and_later_partitions_in_offset_order(conn):
    table = make_table(conn)
    write(table, [{"p": "x", "k": k, "a": 1} for k in range(20)])
    reader = table.changelog_reader(batch_records=4)
    first = list(reader)
    assert reader.schema.names[:4] == ["_change_type", "_offset", "_partition", "_bucket"]
    write(table, [{"p": "x", "k": k, "a": 2} for k in range(5)]
          + [{"p": "y", "k": k, "a": 1} for k in range(7)])   # a partition created later
    second = list(reader)
    assert all(b.num_rows <= 4 for b in first + second)
    assert delivered(first + second) == all_records(table)
    assert list(reader) == [] and reader.poll().num_rows == 0
    assert {p for p, _b, _o in reader.positions()} == {"x", "y"}


@settings(max_examples=12, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.lists(st.one_of(
    st.tuples(st.just("write"), st.sampled_from(["a", "b", "c"]),
              st.lists(st.integers(0, 9), min_size=1, max_size=8)),
    st.tuples(st.just("read"), st.integers(0, 4)),
    st.tuples(st.just("restart"))), min_size=1, max_size=12))
def test_restarts_from_saved_positions_deliver_every_record_once(cluster, steps):
    """A consumer that processes some batches, saves positions (as JSON) and restarts from
    them, between writes that create partitions, receives each record exactly once, in
    offset order per bucket (the reference: each bucket's log read whole at the end)."""
    with client.connect(cluster.url) as conn:
        table = make_table(conn)
        reader = table.changelog_reader(batch_records=3)
        saved, got = json.dumps(reader.positions()), []
        for step in steps:
            if step[0] == "write":
                write(table, [{"p": step[1], "k": k, "a": 1} for k in step[2]])
            elif step[0] == "read":             # process up to n batches
                for batch in itertools.islice(reader, step[1]):
                    got.append(batch)            # processed, then the position is saved
                    saved = json.dumps(reader.positions())
            else:
                reader = table.changelog_reader(start=json.loads(saved), batch_records=3)
        got += list(table.changelog_reader(start=saved))
        assert delivered(got) == {k: v for k, v in all_records(table).items() if v}


def test_latest_and_positions_in_either_json_form(conn):
    table = make_table(conn, partitioned=False)
    write(table, [{"k": k, "a": 1} for k in range(9)])
    assert table.changelog_reader(start="latest").poll().num_rows == 0
    ends = table.list_offsets()
    by_bucket = {str(b): end - 1 for (_p, b), end in ends.items()}
    tail = table.changelog_reader(start=json.dumps(by_bucket)).poll()
    assert sorted(tail.column("_offset").to_pylist()) == sorted(e - 1 for e in ends.values())
    for bad in ('{"7": 0}', "[[\"x\", 0, 0]]", "[[null, 0, -1]]", "soon", '{"0": "a"}'):
        with pytest.raises(InvalidInputError):
            table.changelog_reader(start=bad)


def test_a_position_below_the_log_start_is_an_error_naming_the_bucket(conn):
    table = make_table(conn)
    write(table, [{"p": "x", "k": k, "a": 1} for k in range(12)])
    reader = table.changelog_reader()
    saved = reader.positions()
    bucket = max(((p, b) for p, b, _ in saved),
                 key=lambda key: table.list_offsets()[key])
    conn.admin.truncate_log(table.name, bucket[1], 2, partition="x")
    with pytest.raises(OffsetOutOfRangeError,
                       match=rf"partition 'x' bucket {bucket[1]} .*outside its log \[2,"):
        table.changelog_reader(start=saved)
    with pytest.raises(OffsetOutOfRangeError,
                       match=rf"bucket {bucket[1]} at offsets \[0, .*retention or truncate_log"):
        list(reader)      # the reader started before the truncation: it refuses, not skips


def test_a_consumer_holds_retention_until_it_moves_its_bound_passes_or_it_is_removed(
        cluster, conn):
    table = make_table(conn, **{"table.log.retention.offsets": "0",
                                "table.log.retention.consumer-ms": HOUR_MS})
    # registered before any write, as servers also run retention on their own
    conn.admin.commit_consumer(table.name, "etl", [])
    write(table, [{"p": "x", "k": k, "a": 1} for k in range(12)])
    reader = table.changelog_reader(consumer="etl")
    reader.commit()                                   # registered at 0 everywhere
    write(table, [{"p": "y", "k": 1, "a": 1}])        # a partition it has no position for
    enforce_retention(cluster)
    assert all(start == 0 for start, _ in conn.admin.list_log_offsets(table.name).values())
    (consumer,) = conn.admin.consumer_positions(table.name)
    assert consumer.consumer == "etl" and consumer.holding
    assert sum(consumer.lag(conn.admin.list_log_offsets(table.name)).values()) == 13

    batches = list(reader)
    reader.commit()
    enforce_retention(cluster)                        # the log may go up to its position
    starts = {key: start for key, (start, _end) in
              conn.admin.list_log_offsets(table.name).items()}
    assert starts == {(p, b): o for p, b, o in reader.positions()} and sum(starts.values()) == 13
    assert sum(b.num_rows for b in batches) == 13

    write(table, [{"p": "x", "k": k, "a": 1} for k in range(12)])
    again = table.changelog_reader(consumer="etl")     # resumes from its registered positions
    assert again.positions() == reader.positions()
    enforce_retention(cluster)                        # the new records are kept
    kept = {key: start for key, (start, _end) in conn.admin.list_log_offsets(table.name).items()}
    assert kept == {(p, b): o for p, b, o in again.positions()}
    (partition, bucket), (start, end) = max(conn.admin.list_log_offsets(table.name).items(),
                                            key=lambda kv: kv[1][1] - kv[1][0])
    with pytest.raises(InvalidInputError, match="changelog consumer still needs"):
        conn.admin.truncate_log(table.name, bucket, end, partition=partition)  # an admin too
    assert conn.admin.list_log_offsets(table.name)[(partition, bucket)] == (start, end)

    cluster.clock.advance(2 * 3600)                   # past the bound: it holds no more
    try:
        assert not conn.admin.consumer_positions(table.name)[0].holding
        enforce_retention(cluster)
        assert all(start == end for start, end in
                   conn.admin.list_log_offsets(table.name).values())
        with pytest.raises(OffsetOutOfRangeError, match="below the log start|outside its log"):
            table.changelog_reader(consumer="etl")
    finally:
        cluster.clock.advance(-2 * 3600)
    assert conn.admin.remove_consumer(table.name, "etl")
    assert conn.admin.consumer_positions(table.name) == []
    assert not conn.admin.remove_consumer(table.name, "etl")


def test_removing_a_consumer_releases_retention_and_a_drop_forgets_consumers(cluster, conn):
    table = make_table(conn, partitioned=False, **{"table.log.retention.offsets": "0"})
    conn.admin.commit_consumer(table.name, "a", [])   # holds every bucket whole
    write(table, [{"k": k, "a": 1} for k in range(6)])
    enforce_retention(cluster)
    assert all(s == 0 for s, _ in conn.admin.list_log_offsets(table.name).values())
    assert conn.admin.remove_consumer(table.name, "a")
    enforce_retention(cluster)
    assert all(s == e for s, e in conn.admin.list_log_offsets(table.name).values())
    table.changelog_reader(consumer="b").commit()
    descriptor = table.meta.descriptor_json
    conn.admin.drop_table(table.name)
    conn.admin.create_table(table.name, descriptor)
    assert conn.admin.consumer_positions(table.name) == []


def test_consumer_commits_are_checked(conn):
    table = make_table(conn, partitioned=False)
    for positions in ([["x", 0, 1]], [[None, 3, 1]], [[None, 0, -1]], [[None, "0", 1]], "0"):
        with pytest.raises(InvalidInputError):
            conn.admin.commit_consumer(table.name, "c", positions)
    with pytest.raises(InvalidInputError, match="empty"):
        conn.admin.commit_consumer(table.name, " ", [])
    with pytest.raises(InvalidInputError, match="no consumer name"):
        table.changelog_reader().commit()
    assert conn.admin.consumer_positions(table.name) == []


def test_roles_for_consumers(tmp_path):
    """A read token may register and list positions; a consumer is removed by its own
    principal or an admin, never by another principal."""
    with LocalCluster(str(tmp_path), tablet_servers=1, authenticate=True) as c:
        with client.connect(c.url, c.tokens["admin"]) as admin:
            table = make_table(admin, partitioned=False)
        with client.connect(c.url, c.tokens["read"]) as reader, \
                client.connect(c.url, c.tokens["write"]) as other:
            reader.admin.commit_consumer(table.name, "r", [[None, 0, 0]])
            assert [p.consumer for p in reader.admin.consumer_positions(table.name)] == ["r"]
            with pytest.raises(PermissionDeniedError):
                other.admin.remove_consumer(table.name, "r")
            assert [p.consumer for p in reader.admin.consumer_positions(table.name)] == ["r"]
            reader.admin.remove_consumer(table.name, "r")
            assert reader.admin.consumer_positions(table.name) == []


def test_row_ttl_through_the_servers(cluster, conn):
    """Rows past `table.kv.row-ttl` (judged by the servers' clock, moved here) are gone from
    lookups and scans before any -D is written; the sweep writes their -D, marked `_expired`,
    which a changelog reader delivers like any record."""
    table = make_table(conn, partitioned=False, **{"table.kv.row-ttl": "1h"})
    write(table, [{"k": k, "a": k} for k in range(6)])
    reader = table.changelog_reader()
    assert reader.poll().num_rows == 6
    cluster.clock.advance(3600 - 60)
    try:
        write(table, [{"k": 0, "a": 10}])            # refreshes key 0 only
        cluster.clock.advance(120)                   # past the TTL for keys 1..5
        assert table.to_arrow().to_pylist() == [{"k": 0, "a": 10}]
        assert table.lookup({"k": 3}) is None
        assert table.lookup({"k": 0}) == {"k": 0, "a": 10}
        for handle in cluster.tablet_servers:
            FlightChannel(handle.address).action("expire_rows", {})
        records = reader.poll().to_pylist()
        expired = sorted(r["k"] for r in records if r["_change_type"] == "-D")
        assert expired == [1, 2, 3, 4, 5]
        assert all(r["_expired"] for r in records if r["_change_type"] == "-D")
        assert not any(r["_expired"] for r in records if r["_change_type"] != "-D")
    finally:
        cluster.clock.advance(-(3600 + 60))
    assert table.to_arrow().to_pylist() == [{"k": 0, "a": 10}]

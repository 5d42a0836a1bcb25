"""spark.read.format("tally").option("snapshot", "lake" | "union"): the lake copy read by the
tasks from the Delta files (no Delta jars), one Spark partition per file (plus one of the
changed rows for a union), equal to tally.lake.read_lake / read_union and so to a live read;
`columns`, `filter` and `batch-size` apply; bad values and `unwritten` are refused by name.

The cluster runs the real `tally tier` process; killing it makes the lake lag behind.
"""

from __future__ import annotations

import datetime
import json
import uuid

import pyarrow as pa
import pytest

import tally
from tally.errors import InvalidOptionError, LakeError
from tally.lake import read_lake, read_union, union_plan
from tests.spark.test_batch_read import arrow_rows, spark_rows
from tests.waiting import wait_until

DAYS = [datetime.date(2024, 5, 1), datetime.date(2024, 5, 2)]
SCHEMA = (tally.Schema.builder().column("day", pa.date32()).column("k", pa.int64())
          .agg_column("total", pa.int64(), tally.AggFunction.SUM)
          .agg_column("top", pa.uint64(), tally.AggFunction.MAX)
          .agg_column("tags", pa.string(), tally.AggFunction.STRING_AGG, distinct=True)
          .primary_key("day", "k").partition_key("day").build())


@pytest.fixture(scope="module")
def lake_cluster(tmp_path_factory):
    root = tmp_path_factory.mktemp("spark-lake")
    with tally.LocalCluster(str(root / "cluster"), tablet_servers=1,
                            datalake_dir=str(root / "lake"), tiering=True) as c:
        yield c


@pytest.fixture(scope="module")
def lake_conn(lake_cluster):
    connection = tally.connect(lake_cluster.url)
    connection.admin.create_database("sparklake", ignore_if_exists=True)
    yield connection
    connection.close()


def rows_of(keys, step: int) -> pa.Table:
    return pa.Table.from_pylist([
        {"day": DAYS[k % 2], "k": k, "total": k + step, "top": 2**64 - 1 - step,
         "tags": f"t{step}"} for k in keys], schema=SCHEMA.to_arrow())


def write(table, upserts=None, deletes=()) -> None:
    writer = table.upsert_writer()
    if upserts is not None:
        writer.upsert(upserts)
    if deletes:
        writer.delete([{"day": DAYS[k % 2], "k": k} for k in deletes])
    writer.flush()
    writer.close()


def tiered(conn, name: str) -> None:
    """Wait until the lake holds every change made so far."""
    ends = conn.admin.list_offsets(name)

    def caught_up():
        snapshot = conn.admin.lake_snapshot(name)
        return snapshot is not None and all(snapshot.offsets.get(key, 0) >= end
                                            for key, end in ends.items())
    wait_until(caught_up, f"the tiering of {name} up to {ends}")


@pytest.fixture(scope="module")
def lagging(lake_cluster, lake_conn):
    """A table whose lake holds its first writes only: the tiering process is killed after
    the first round, then keys are changed, added and deleted."""
    name = f"sparklake.t_{uuid.uuid4().hex[:10]}"
    lake_conn.admin.create_table(name, tally.TableDescriptor(SCHEMA, bucket_count=2, properties={
        "table.merge-engine": "aggregation", "table.delete.behavior": "allow",
        "table.datalake.enabled": "true", "table.datalake.freshness": "1s"}))
    table = lake_conn.table(name)
    write(table, rows_of(range(30), 1))
    write(table, rows_of(range(0, 30, 2), 2))  # more rounds: more files in the lake
    tiered(lake_conn, name)
    lake_cluster.kill_tier_process(0)
    try:
        write(table, rows_of([1, 2, 30, 31, 32], 3), deletes=[4, 5, 31])
        yield name, table
    finally:
        lake_cluster.start_tier_process(0)


def reader(spark, cluster, name, **options):
    r = spark.read.format("tally").option("url", cluster.url).option("table", name)
    for key, value in options.items():
        r = r.option(key, value)
    return r


def test_lake_read_equals_the_python_lake_read(spark, lake_cluster, lake_conn, lagging):
    name, table = lagging
    df = reader(spark, lake_cluster, name, snapshot="lake").load()
    expected = read_lake(lake_conn, name)
    assert dict(df.dtypes)["top"] == "decimal(20,0)"  # uint64 reads as Spark reads it live
    assert spark_rows(df) == arrow_rows(expected)
    assert spark_rows(df) != arrow_rows(table.to_arrow())  # the lake lags
    files = read_lake_files(lake_conn, name)
    assert df.rdd.getNumPartitions() == max(1, files)


def read_lake_files(conn, name: str) -> int:
    import deltalake

    snapshot = conn.admin.lake_snapshot(name)
    return len(deltalake.DeltaTable(snapshot.path, version=snapshot.version).file_uris())


def test_union_read_equals_the_python_union_and_a_live_read(spark, lake_cluster, lake_conn,
                                                             lagging):
    name, table = lagging
    df = reader(spark, lake_cluster, name, snapshot="union").load()
    plan = union_plan(lake_conn, name)
    assert any(plan.snapshot.offsets[key] < end for key, end in plan.offsets.items())
    live = table.to_arrow()
    assert spark_rows(df) == arrow_rows(read_union(lake_conn, name)) == arrow_rows(live)
    assert df.rdd.getNumPartitions() == read_lake_files(lake_conn, name) + 1
    assert spark_rows(reader(spark, lake_cluster, name).load()) == arrow_rows(live)  # live


def test_columns_filter_and_batch_size_apply_to_lake_reads(spark, lake_cluster, lake_conn,
                                                           lagging):
    name, table = lagging
    live = table.to_arrow()
    for snapshot in ("lake", "union"):
        narrow = reader(spark, lake_cluster, name, snapshot=snapshot, columns="k,total",
                        **{"batch-size": "3"}).load()
        assert narrow.columns == ["k", "total"]
        source = live if snapshot == "union" else read_lake(lake_conn, name)
        assert spark_rows(narrow) == arrow_rows(source.select(["k", "total"]))
        day = reader(spark, lake_cluster, name, snapshot=snapshot,
                     filter=json.dumps({"day": DAYS[1].isoformat(), "k": [1, 2, 3, 31]})).load()
        wanted = source.filter(pa.compute.and_(
            pa.compute.equal(source.column("day"), pa.scalar(DAYS[1])),
            pa.compute.is_in(source.column("k"), pa.array([1, 2, 3, 31], pa.int64()))))
        assert spark_rows(day) == arrow_rows(wanted)
    pruned = reader(spark, lake_cluster, name, snapshot="lake",
                    filter=json.dumps({"day": DAYS[1].isoformat()})).load()
    assert pruned.rdd.getNumPartitions() < read_lake_files(lake_conn, name)


def test_bad_snapshot_options_are_refused_by_name(spark, lake_cluster, lake_conn, lagging):
    name, _ = lagging
    with pytest.raises(Exception, match="'snapshot'.*'yesterday'"):
        reader(spark, lake_cluster, name, snapshot="yesterday").load()
    with pytest.raises(Exception, match="'unwritten'"):
        reader(spark, lake_cluster, name, snapshot="union", unwritten="true").load()
    fresh = f"sparklake.t_{uuid.uuid4().hex[:10]}"
    lake_conn.admin.create_table(fresh, tally.TableDescriptor(SCHEMA, bucket_count=1, properties={
        "table.merge-engine": "aggregation", "table.datalake.enabled": "true"}))
    # the tiering process is down (see `lagging`): no round has made a snapshot yet
    with pytest.raises(Exception, match=f"{fresh} has no lake snapshot yet"):
        reader(spark, lake_cluster, fresh, snapshot="lake").load().collect()


def test_options_are_parsed_with_typed_errors():
    from sink.batch_reader import ReadOptions

    base = {"url": "grpc://localhost:1", "table": "db.t"}
    assert ReadOptions.parse(base).snapshot == "live"
    assert ReadOptions.parse({**base, "Snapshot": " Union "}).snapshot == "union"
    with pytest.raises(InvalidOptionError, match="'snapshot': 'delta'"):
        ReadOptions.parse({**base, "snapshot": "delta"})
    with pytest.raises(InvalidOptionError, match="'unwritten'.*lake"):
        ReadOptions.parse({**base, "snapshot": "lake", "unwritten": "true"})
    assert issubclass(LakeError, tally.errors.TallyError)

"""Reads of the lake copy (tally.lake.read_lake / read_union) against a real cluster and real
Delta tables: a lake read is the Delta table in the table's own types, a union read equals a
live read at the offsets it read the changelog to, whatever the lake lags behind (deletes,
non-string partition keys and widened types included), and a property test checks the union
against a plain-Python model over random writes, deletes and tiering rounds.

Rounds run in this process (a TierService of the test's own, `tier_now`), so each test says
exactly where the lake stands; the Spark tests (tests/spark/test_lake_read.py) run the real
`tally tier` process.
"""

from __future__ import annotations

import datetime
import uuid

import deltalake
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import tally
from merge_engine.table.lake_options import lake_schema
from tally.errors import LakeError
from tally.lake import TierService, read_lake, read_union, union_plan

DAYS = [datetime.date(2024, 5, 1), datetime.date(2024, 5, 2)]
SCHEMA = (tally.Schema.builder().column("day", pa.date32()).column("k", pa.int32())
          .agg_column("total", pa.int64(), tally.AggFunction.SUM)
          .agg_column("top", pa.uint64(), tally.AggFunction.MAX)
          .agg_column("small", pa.uint8(), tally.AggFunction.LAST_VALUE)
          .agg_column("name", pa.large_string(), tally.AggFunction.LAST_VALUE)
          .agg_column("seen", pa.timestamp("ms", tz="Europe/Paris"), tally.AggFunction.MAX)
          .primary_key("day", "k").partition_key("day").build())
LAKE_OPTIONS = {"table.merge-engine": "aggregation", "table.delete.behavior": "allow",
                "table.datalake.enabled": "true"}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    root = tmp_path_factory.mktemp("lake-reads")
    with tally.LocalCluster(str(root / "cluster"), tablet_servers=1,
                            datalake_dir=str(root / "lake")) as c:
        yield c


@pytest.fixture(scope="module")
def conn(cluster):
    connection = tally.connect(cluster.url)
    connection.admin.create_database("lakereads", ignore_if_exists=True)
    yield connection
    connection.close()


@pytest.fixture(scope="module")
def tier(conn):
    """A tiering process of the test's own, run a round at a time."""
    return TierService(conn, tier_id=f"test-tier-{uuid.uuid4().hex[:6]}")


def tier_now(tier: TierService, conn, name: str) -> None:
    """Run one tiering round of `name` now; afterwards the lake holds every change made
    before the call (the rounds read up to the stable offsets, which are the end offsets
    here: no epoch is open)."""
    ends = conn.admin.list_offsets(name)
    tier.heartbeat()
    held = [h for h in tier.holdings.values() if h.assignment.name == name]
    assert held, f"the coordinator did not hand {name} to the test's tiering process"
    tier.run_one(held[0])
    snapshot = conn.admin.lake_snapshot(name)
    assert held[0].failures == 0 and snapshot is not None, f"the round of {name} failed"
    assert all(snapshot.offsets.get(key, 0) >= end for key, end in ends.items()), \
        f"the lake of {name} is at {snapshot.offsets}, not at {ends}"


def new_table(conn, schema=SCHEMA, buckets: int = 2, **options) -> tuple[str, object]:
    name = f"lakereads.t_{uuid.uuid4().hex[:10]}"
    conn.admin.create_table(name, tally.TableDescriptor(
        schema, bucket_count=buckets, properties={**LAKE_OPTIONS, **options}))
    return name, conn.table(name)


def rows_of(keys, step: int, schema=SCHEMA) -> pa.Table:
    return pa.Table.from_pylist([
        {"day": DAYS[k % 2], "k": k, "total": k * step, "top": 2**64 - 1 - k - step,
         "small": (k + step) % 256, "name": f"n{k}-{step}",
         "seen": datetime.datetime(2024, 5, 1, 12, tzinfo=datetime.timezone.utc)
         + datetime.timedelta(seconds=k * 7 + step)} for k in keys], schema=schema.to_arrow())


def write(table, upserts: pa.Table | None = None, deletes=()) -> None:
    writer = table.upsert_writer()
    if upserts is not None and upserts.num_rows:
        writer.upsert(upserts)
    if deletes:
        writer.delete([{"day": DAYS[k % 2], "k": k} for k in deletes])
    writer.flush()
    writer.close()


def live(table) -> tuple[pa.Table, dict]:
    scan = table.scan()
    return scan.to_arrow(), dict(scan.offsets)


def test_no_snapshot_yet_is_a_lake_error(conn):
    name, _ = new_table(conn)
    with pytest.raises(LakeError, match=name):
        read_lake(conn, name)
    with pytest.raises(LakeError, match=name):
        read_union(conn, name)


def test_lake_read_is_the_delta_table_in_the_tables_types(conn, tier):
    name, table = new_table(conn)
    write(table, rows_of(range(12), 1))
    write(table, rows_of(range(0, 12, 3), 2), deletes=[1, 4])
    tier_now(tier, conn, name)
    lake = read_lake(conn, name)
    assert lake.schema == SCHEMA.to_arrow()
    assert lake.equals(table.to_arrow())
    snapshot = conn.admin.lake_snapshot(name)
    delta = deltalake.DeltaTable(snapshot.path, version=snapshot.version).to_pyarrow_table()
    assert delta.schema.field("top").type == pa.decimal128(20, 0)  # widened in the lake
    in_lake_types = lake.cast(lake_schema(SCHEMA.to_arrow()))
    assert sorted(map(tuple, (r.values() for r in delta.select(lake.column_names)
                               .to_pylist()))) == \
        sorted(map(tuple, (r.values() for r in in_lake_types.to_pylist())))


def test_union_equals_a_live_read_while_the_lake_lags(conn, tier):
    name, table = new_table(conn)
    write(table, rows_of(range(20), 1))
    tier_now(tier, conn, name)
    lake_before = read_lake(conn, name)
    # past the lake: new keys, changed keys, deleted keys, and a key deleted then re-added
    write(table, rows_of([3, 5, 20, 21, 22], 2), deletes=[0, 7, 8, 21])
    write(table, rows_of([8], 3), deletes=[22])
    plan = union_plan(conn, name)
    rows = plan.rows(conn)
    expected, offsets = live(table)
    assert plan.offsets == offsets
    assert any(plan.snapshot.offsets[key] < end for key, end in plan.offsets.items())
    assert rows.equals(expected)
    assert read_lake(conn, name).equals(lake_before)  # the lake itself did not move
    deleted = plan.changes.filter(plan.changes.column("_tally_deleted"))
    assert sorted(deleted.column("k").to_pylist()) == [0, 7, 21, 22]
    tier_now(tier, conn, name)
    assert read_lake(conn, name).equals(expected)
    assert read_union(conn, name).equals(expected)


def test_every_widened_type_reads_back_as_the_tables_own(conn, tier):
    """Half floats, fixed-size and large binaries, date64, lists and maps of unsigned
    integers: the lake holds them as wider types, the reads give the table's types back."""
    wide = {"half": pa.float16(), "fixed": pa.binary(4), "blob": pa.large_binary(),
            "when": pa.date64(), "ids": pa.list_(pa.uint16()),
            "counts": pa.map_(pa.string(), pa.uint32())}
    builder = tally.Schema.builder().column("k", pa.int64())
    for column, arrow_type in wide.items():
        builder = builder.agg_column(column, arrow_type, tally.AggFunction.LAST_VALUE)
    schema = builder.primary_key("k").build()
    name, table = new_table(conn, schema, buckets=1)

    def batch(keys, step):
        return pa.Table.from_pylist([
            {"k": k, "half": float(k + step) / 2, "fixed": bytes([k, step, 0, 255]),
             "blob": b"x" * (k + step), "when": datetime.datetime(2024, 1, 1 + k),
             "ids": [k, 65535 - step], "counts": [("a", 2**32 - 1 - step)]}
            if k % 3 else {"k": k} for k in keys], schema=schema.to_arrow())

    write(table, batch(range(6), 1))
    tier_now(tier, conn, name)
    assert read_lake(conn, name).equals(table.to_arrow())
    write(table, batch([1, 2, 7], 2))
    assert read_lake(conn, name).schema == schema.to_arrow()
    assert read_union(conn, name).equals(table.to_arrow())


@pytest.mark.parametrize("partition_type", [pa.int16(), pa.string()], ids=str)
def test_union_of_a_partition_created_since_the_lake(conn, tier, partition_type):
    """A bucket missing from the lake's offsets is read from 0, and a key compares equal to
    its lake copy whatever its partition column's type (Fluss duplicated rows when it was
    not a string)."""
    schema = (tally.Schema.builder().column("region", partition_type).column("k", pa.int64())
              .agg_column("n", pa.int64(), tally.AggFunction.SUM)
              .primary_key("region", "k").partition_key("region").build())
    name, table = new_table(conn, schema)

    def batch(region, keys, n):
        return pa.table({"region": pa.array([region] * len(keys), partition_type),
                         "k": pa.array(keys, pa.int64()), "n": pa.array([n] * len(keys))},
                        schema=schema.to_arrow())

    first = 7 if pa.types.is_integer(partition_type) else "7"
    second = 9 if pa.types.is_integer(partition_type) else "9"
    write(table, batch(first, list(range(6)), 1))
    tier_now(tier, conn, name)
    write(table, batch(first, [0, 1, 10], 5))     # keys of the lake, changed
    write(table, batch(second, [0, 1, 2], 3))     # a partition the lake has not seen
    plan = union_plan(conn, name)
    assert not any(p == str(second) for p, _b in plan.snapshot.offsets)
    rows = plan.rows(conn)
    expected, offsets = live(table)
    assert plan.offsets == offsets
    assert rows.schema.field("region").type == partition_type
    assert rows.equals(expected)
    assert rows.num_rows == 10


def test_dropped_partition_leaves_the_union(conn, tier):
    name, table = new_table(conn)
    write(table, rows_of(range(10), 1))
    tier_now(tier, conn, name)
    partition = DAYS[1].isoformat()
    conn.admin.drop_partition(name, partition)
    expected, _ = live(table)
    assert set(expected.column("day").to_pylist()) == {DAYS[0]}
    assert read_union(conn, name).equals(expected)


def test_union_refuses_a_changelog_truncated_past_the_lake(conn, tier):
    name, table = new_table(conn, buckets=1, **{"table.log.retention.ignore-lake": "true"})
    write(table, rows_of(range(4), 1))
    tier_now(tier, conn, name)
    write(table, rows_of(range(4), 2))
    end = conn.admin.list_offsets(name)[(DAYS[0].isoformat(), 0)]
    conn.admin.truncate_log(name, 0, end, partition=DAYS[0].isoformat(), force=True)
    with pytest.raises(LakeError, match=f"{name}.*no longer reaches back"):
        read_union(conn, name)
    assert read_lake(conn, name).num_rows == 4  # the lake itself still reads


# --- the union against a model --------------------------------------------------------------

KEYS = 6
op = st.one_of(
    st.tuples(st.just("upsert"), st.lists(st.integers(0, KEYS - 1), min_size=1, max_size=4),
              st.integers(-3, 3)),
    st.tuples(st.just("delete"), st.lists(st.integers(0, KEYS - 1), min_size=1, max_size=3),
              st.just(0)),
    st.tuples(st.just("tier"), st.just([]), st.just(0)))


@settings(max_examples=6, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(ops=st.lists(op, min_size=1, max_size=10))
def test_union_matches_a_model(conn, tier, ops):
    """Property: after any writes, deletes and tiering rounds, the union read holds exactly
    the rows a dict of key -> running sum says, with the lake wherever the last round left
    it."""
    schema = (tally.Schema.builder().column("k", pa.int64())
              .agg_column("n", pa.int64(), tally.AggFunction.SUM)
              .agg_column("last", pa.int64(), tally.AggFunction.LAST_VALUE)
              .primary_key("k").build())
    name, table = new_table(conn, schema, buckets=2)
    model: dict[int, dict] = {}
    tiered = False
    for kind, keys, value in ops:
        if kind == "tier":
            tier_now(tier, conn, name)
            tiered = True
        elif kind == "upsert":
            write(table, pa.table({"k": pa.array(keys, pa.int64()),
                                   "n": pa.array([value] * len(keys), pa.int64()),
                                   "last": pa.array(range(len(keys)), pa.int64())}))
            for i, k in enumerate(keys):
                row = model.setdefault(k, {"k": k, "n": 0, "last": None})
                row["n"] += value
                row["last"] = i
        else:
            writer = table.upsert_writer()
            writer.delete([{"k": k} for k in keys])
            writer.flush()
            writer.close()
            for k in keys:
                model.pop(k, None)
    if not tiered:
        tier_now(tier, conn, name)  # a union needs a lake snapshot
    expected = [model[k] for k in sorted(model)]
    assert read_union(conn, name).to_pylist() == expected

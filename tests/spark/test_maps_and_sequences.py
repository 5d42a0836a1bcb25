"""Spark writes and reads a table with a merge_map column and a sequence field: MapType in and
out, deletions of map keys through pre-aggregation, and writes applied by sequence, checked
against the reference model."""

from __future__ import annotations

import random
import uuid

import pyarrow as pa
import pytest

import sink
import tally
from merge_engine.testing import ReferenceTable

SCHEMA = (tally.Schema.builder().column("k", pa.int64()).column("ts", pa.int64())
          .agg_column("m", pa.map_(pa.string(), pa.int64()), tally.AggFunction.MERGE_MAP)
          .column("status", pa.string())
          .agg_column("first", pa.string(), tally.AggFunction.FIRST_VALUE)
          .primary_key("k").build())
PROPERTIES = {"table.merge-engine": "aggregation", "table.sequence-field": "ts"}
DDL = "k long, ts long, m map<string, long>, status string, first string"


@pytest.fixture(scope="module")
def registered(spark):
    return sink.register(spark)


def make_rows(seed: int) -> list[dict]:
    """Rows whose sequences differ per key, arriving shuffled; maps that set and delete keys."""
    rng = random.Random(seed)
    rows = []
    for ts in rng.sample(range(1000), 150):
        m = {rng.choice("abcd"): (None if rng.random() < 0.3 else rng.randrange(100))
             for _ in range(rng.randrange(3))}
        rows.append({"k": rng.randrange(8), "ts": ts, "m": m or None,
                     "status": None if rng.random() < 0.3 else f"s{ts}", "first": f"f{ts}"})
    return rows


def test_maps_and_sequences_through_spark(spark, registered, cluster, conn):
    name = f"sparkmap.t_{uuid.uuid4().hex[:10]}"
    conn.admin.create_database("sparkmap", ignore_if_exists=True)
    conn.admin.create_table(name, tally.TableDescriptor(SCHEMA, bucket_count=2,
                                                       properties=PROPERTIES))
    rows = make_rows(seed=3)
    # One partition: the map's order between writes is arrival, which must be the list's.
    df = spark.createDataFrame(rows, DDL).coalesce(1)
    (df.write.format("tally").option("url", cluster.url).option("table", name)
     .option("client.column-lock.owner-id", "maps-seq").option("epoch", "0")
     .mode("append").save())
    model = ReferenceTable(SCHEMA, PROPERTIES)
    model.put(rows)
    expected = {r["k"]: r for r in model.rows()}
    assert {r["k"]: r for r in conn.table(name).to_arrow().to_pylist()} == expected
    read = spark.read.format("tally").option("url", cluster.url).option("table", name).load()
    assert dict(read.dtypes)["m"] == "map<string,bigint>"
    got = {r["k"]: {**r.asDict(), "m": None if r["m"] is None else sorted(r["m"].items())}
           for r in read.collect()}
    assert got == expected

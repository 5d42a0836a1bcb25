"""Spark writes of string user ids into an rbm32 column through a dictionary table.

TallySink (both deliveries) and `format("tally")` map the DataFrame's string column to the
dictionary's ids before the rows feed the bitmap column: each day's bitmap then holds exactly
the ids the dictionary gives that day's users, and its cardinality is the day's count of
distinct users. A replayed epoch changes nothing; a dictionary that cannot feed the column is
refused before anything is written.
"""

from __future__ import annotations

import uuid

import pytest

from sink import TallySink
from tally.client import bitmap_ids
from tally.errors import InvalidInputError, InvalidOptionError, NotFoundError

import pyarrow as pa

import tally

VISITS = [("2026-12-01", "alice"), ("2026-12-01", "bob"), ("2026-12-01", "alice"),
          ("2026-12-02", "carol"), ("2026-12-02", "bob"), ("2026-12-02", None),
          ("2026-12-03", "dave"), ("2026-12-03", "émile"), ("2026-12-03", "")]
DDL = "day string, users string"


def distinct_users(visits) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for day, user in visits:
        out.setdefault(day, set())
        if user is not None:
            out[day].add(user)
    return out


def daily_table(conn) -> str:
    name = f"sparktest.daily_{uuid.uuid4().hex[:10]}"
    schema = (tally.Schema.builder().column("day", pa.string())
              .agg_column("users", pa.binary(), tally.AggFunction.RBM32)
              .primary_key("day").build())
    conn.admin.create_database("sparktest", ignore_if_exists=True)
    conn.admin.create_table(name, tally.TableDescriptor(
        schema, bucket_count=2, properties={"table.merge-engine": "aggregation"}))
    return name


def check_days(conn, table: str, dictionary: str, visits) -> None:
    rows = {r["day"]: r["users"] for r in conn.table(table).to_arrow().to_pylist()}
    wanted = distinct_users(visits)
    assert set(rows) == set(wanted)
    ids = conn.table(dictionary)
    for day, users in wanted.items():
        held = bitmap_ids(rows[day]) if rows[day] is not None else []
        assert len(held) == len(users), (day, held, users)  # count distinct by bitmap
        assert sorted(held) == sorted(ids.lookup_ids(sorted(users)).to_pylist())


@pytest.fixture
def dictionary(conn):
    conn.admin.create_database("sparktest", ignore_if_exists=True)
    name = f"sparktest.users_{uuid.uuid4().hex[:10]}"
    conn.admin.create_dictionary(name, buckets=2)
    return name


@pytest.mark.parametrize("delivery", ["driver", "tasks"])
def test_tally_sink_counts_distinct_string_ids(spark, cluster, conn, dictionary, delivery):
    table = daily_table(conn)
    df = spark.createDataFrame(VISITS, DDL).repartition(2)
    options = {"delivery": delivery, "dictionary.users": dictionary,
               "client.column-lock.owner-id": f"visits-{delivery}", "epoch": "0"}
    TallySink(cluster.url, table, options=options).write(df)
    check_days(conn, table, dictionary, VISITS)
    TallySink(cluster.url, table, options=options).write(df)  # the same epoch again
    check_days(conn, table, dictionary, VISITS)
    more = [("2026-12-01", "carol"), ("2026-12-01", "bob"), ("2026-12-04", "alice")]
    TallySink(cluster.url, table, options={**options, "epoch": "1"}).write(
        spark.createDataFrame(more, DDL))
    check_days(conn, table, dictionary, VISITS + more)
    assert conn.table(dictionary).to_arrow().num_rows == 6  # every user once


def test_the_data_source_counts_distinct_string_ids(spark, cluster, conn, dictionary):
    table = daily_table(conn)
    (spark.createDataFrame(VISITS, DDL).repartition(3).write.format("tally")
     .option("url", cluster.url).option("table", table)
     .option("dictionary.users", dictionary).mode("append").save())
    check_days(conn, table, dictionary, VISITS)


def test_a_dictionary_that_cannot_feed_the_column_is_refused(spark, cluster, conn):
    table = daily_table(conn)
    wide = f"sparktest.wide_{uuid.uuid4().hex[:10]}"
    conn.admin.create_dictionary(wide, id_type="int64")
    df = spark.createDataFrame(VISITS, DDL)
    for option, error, match in [
            ({"dictionary.users": wide}, InvalidOptionError, "cannot hold"),
            ({"dictionary.users": table}, InvalidOptionError, "is not a dictionary table"),
            ({"dictionary.users": "sparktest.nothing"}, NotFoundError, "does not exist"),
            ({"dictionary.day": wide}, InvalidOptionError, "rbm32 and rbm64 columns only"),
            ({"dictionary.nobody": wide}, InvalidOptionError, "not a DataFrame column")]:
        with pytest.raises(error, match=match):
            TallySink(cluster.url, table, options=option).write(df)
    numbers = spark.createDataFrame([("2026-12-01", 1)], "day string, users long")
    narrow = f"sparktest.narrow_{uuid.uuid4().hex[:10]}"
    conn.admin.create_dictionary(narrow)
    with pytest.raises(InvalidInputError, match="maps string keys"):
        TallySink(cluster.url, table, options={"dictionary.users": narrow}).write(numbers)
    assert conn.table(table).to_arrow().num_rows == 0
    assert conn.table(wide).to_arrow().num_rows == 0

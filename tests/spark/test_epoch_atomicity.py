"""Whole-epoch atomicity and one epoch protocol for both sinks.

One bad row (a decimal sum that overflows in one bucket, on the tablet server) fails a write
for good; the writer's process lives, so it rolls every bucket back before it raises: nothing
is applied, the error says so (and keeps its AggregateOverflowError type where Python sees it),
and a corrected re-run ends exact. The same for TallySink batch writes, TallySink micro-batches
and `format("tally")` batch writes, which all run sink.protocol.WriterRun. A data source commit
that dies half-way (no rollback possible) is repaired by a re-run under its owner id.
"""

from __future__ import annotations

import json
import os
import re
from decimal import Decimal

import pytest

import sink
from sink import TallySink
from sink.epoch_errors import EpochFailedError
from tally.errors import AggregateOverflowError
from tests.spark import sink_data

LAST_BUCKET = 3  # workload tables have 4 buckets: the bad key goes to the one written last
ROLLED_BACK = re.compile(r"failed and was rolled back: nothing of it was applied \((\d+) "
                         r"bucket\(s\) written before the failure were undone")


@pytest.fixture(scope="module")
def registered(spark):
    return sink.register(spark)


def good_and_bad(seed: int):
    """A first batch over keys 0..11; a second that adds to every key but one key K of the
    last bucket; the same second batch with one more row, for K, whose value fits but
    overflows K's sum when it meets K's stored value on the tablet server."""
    first = sink_data.decimal_rows(12, "1.00", seed)
    bad_key = sink_data.key_in_bucket(LAST_BUCKET)
    assert bad_key < 12
    second = [row for row in sink_data.decimal_rows(12, "2.00", seed + 1) if row[0] != bad_key]
    bad = second + [(bad_key, Decimal(sink_data.MAX_DECIMAL))]
    return first, second, bad


def assert_rolled_back(text: str, table: str, minimum: int = 1) -> int:
    found = ROLLED_BACK.search(text)
    assert found, text[-3000:]
    assert "AggregateOverflowError" in text and table in text
    assert int(found.group(1)) >= minimum
    return int(found.group(1))


def test_bad_row_in_one_bucket_rolls_back_a_tally_sink_batch_write(
        spark, cluster, conn, table_name):
    sink_data.create_decimal_table(conn, table_name)
    first, second, bad = good_and_bad(seed=1)
    sink_ = TallySink(cluster.url, table_name)
    sink_.write(spark.createDataFrame(first, sink_data.DECIMAL_DDL))
    before = sink_data.decimal_state(conn, table_name)
    assert before == sink_data.decimal_sums(first)
    with pytest.raises(AggregateOverflowError) as raised:
        sink_.write(spark.createDataFrame(bad, sink_data.DECIMAL_DDL))
    error = raised.value
    assert isinstance(error, EpochFailedError) and error.rolled_back
    # the other buckets' tasks wrote before the last bucket ran out of retries: rolled back
    assert error.buckets_undone == assert_rolled_back(str(error), table_name) >= 1
    assert sink_data.decimal_state(conn, table_name) == before
    assert conn.locks.describe(table_name) == []  # nothing left to recover: released
    sink_.write(spark.createDataFrame(second, sink_data.DECIMAL_DDL))  # corrected
    assert sink_data.decimal_state(conn, table_name) == sink_data.decimal_sums(first, second)


def write_json(path, rows) -> None:
    with open(path, "w") as f:
        for k, v in rows:
            f.write(json.dumps({"k": k, "v": "__V__"}).replace('"__V__"', str(v)) + "\n")


def test_bad_row_in_one_bucket_rolls_back_a_micro_batch(spark, cluster, conn, table_name,
                                                         tmp_path):
    sink_data.create_decimal_table(conn, table_name)
    first, second, bad = good_and_bad(seed=3)
    source = tmp_path / "src"
    source.mkdir()
    write_json(source / "part-0000.json", first)
    os.utime(source / "part-0000.json", (1_000_000, 1_000_000))
    write_json(source / "part-0001.json", bad)
    os.utime(source / "part-0001.json", (2_000_000, 2_000_000))
    frame = (spark.readStream.schema(sink_data.DECIMAL_DDL).option("maxFilesPerTrigger", 1)
             .json(str(source)))
    sink_ = TallySink(cluster.url, table_name)
    query = sink_.start(frame, str(tmp_path / "ckpt"), trigger={"availableNow": True})
    with pytest.raises(Exception) as raised:
        query.awaitTermination()
    assert_rolled_back(str(raised.value), table_name)
    assert "micro-batch 1 of query" in str(raised.value)
    assert sink_data.decimal_state(conn, table_name) == sink_data.decimal_sums(first)
    # the source is corrected in place; the restart replays micro-batch 1 from its offsets
    write_json(source / "part-0001.json", second)
    query = sink_.start(frame, str(tmp_path / "ckpt"), trigger={"availableNow": True})
    query.awaitTermination()
    assert query.exception() is None
    assert sink_data.decimal_state(conn, table_name) == sink_data.decimal_sums(first, second)


def data_source_writer(df, cluster, table_name, owner: str, **options):
    writer = (df.write.format("tally").option("url", cluster.url).option("table", table_name)
              .option("client.column-lock.owner-id", owner).mode("append"))
    for key, value in options.items():
        writer = writer.option(key, value)
    return writer


def test_bad_row_in_one_bucket_rolls_back_a_data_source_batch_write(
        spark, registered, cluster, conn, table_name):
    sink_data.create_decimal_table(conn, table_name)
    first, second, bad = good_and_bad(seed=5)
    data_source_writer(spark.createDataFrame(first, sink_data.DECIMAL_DDL), cluster,
                       table_name, "ds-bad-row").save()
    before = sink_data.decimal_state(conn, table_name)
    assert before == sink_data.decimal_sums(first)
    with pytest.raises(Exception) as raised:
        data_source_writer(spark.createDataFrame(bad, sink_data.DECIMAL_DDL), cluster,
                           table_name, "ds-bad-row").save()
    # the commit writes buckets in order: 0, 1 and 2 were written when bucket 3 overflowed
    assert assert_rolled_back(str(raised.value), table_name) == LAST_BUCKET
    assert sink_data.decimal_state(conn, table_name) == before
    assert conn.locks.describe(table_name) == []
    data_source_writer(spark.createDataFrame(second, sink_data.DECIMAL_DDL), cluster,
                       table_name, "ds-bad-row").save()
    assert sink_data.decimal_state(conn, table_name) == sink_data.decimal_sums(first, second)


def test_data_source_commit_that_dies_midway_is_repaired_by_a_rerun_under_its_owner_id(
        spark, registered, cluster, conn, table_name):
    sink_data.create_decimal_table(conn, table_name)
    first, second, _ = good_and_bad(seed=7)
    owner = "ds-nightly-2024-05-17"
    data_source_writer(spark.createDataFrame(first, sink_data.DECIMAL_DDL), cluster,
                       table_name, owner).save()
    df = spark.createDataFrame(second, sink_data.DECIMAL_DDL)
    with pytest.raises(Exception):
        # the commit process exits once bucket 0 is written and bucket 1 half: no rollback
        data_source_writer(df, cluster, table_name, owner, **{
            "fail-hook": "tests.spark.hooks:crash_after_first_bucket",
            "client.column-lock.ttl": "20"}).save()
    partial = sink_data.decimal_state(conn, table_name)
    assert partial != sink_data.decimal_sums(first)               # part of it is applied
    assert partial != sink_data.decimal_sums(first, second)
    assert [lock["owner_id"] for lock in conn.locks.describe(table_name)] == [owner]
    for _ in range(2):  # the re-run undoes the partial epoch, then writes it; once more: idem
        data_source_writer(df, cluster, table_name, owner, epoch="1").save()
        assert sink_data.decimal_state(conn, table_name) == sink_data.decimal_sums(first, second)
        assert conn.locks.describe(table_name) == []

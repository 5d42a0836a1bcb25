"""TallySink's two deliveries of an epoch against a plain-Python model: the driver delivery
(the batch collected to the driver, which writes every bucket) and the task delivery (one
Spark task per bucket, input partitions folded before the shuffle) leave the same table as the
model, including after a driver that died mid-epoch and a restart under the same owner id with
either delivery; `auto` picks the driver for batches Spark estimates small."""

from __future__ import annotations

import os
import uuid

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sink import TallySink
from sink.driver_delivery import DriverDelivery
from sink.epoch_errors import EpochFailedError
from sink.job import SparkJob
from sink.options import SinkOptions
from sink.protocol import WriterRun
from sink.tally_sink import choose_delivery
from tests.spark import sink_data
from tests.spark.hooks import FAIL_BUCKET

SLOW = settings(max_examples=6, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.function_scoped_fixture,
                                       HealthCheck.too_slow])

texts = st.one_of(st.none(), st.sampled_from(["x", "y", "zz", ""]))
rows_strategy = st.lists(st.fixed_dictionaries({
    "k": st.integers(0, 12), "v": st.integers(-50, 100), "c": texts, "s": texts,
    "a": st.one_of(st.none(), st.integers(-5, 5)), "l": texts}), max_size=40)


def fresh_table(conn, buckets: int) -> str:
    name = f"sparktest.d_{uuid.uuid4().hex[:10]}"
    sink_data.create_table(conn, name, buckets=buckets)
    return name


def write(spark, cluster, table, rows, delivery, owner, epoch, **extra):
    df = spark.createDataFrame(rows, sink_data.SCHEMA_DDL) if rows else \
        spark.createDataFrame([], sink_data.SCHEMA_DDL)
    return TallySink(cluster.url, table, options={
        "delivery": delivery, "client.column-lock.owner-id": owner, "epoch": str(epoch)},
        **extra).write(df)


@SLOW
@given(batches=st.lists(rows_strategy, min_size=1, max_size=3), buckets=st.integers(1, 4))
def test_driver_and_task_deliveries_leave_the_models_table(spark, cluster, conn, batches,
                                                            buckets):
    tables = {d: fresh_table(conn, buckets) for d in ("driver", "tasks")}
    for delivery, table in tables.items():
        for epoch, rows in enumerate(batches):
            result = write(spark, cluster, table, rows, delivery, f"model-{delivery}", epoch)
            assert result.rows == len(rows)
    everything = [r for rows in batches for r in rows]
    for table in tables.values():
        assert sink_data.table_state(conn, table) == sink_data.expected(everything)


@SLOW
@given(batches=st.lists(rows_strategy.filter(lambda rows: len(rows) >= 2), min_size=1,
                        max_size=3),
       buckets=st.integers(1, 4), crash=st.data(),
       restart_with=st.sampled_from(["driver", "tasks", "auto"]))
def test_a_driver_that_dies_mid_epoch_is_repaired_by_a_restart(
        spark, cluster, conn, batches, buckets, crash, restart_with):
    """The driver delivery writes part of an epoch (half of every bucket from the chosen one
    that has two keys or more, others in full or not at all), then the driver dies before any rollback; the restart under the same
    owner id, with any delivery, undoes the partial epoch and writes it once (and skips it
    when it had committed: the hook fails only a bucket of two keys or more)."""
    table = fresh_table(conn, buckets)
    owner = f"crash-{uuid.uuid4().hex[:6]}"
    at = crash.draw(st.integers(0, len(batches) - 1), label="crashing epoch")
    os.environ[FAIL_BUCKET] = str(crash.draw(st.integers(0, buckets - 1), label="bucket"))
    for epoch, rows in enumerate(batches[:at]):
        write(spark, cluster, table, rows, "driver", owner, epoch)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(WriterRun, "_roll_back", lambda self, epoch, baseline, label, failure,
                      members=(): SystemExit("died"))
        try:
            write(spark, cluster, table, batches[at], "driver", owner, at,
                  fail_hook="tests.spark.hooks:fail_from_bucket")
            died = False  # no bucket from the chosen one had two keys to fail between
        except SystemExit:
            died = True
    if died:
        assert [lock["owner_id"] for lock in conn.locks.describe(table)] == [owner]
    for epoch in range(at, len(batches)):
        write(spark, cluster, table, batches[epoch], restart_with, owner, epoch)
    everything = [r for rows in batches for r in rows]
    assert sink_data.table_state(conn, table) == sink_data.expected(everything)
    assert conn.locks.describe(table) == []


def test_a_failed_driver_delivery_rolls_back_and_applies_nothing(spark, cluster, conn):
    table = fresh_table(conn, 4)
    first = sink_data.make_rows(60, 12, seed=2)
    write(spark, cluster, table, first, "driver", "rollback", 0)
    os.environ[FAIL_BUCKET] = "2"
    with pytest.raises(EpochFailedError, match="injected failure") as raised:
        write(spark, cluster, table, sink_data.make_rows(60, 12, seed=3), "driver", "rollback",
              1, fail_hook="tests.spark.hooks:fail_from_bucket")
    assert raised.value.rolled_back and raised.value.buckets_undone >= 1
    assert sink_data.table_state(conn, table) == sink_data.expected(first)
    assert conn.locks.describe(table) == []


def test_a_null_key_refuses_the_driver_delivered_batch(spark, cluster, conn):
    table = fresh_table(conn, 4)
    rows = sink_data.make_rows(30, 8, seed=4) + [{"k": None, "v": 1, "c": None, "s": None,
                                                  "a": None, "l": None}]
    with pytest.raises(EpochFailedError, match="primary-key column 'k' is null"):
        write(spark, cluster, table, rows, "driver", "null-key", 0)
    assert conn.table(table).to_arrow().num_rows == 0


def test_auto_takes_the_driver_for_small_batches_only(spark, tmp_path):
    options = SinkOptions.parse({"url": "grpc://127.0.0.1:1", "table": "db.t"})
    sink_data.write_source_files(str(tmp_path), 1, 100, 10, seed=1)
    small = spark.read.schema(sink_data.SCHEMA_DDL).json(str(tmp_path))
    huge = spark.range(10 ** 12).selectExpr("id as k", "id as v")
    unknown = spark.createDataFrame(sink_data.make_rows(10, 10, seed=1), sink_data.SCHEMA_DDL)
    assert isinstance(choose_delivery(small, options), DriverDelivery)
    assert isinstance(choose_delivery(huge, options), SparkJob)
    assert isinstance(choose_delivery(unknown, options), SparkJob)  # no statistics
    tiny = SinkOptions.parse({"url": "grpc://127.0.0.1:1", "table": "db.t",
                              "delivery.driver-max-bytes": "0"})
    assert isinstance(choose_delivery(small, tiny), SparkJob)
    forced = SinkOptions.parse({"url": "grpc://127.0.0.1:1", "table": "db.t",
                                "delivery": "driver"})
    assert isinstance(choose_delivery(huge, forced), DriverDelivery)


def test_a_streaming_query_through_the_driver_delivery_is_exact(spark, cluster, conn, tmp_path):
    table = fresh_table(conn, 4)
    files = sink_data.write_source_files(str(tmp_path / "src"), 3, 40, 12, seed=9)
    frame = (spark.readStream.schema(sink_data.SCHEMA_DDL).option("maxFilesPerTrigger", 1)
             .json(str(tmp_path / "src")))
    sink = TallySink(cluster.url, table, options={"delivery": "driver"})
    query = sink.start(frame, str(tmp_path / "ckpt"), trigger={"availableNow": True})
    query.awaitTermination()
    assert query.exception() is None
    assert sink_data.table_state(conn, table) == \
        sink_data.expected([r for f in files for r in f])

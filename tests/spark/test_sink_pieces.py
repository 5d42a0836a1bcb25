"""The Spark-side pieces of the sink on their own: options, owner ids, type rules, the write
plan's validation, and bucket assignment (checked against the client's bucket function)."""

from __future__ import annotations

import pyarrow as pa
import pytest

from aggfuncs import AggFunction
from merge_engine import MergeMode, Schema, TableDescriptor
from sink.protocol import check_task_coverage
from sink.task import BucketMismatchError, check_bucket
from sink.job import bucketed
from sink.options import SinkOptions
from sink.owner import batch_owner_id, streaming_owner_id
from sink.plan import BUCKET_COLUMN, ORDER_COLUMN, build_plan, descriptor_for
from sink.fold import fold_rows
from sink.types import accepts, widens
from tally.client.admin import TableInfo
from tally.errors import InvalidInputError, InvalidOptionError
from tally.wire.bucket_hash import bucket_ids


def info(buckets=4, partitioned=False):
    builder = Schema.builder().column("k", pa.int64())
    if partitioned:
        builder = builder.column("day", pa.string())
    schema = (builder.agg_column("v", pa.int64(), AggFunction.SUM)
              .agg_column("s", pa.string(), AggFunction.STRING_AGG)
              .agg_column("a", pa.list_(pa.int64()), AggFunction.ARRAY_AGG)
              .agg_column("n", pa.int64(), AggFunction.COUNT)
              .column("l", pa.string())
              .primary_key("k", *(["day"] if partitioned else []))
              .partition_key(*(["day"] if partitioned else [])).build())
    descriptor = TableDescriptor(schema, bucket_count=buckets,
                                 properties={"table.merge-engine": "aggregation"})
    return TableInfo("db.t", 7, descriptor, [], 0.0)


def options(**extra):
    return SinkOptions.parse({"url": "grpc://127.0.0.1:1", "table": "db.t", **extra})


def test_options_parse_case_insensitively_with_defaults():
    o = SinkOptions.parse({"URL": "h:1", "Table": "db.t", "Merge-Mode": "merge-state",
                           "client.column-lock.TTL": "30s", "Columns": "v, s",
                           "fields.Revenue.agg": "sum", "checkpointLocation": "/x"})
    assert (o.url, o.table, o.merge_mode, o.ttl, o.columns) == \
        ("h:1", "db.t", MergeMode.MERGE_STATE, 30.0, ("v", "s"))
    assert o.table_options == (("fields.revenue.agg", "sum"),)
    assert options().ttl == 60.0 and options().merge_mode is MergeMode.AGGREGATE


@pytest.mark.parametrize("bad, message", [
    ({"colums": "v"}, "Unknown Tally sink option"),
    ({"table": "nodatabase"}, "'<database>.<table>'"),
    ({"client.column-lock.ttl": "-1"}, "positive duration"),
    ({"bucket.num": "0"}, "positive integer"),
    ({"merge-mode": "sideways"}, "Unknown merge mode"),
    ({"create-table": "maybe"}, "expected true or false"),
    ({"delivery": "executors"}, "Option 'delivery' must be one of auto, tasks, driver"),
    ({"delivery.driver-max-bytes": "lots"}, "option 'delivery.driver-max-bytes'"),
])
def test_bad_options_are_refused(bad, message):
    with pytest.raises(InvalidOptionError, match=message):
        options(**bad)


def test_delivery_options_parse_and_the_data_source_refuses_them():
    assert (options().delivery, options().driver_max_bytes) == ("auto", 4 << 20)
    parsed = options(**{"Delivery": "Driver", "delivery.driver-max-bytes": "64mb"})
    assert (parsed.delivery, parsed.driver_max_bytes) == ("driver", 64 << 20)
    from sink.datasource import _parse

    with pytest.raises(InvalidOptionError, match=r"\['delivery'\] are TallySink's"):
        _parse({"url": "grpc://127.0.0.1:1", "table": "db.t", "delivery": "tasks"})


def test_the_token_comes_from_a_file_the_environment_or_the_option(tmp_path, monkeypatch):
    monkeypatch.delenv("TALLY_TOKEN", raising=False)
    assert options().token is None
    monkeypatch.setenv("TALLY_TOKEN", "from-env")
    assert options().token == "from-env"
    path = tmp_path / "token"
    path.write_text("from-file\nignored\n")
    assert options(**{"token-file": str(path)}).token == "from-file"
    assert options(token="given").token == "given"
    with pytest.raises(InvalidOptionError, match="not both"):
        options(token="given", **{"token-file": str(path)})
    with pytest.raises(InvalidOptionError, match="token-file"):
        options(**{"token-file": str(tmp_path / "missing")})


def test_owner_id_formats():
    assert streaming_owner_id(None, "q-1", "db.t", ["v", "s"]) == "spark-query:q-1/db.t/v,s"
    assert batch_owner_id(None, "local-17", "db.t", ["v"]) == "spark-app:local-17/db.t/v"
    assert batch_owner_id("mine", "local-17", "db.t", ["v"]) == "mine"


def test_type_rules():
    assert widens(pa.int32(), pa.int64()) and not widens(pa.int64(), pa.int32())
    assert widens(pa.decimal128(10, 2), pa.decimal128(18, 4))
    assert not widens(pa.string(), pa.int64()) and not widens(pa.float64(), pa.int64())
    schema = info().descriptor.schema
    assert accepts(schema.column("a"), False, pa.int64(), MergeMode.AGGREGATE, True)
    assert accepts(schema.column("n"), False, pa.string(), MergeMode.AGGREGATE, True)
    assert not accepts(schema.column("n"), False, pa.string(), MergeMode.MERGE_STATE, True)


def test_plan_maps_columns_and_refuses_bad_input(spark):
    df = spark.createDataFrame([], "K int, v long, s string, seq long")
    plan = build_plan(info(), options(**{"sequence-column": "seq"}), df.schema)
    assert plan.table_columns == ("k", "v", "s") and plan.target_columns == ("k", "v", "s")
    assert plan.lock_columns == ("v", "s") and plan.sequence_column == "seq"
    cases = [
        ("v long, s string", {}, "lacks the primary-key column"),
        ("k long, v string", {}, "cannot feed column 'v'"),
        ("k long, v long, extra int", {}, "'extra' is not a column"),
        ("k long, v long", {"columns": "v,s"}, "lacks column"),
        ("k long, v long, s string", {"columns": "v"}, "not among the target columns"),
        ("k long", {}, "only key columns"),
    ]
    for ddl, extra, message in cases:
        with pytest.raises((InvalidInputError, InvalidOptionError), match=message):
            build_plan(info(), options(**extra), spark.createDataFrame([], ddl).schema)


def test_create_table_descriptor_from_lower_cased_options(spark):
    df = spark.createDataFrame([], "Id long, Revenue long, Tags string")
    o = SinkOptions.parse({"url": "h:1", "table": "db.t", "create-table": "true",
                           "primary-key": "id", "fields.revenue.agg": "sum",
                           "fields.tags.agg": "listagg", "fields.tags.listagg.delimiter": ";",
                           "bucket.num": "3"})
    descriptor = descriptor_for(o, df.schema)
    assert descriptor.bucket_count == 3 and descriptor.schema.primary_key == ("Id",)
    assert descriptor.schema.column("Revenue").agg is AggFunction.SUM
    assert descriptor.schema.column("Tags").params == {"delimiter": ";"}


@pytest.mark.parametrize("partitioned", [False, True])
def test_one_task_per_bucket_with_the_clients_bucket_function(spark, partitioned):
    table = info(buckets=5, partitioned=partitioned)
    ddl = "k long, day string, v long" if partitioned else "k long, v long"
    rows = [(i, f"d{i % 2}", i) if partitioned else (i, i) for i in range(200)]
    df = spark.createDataFrame(rows, ddl).repartition(3)
    plan = build_plan(table, options(), df.schema)

    def tasks(batches):
        from pyspark import TaskContext

        t = pa.Table.from_batches(list(batches))
        yield pa.RecordBatch.from_pylist([{
            "p": TaskContext.get().partitionId(),
            "n": sum(t.column("rows").to_pylist()) if t.num_columns else 0,
            "b": sorted(set(t.column(BUCKET_COLUMN).to_pylist())) if t.num_columns else []}],
            schema=pa.schema([("p", pa.int64()), ("n", pa.int64()), ("b", pa.list_(pa.int64()))]))

    out = bucketed(df, plan, "test").mapInArrow(tasks, "p long, n long, b array<long>").collect()
    assert sorted(r["p"] for r in out) == list(range(5))          # every bucket gets a task
    assert all(r["b"] in ([], [r["p"]]) for r in out)            # and only its own rows
    keys = pa.table({"k": pa.array([r[0] for r in rows], pa.int64())})
    expected = bucket_ids(keys, ["k"], 5)
    counts = {b: int((expected == b).sum()) for b in range(5)}
    assert {r["p"]: r["n"] for r in out} == counts


def test_bucket_checks():
    check_bucket(pa.array([2, 2], pa.int32()), 2, "db.t")
    with pytest.raises(BucketMismatchError, match="one task must write exactly one bucket"):
        check_bucket(pa.array([2, 3], pa.int32()), 2, "db.t")
    with pytest.raises(BucketMismatchError, match="expected one task for each"):
        check_task_coverage([0, 1, 1], 3, "db.t")


def visible(table):
    """Rows without the engine's hidden columns (_change_type, _contributions)."""
    return [{k: v for k, v in r.items() if not k.startswith("_")} for r in table.to_pylist()]


def test_fold_is_deterministic_and_follows_the_sequence_column(spark):
    df = spark.createDataFrame([], "k long, s string, seq long")
    plan = build_plan(info(), options(**{"sequence-column": "seq"}), df.schema)
    data = pa.table({"k": [1, 1, 1, 2], "s": ["c", "a", "b", "x"], "__tally_sequence": [3, 1, 2, 1],
                     BUCKET_COLUMN: pa.array([0] * 4, pa.int32()),
                     ORDER_COLUMN: pa.array([0, 1, 2, 3], pa.int64())})
    folded, mode = fold_rows(data, plan)
    assert mode is MergeMode.MERGE_STATE
    assert sorted(visible(folded), key=lambda r: r["k"]) == [
        {"k": 1, "s": "a,b,c"}, {"k": 2, "s": "x"}]
    plan = build_plan(info(), options(), spark.createDataFrame([], "k long, s string").schema)
    data = data.drop_columns(["__tally_sequence"])
    shuffled = data.take([3, 2, 0, 1])  # arrival order does not matter: position does
    assert visible(fold_rows(shuffled, plan)[0].sort_by("k")) == \
        [{"k": 1, "s": "c,a,b"}, {"k": 2, "s": "x"}]


def test_speculation_is_refused(spark):
    from sink.tally_sink import check_speculation, refuse_speculation

    check_speculation(spark)  # the test session runs without speculation
    with pytest.raises(InvalidOptionError, match="spark.speculation=true"):
        refuse_speculation("true")


def test_a_failed_epochs_error_keeps_the_type_of_its_cause():
    import pickle

    from sink.epoch_errors import EpochFailedError, epoch_failed
    from tally.errors import AggregateOverflowError, LeaseLostError

    task_error = RuntimeError(  # what Spark hands back from a task: its Python traceback
        "An exception was thrown from the Python worker:\nTraceback (most recent call last):\n"
        '  File "sink/task.py", line 1, in __call__\n'
        "tally.errors.AggregateOverflowError: sum column 'v' overflows decimal128(18, 2)\n")
    error = epoch_failed(task_error, label="micro-batch 3 of query q", table="db.t",
                         owner_id="o", epoch=3, rolled_back=True, buckets_undone=2)
    assert isinstance(error, AggregateOverflowError) and isinstance(error, EpochFailedError)
    assert str(error).startswith("micro-batch 3 of query q into db.t failed and was rolled "
                                 "back: nothing of it was applied (2 bucket(s)")
    assert str(error).endswith("Cause: AggregateOverflowError: sum column 'v' overflows "
                               "decimal128(18, 2)")
    copy = pickle.loads(pickle.dumps(error))
    assert type(copy) is type(error) and copy.buckets_undone == 2 and copy.args == error.args
    untyped = epoch_failed(
        RuntimeError("Traceback:\ntests.spark.hooks.InjectedTaskFailure: injected\n"),
        label="batch write (epoch 0) by o", table="db.t", owner_id="o", epoch=0,
        rolled_back=False, undo_error=LeaseLostError("lease lost"))
    assert type(untyped) is EpochFailedError and not untyped.rolled_back
    assert "part of it may be applied" in str(untyped)
    assert "Restart the writer with the same owner id 'o'" in str(untyped)
    assert str(untyped).endswith("Cause: InjectedTaskFailure: injected")

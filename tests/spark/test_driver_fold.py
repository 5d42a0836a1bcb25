"""The driver delivery's per-epoch shortcuts against their definitions: one fold of the whole
batch split by bucket (a small batch) gives what folding each bucket's rows alone gives (and
what a plain-Python model of the keys' buckets and concatenations says); the write reads the
micro-batch's DataFrame as it is when its columns already carry their table names, and
selects otherwise."""

from __future__ import annotations

import contextlib

import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from sink import driver_delivery
from sink.driver_delivery import fold_by_bucket
from sink.fold import fold_rows
from sink.job import BucketAssigner, rows_by_bucket, table_named
from sink.plan import HIDDEN_SEQUENCE_COLUMN, build_plan
from tally.wire.bucket_hash import bucket_ids
from tests.spark.test_sink_pieces import info, options, visible

rows_strategy = st.lists(st.tuples(st.integers(-20, 20), st.integers(-1000, 1000),
                                   st.one_of(st.none(), st.sampled_from(["x", "y", "zz"]))),
                         max_size=60)


@contextlib.contextmanager
def one_fold_limit(rows: int):
    saved = driver_delivery.ONE_FOLD_ROWS
    driver_delivery.ONE_FOLD_ROWS = rows
    try:
        yield
    finally:
        driver_delivery.ONE_FOLD_ROWS = saved


def fold_each_bucket(data: pa.Table, plan) -> dict[int, pa.Table]:
    """The definition: every bucket's rows folded alone (as its task folds them)."""
    batches = [b for b in BucketAssigner(plan, "test")(data.to_batches()) if b.num_rows]
    if not batches:
        return {}
    return {bucket: fold_rows(part, plan)[0]
            for bucket, part in rows_by_bucket(pa.Table.from_batches(batches)).items()}


@settings(max_examples=60, deadline=None, derandomize=True)
@given(rows=rows_strategy, buckets=st.integers(1, 5),
       one_fold_rows=st.sampled_from([0, 30, 10**6]))
def test_one_fold_split_by_bucket_is_each_buckets_fold(rows, buckets, one_fold_rows):
    from pyspark.sql.types import LongType, StringType, StructField, StructType

    schema = StructType([StructField("k", LongType()), StructField("v", LongType()),
                         StructField("s", StringType())])
    plan = build_plan(info(buckets=buckets), options(), schema)
    data = pa.table({"k": pa.array([r[0] for r in rows], pa.int64()),
                     "v": pa.array([r[1] for r in rows], pa.int64()),
                     "s": pa.array([r[2] for r in rows], pa.string())})
    with one_fold_limit(one_fold_rows):  # both ways: one fold split after, or bucket by bucket
        folded, _, counts = fold_by_bucket(data, plan, "test")
    expected = fold_each_bucket(data, plan)
    assert sorted(folded) == sorted(expected)
    for bucket, part in folded.items():
        assert part.equals(expected[bucket])
    # the plain model: each key in its bucket once, s joined in input order (v's sum state
    # is the engine's own: compared through the per-bucket fold above)
    placed = bucket_ids(data.select(["k"]), ["k"], buckets) if rows else []
    model: dict[int, dict[int, str | None]] = {}
    for (k, _, s), bucket in zip(rows, placed):
        joined = model.setdefault(int(bucket), {}).get(k)
        if s is not None:
            joined = s if joined is None else f"{joined},{s}"
        model[int(bucket)][k] = joined
    got: dict[int, dict[int, str | None]] = {}
    for bucket, part in folded.items():  # a key may fold to several runs (exact sums)
        for r in visible(part):
            joined = got.setdefault(bucket, {}).get(r["k"])
            if r["s"] is not None:
                joined = r["s"] if joined is None else f"{joined},{r['s']}"
            got[bucket][r["k"]] = joined
    assert got == model
    assert counts == {b: sum(1 for x in placed if x == b) for b in model}


def test_the_write_reads_a_dataframe_named_like_the_table_as_it_is(spark):
    same = spark.createDataFrame([(1, 2, "x")], "k long, v long, s string")
    plan = build_plan(info(), options(), same.schema)
    assert not plan.renames and table_named(same, plan) is same

    other_case = spark.createDataFrame([(1, 2, "x")], "K long, v long, s string")
    plan = build_plan(info(), options(), other_case.schema)
    selected = table_named(other_case, plan)
    assert plan.renames and selected.columns == ["k", "v", "s"]
    assert selected.collect()[0].asDict() == {"k": 1, "v": 2, "s": "x"}

    sequenced = spark.createDataFrame([(1, "x", 5)], "k long, s string, seq long")
    plan = build_plan(info(), options(**{"sequence-column": "seq"}), sequenced.schema)
    assert plan.renames
    assert table_named(sequenced, plan).columns == ["k", "s", HIDDEN_SEQUENCE_COLUMN]

    reordered = spark.createDataFrame([(2, 1)], "v long, k long")
    plan = build_plan(info(), options(), reordered.schema)
    assert not plan.renames and table_named(reordered, plan) is reordered  # read by name

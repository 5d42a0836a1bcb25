"""How TallySink delivers an epoch's rows: one Spark job, one task per bucket.

    df ─select─▶ table-named columns ─mapInArrow(BucketAssigner)─▶ + bucket, position
       ─repartitionById(bucket_count, bucket)─▶ partition i = bucket i
       ─mapInArrow(BucketTask)─▶ one report row per task (the per-bucket step, sink.task)
       ─collect─▶ driver

One action per epoch, so the micro-batch is evaluated once.
"""

from __future__ import annotations

from pyspark.sql import functions as F
from pyspark.sql.types import IntegerType, LongType, StructField, StructType

from sink.bucketing import BucketAssigner
from sink.plan import BUCKET_COLUMN, HIDDEN_SEQUENCE_COLUMN, ORDER_COLUMN, WritePlan
from sink.task import (
    RESULT_DDL,
    BucketReport,
    BucketTask,
    EpochContext,
    report_from_row,
)


def _column(name: str):
    return F.col("`" + name.replace("`", "``") + "`")


def bucketed(df, plan: WritePlan, label: str):
    """The DataFrame the write stage reads: partition i holds exactly bucket i's rows."""
    columns = [_column(src).alias(dst) for src, dst in zip(plan.input_columns, plan.table_columns)]
    if plan.sequence_column is not None and plan.sequence_column not in plan.input_columns:
        columns.append(_column(plan.sequence_column).alias(HIDDEN_SEQUENCE_COLUMN))
    selected = df.select(*columns)
    schema = StructType(selected.schema.fields + [
        StructField(BUCKET_COLUMN, IntegerType(), False),
        StructField(ORDER_COLUMN, LongType(), False)])
    assigned = selected.mapInArrow(BucketAssigner(plan, label), schema)
    return assigned.repartitionById(plan.bucket_count, BUCKET_COLUMN)


def run_write_job(df, plan: WritePlan, epoch: EpochContext, label: str) -> list[BucketReport]:
    """Run the epoch's write stage; one report per successful task."""
    spark = df.sparkSession
    spark.sparkContext.setJobDescription(f"tally sink: {label} into {plan.table}")
    try:
        rows = bucketed(df, plan, label).mapInArrow(BucketTask(plan, epoch), RESULT_DDL) \
            .collect()
    finally:
        spark.sparkContext.setJobDescription(None)
    return [report_from_row(row) for row in rows]


class SparkJob:
    """TallySink's delivery of an epoch (see sink.protocol): the write job over `df`."""

    def __init__(self, df):
        self.df = df

    def __call__(self, conn, plan: WritePlan, epoch: EpochContext,
                 label: str) -> list[BucketReport]:
        return run_write_job(self.df, plan, epoch, label)

"""The demo's Spark streaming job, run as its own process so the demo can crash and restart it.

    python -m tally.demo.orders_job URL TABLE SOURCE_DIR CHECKPOINT_DIR

Reads the order files one per micro-batch, in modification-time order, and writes them through
TallySink with `order_id` as the sequence column. With the environment variable
TALLY_DEMO_CRASH_EPOCH set, the job kills itself inside that micro-batch.
"""

from __future__ import annotations

import logging
import os
import sys

from tally.demo.crash import CRASH_EPOCH, JOB_PIDS
from tally.demo.orders import ORDER_SCHEMA


def main() -> int:
    url, table, source, checkpoint = sys.argv[1:5]
    logging.basicConfig(level=logging.WARNING, format="%(name)s: %(message)s", stream=sys.stdout)
    logging.getLogger("tally.sink").setLevel(logging.INFO)
    from pyspark.sql import SparkSession
    from pyspark.sql.types import StructType

    from sink import spark_jars

    builder = SparkSession.builder
    if spark_jars():  # the JVM reader (sink.read_table), where scripts/setup.sh built it
        builder = builder.config("spark.jars", spark_jars())
    spark = (builder.master("local[2,4]").appName("tally-demo")
             .config("spark.ui.enabled", "false").config("spark.sql.shuffle.partitions", "4")
             .config("spark.driver.memory", "1g").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    if os.environ.get(CRASH_EPOCH) and os.environ.get(JOB_PIDS):
        jvm_pid = spark.sparkContext._jvm.java.lang.ProcessHandle.current().pid()
        with open(os.environ[JOB_PIDS], "w") as f:
            f.write(f"{os.getpid()} {jvm_pid}")
    from sink import TallySink

    schema = StructType.fromJson({"type": "struct", "fields": [
        {"name": f.name, "type": _spark_type(f.type), "nullable": True, "metadata": {}}
        for f in ORDER_SCHEMA]})
    # One file per micro-batch, oldest modification time first (the demo gives the files
    # strictly increasing ones, in file order): batch i reads file i (tally.demo.orders).
    orders = (spark.readStream.schema(schema).option("maxFilesPerTrigger", 1)
              .option("latestFirst", "false").json(source)
              .withColumnRenamed("amount", "revenue").withColumnRenamed("price", "max_price")
              .selectExpr("product", "revenue", "order_id as orders", "max_price", "tags",
                          "order_id as order_ids", "status", "order_id"))
    crash_hook = "tally.demo.crash:kill_in_epoch" if os.environ.get(CRASH_EPOCH) else None
    sink = TallySink(url, table, options={"sequence-column": "order_id"}, fail_hook=crash_hook)
    query = sink.start(orders, checkpoint, trigger={"availableNow": True})
    query.awaitTermination()
    spark.stop()
    return 0


def _spark_type(arrow_type) -> str:
    import pyarrow as pa

    if pa.types.is_decimal(arrow_type):
        return f"decimal({arrow_type.precision},{arrow_type.scale})"
    return {"int64": "long", "string": "string"}[str(arrow_type)]


if __name__ == "__main__":
    sys.exit(main())

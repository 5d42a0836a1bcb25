"""format("tally") without registration, in a fresh Spark application of its own.

The application runs in a subprocess, the way a user's job does: an interpreter with Tally
installed, PYSPARK_PYTHON naming it (as `make test` and `import tally` set it), an empty working
directory and no PYTHONPATH, so the source is found only because the installed `pyspark_tally`
module is listed by Spark's lookup. Nothing in the job imports Tally before its first write.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

from sink.owner import batch_owner_id

JOB = r"""
import json, sys
from pyspark.sql import SparkSession

url, table = sys.argv[1], sys.argv[2]
spark = (SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false")
         .getOrCreate())
df = spark.createDataFrame([("kayak", 3), ("kayak", 4), ("canoe", 1)], "product string, n long")
(df.write.format("tally").option("url", url).option("table", table)
   .option("create-table", "true").option("primary-key", "product")
   .option("fields.n.agg", "sum").option("bucket.num", "2").mode("append").save())
try:   # max on the sum column of the table that now exists
    df.write.format("tally").option("url", url).option("table", table) \
        .option("fields.n.agg", "max").mode("append").save()
    contradiction = None
except Exception as e:
    contradiction = str(e)
import sink
sink.register(spark)   # still accepted, after discovery
df.write.format("tally").option("url", url).option("table", table) \
    .option("client.column-lock.owner-id", "after-register").mode("append").save()
print(json.dumps({"app_id": spark.sparkContext.applicationId,
                  "contradiction": contradiction}))
spark.stop()
"""


def test_format_tally_needs_no_registration(cluster, conn, table_name, tmp_path):
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PYSPARK_", "SPARK_", "_PYSPARK")) and k != "PYTHONPATH"}
    env["PYSPARK_PYTHON"] = sys.executable
    done = subprocess.run([sys.executable, "-c", JOB, cluster.url, table_name],
                          capture_output=True, text=True, cwd=tmp_path, env=env, timeout=900)
    assert done.returncode == 0, done.stderr[-5000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    # Discovered, and the batch write's default owner is the application's, as with register.
    owner = batch_owner_id(None, result["app_id"], table_name, ["n"])
    assert owner.startswith(f"spark-app:{result['app_id']}/")
    assert conn.locks.last_commit(table_name, owner)[0] == 0
    assert conn.locks.last_commit(table_name, "after-register")[0] == 0
    # 7 + 7 from the two writes; the contradicting one applied nothing.
    assert conn.table(table_name).lookup({"product": "kayak"}) == {"product": "kayak", "n": 14}
    assert "asks for max" in result["contradiction"]
    assert "aggregates with sum" in result["contradiction"]
    # The commit process's line per epoch reaches the driver's stderr with no logging set up.
    assert f"{table_name} epoch 0 (batch write (epoch 0) by {owner}): " in done.stderr

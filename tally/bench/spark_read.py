"""Spark batch read benchmark: the same rows read by Spark from Tally, PostgreSQL and Parquet.

    python -m tally.bench.spark_read [--rows N] [--buckets B] [--partitions P] [--rounds R]

One table of `--rows` rows (k bigint key, v bigint, c bigint, s string), held three ways:

- Tally: a LocalCluster of 2 tablet servers, `--buckets` buckets, read with
  `spark.read.format("tally")` in `--partitions` Spark partitions (its `spark-partitions`
  option; default 2, the cores of the `local[2]` session: each task reads whole buckets);
  twice: freshly written rows, which the buckets still hold in their row buffers (`tally`), and
  the same rows in a table with `table.kv.buffer-size` 0, whose every put is written to RocksDB
  (`tally-stored`: what a scan of rows flushed long ago costs); both tables read again by the
  JVM reader (`sink.read_table`: `tally-jvm`, `tally-jvm-stored`), the same parts fetched by
  Spark's JVM as Arrow IPC streams from the tablet servers, no Python worker (left out when
  the reader's jar is not built);
- PostgreSQL 15 (Debian's package, a private server as in tally.bench.spark), read over JDBC
  with Debian's PostgreSQL JDBC driver (`libpostgresql-jdbc-java`, installed when missing),
  split on the key into `--partitions` partitions too;
- Parquet files (as many as Tally has buckets), read with `spark.read.parquet`, and the same
  files read by a Python data source that only yields their Arrow batches
  (tally.bench.arrow_source, the files in `--partitions` partitions): the least any Python
  data source read costs, Tally's included.

Each read is timed from building its DataFrame (a Tally read plans there) through Spark's
`noop` writer, which materializes every row and column and
keeps nothing; each leg is verified untimed (row count, sum of v, sum of c). One untimed warm-up
round, then `--rounds` rounds in rotated order; each leg counts its median round.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

JDBC_JAR = "/usr/share/java/postgresql.jar"


def ensure_jdbc_driver() -> str:
    if not os.path.exists(JDBC_JAR):
        subprocess.run(["apt-get", "install", "-y", "-qq", "libpostgresql-jdbc-java"],
                       check=True, env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"})
    return JDBC_JAR


def make_rows(rows: int, seed: int) -> pa.Table:
    rng = np.random.default_rng(seed)
    k = np.arange(rows, dtype=np.int64)
    v = rng.integers(-1000, 1000, rows)
    c = rng.integers(0, 10, rows)
    s = pa.array([f"item-{i % 997}" for i in range(rows)])
    return pa.table({"k": k, "v": v, "c": c, "s": s})


def expected_of(rows: pa.Table) -> tuple[int, int, int]:
    return (rows.num_rows, int(np.sum(rows.column("v").to_numpy())),
            int(np.sum(rows.column("c").to_numpy())))


def check(df) -> tuple[int, int, int]:
    from pyspark.sql import functions as F

    r = df.agg(F.count("*"), F.sum("v"), F.sum("c")).collect()[0]
    return int(r[0]), int(r[1]), int(r[2])


def timed(make) -> float:
    started = time.monotonic()
    make().write.format("noop").mode("overwrite").save()
    return time.monotonic() - started


def load_tally(conn, rows: pa.Table, buckets: int, name: str, properties: dict) -> None:
    import tally

    schema = (tally.Schema.builder().column("k", pa.int64())
              .agg_column("v", pa.int64(), tally.AggFunction.SUM)
              .agg_column("c", pa.int64(), tally.AggFunction.SUM)
              .agg_column("s", pa.string(), tally.AggFunction.LAST_VALUE)
              .primary_key("k").build())
    conn.admin.create_database("bench", ignore_if_exists=True)
    conn.admin.create_table(name, tally.TableDescriptor(
        schema, bucket_count=buckets,
        properties={"table.merge-engine": "aggregation", **properties}))
    with conn.table(name).upsert_writer() as writer:
        for batch in rows.to_batches(max_chunksize=100_000):
            writer.upsert(pa.Table.from_batches([batch]))


def load_postgres(spark, pg, rows_path: str) -> dict:
    url = f"jdbc:postgresql://127.0.0.1:{pg.port}/postgres"
    props = {"user": "postgres", "driver": "org.postgresql.Driver"}
    (spark.read.parquet(rows_path).write.option("batchsize", 20_000)
     .option("createTableColumnTypes", "k BIGINT, v BIGINT, c BIGINT, s VARCHAR(64)")
     .jdbc(url, "bench_read", mode="overwrite", properties=props))
    return {"url": url, "props": props}


def run(rows: int = 1_000_000, buckets: int = 4, rounds: int = 3, seed: int = 11,
        master: str = "local[2]", partitions: int = 2) -> dict:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    jar = ensure_jdbc_driver()
    from pyspark.sql import SparkSession

    import sink
    from tally import client
    from tally.bench.arrow_source import ParquetArrowSource
    from sink.jvm_reader import jvm_jar, read_table, spark_jars
    from tally.bench.private_postgres import PrivatePostgres
    from tally.server import LocalCluster

    work = tempfile.mkdtemp(prefix="tally-bench-read-")
    spark = (SparkSession.builder.master(master).appName("tally-bench-read")
             .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
             .config("spark.jars", spark_jars(jar))
             .config("spark.sql.shuffle.partitions", "2").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    sink.register(spark)
    spark.dataSource.register(ParquetArrowSource)
    data = make_rows(rows, seed)
    expected = expected_of(data)
    parquet = os.path.join(work, "parquet")
    os.makedirs(parquet)
    per = -(-rows // buckets)
    files = [os.path.join(parquet, f"part-{i}.parquet") for i in range(buckets)]
    for i, path in enumerate(files):
        pq.write_table(data.slice(i * per, per), path)
    try:
        with LocalCluster(os.path.join(work, "tally"), tablet_servers=2) as cluster, \
                client.connect(cluster.url) as conn, PrivatePostgres() as pg:
            started = time.monotonic()
            load_tally(conn, data, buckets, "bench.read", {})
            tally_load = time.monotonic() - started
            load_tally(conn, data, buckets, "bench.read_stored", {"table.kv.buffer-size": "0"})
            jdbc = load_postgres(spark, pg, parquet)
            readers = {
                "tally": lambda: spark.read.format("tally").option("url", cluster.url)
                .option("table", "bench.read").option("spark-partitions", partitions).load(),
                "tally-stored": lambda: spark.read.format("tally").option("url", cluster.url)
                .option("table", "bench.read_stored").option("spark-partitions", partitions)
                .load(),
                "postgresql": lambda: spark.read.jdbc(
                    jdbc["url"], "bench_read", column="k", lowerBound=0, upperBound=rows,
                    numPartitions=partitions, properties=jdbc["props"]),
                "parquet": lambda: spark.read.parquet(parquet),
                "python-arrow-floor": lambda: spark.read.format("bench-arrow")
                .option("files", ",".join(files)).option("partitions", partitions).load(),
            }
            if jvm_jar() is not None:  # built by scripts/setup.sh where javac is installed
                readers["tally-jvm"] = lambda: read_table(spark, {
                    "url": cluster.url, "table": "bench.read", "spark-partitions": partitions})
                readers["tally-jvm-stored"] = lambda: read_table(spark, {
                    "url": cluster.url, "table": "bench.read_stored",
                    "spark-partitions": partitions})
            verified = {name: check(make()) == expected for name, make in readers.items()}
            counts = {name: make().rdd.getNumPartitions() for name, make in readers.items()}
            for make in readers.values():  # warm-up, untimed
                timed(make)
            times: dict[str, list[float]] = {name: [] for name in readers}
            names = list(readers)
            for r in range(rounds):
                shift = r % len(names)
                for name in names[shift:] + names[:shift]:
                    times[name].append(timed(readers[name]))
    finally:
        spark.stop()
        shutil.rmtree(work, ignore_errors=True)
    legs = [{"system": name, "seconds": statistics.median(t), "round_seconds": t,
             "rows_per_s": rows / statistics.median(t), "partitions": counts[name],
             "verified": verified[name]} for name, t in times.items()]
    rate = {leg["system"]: leg["rows_per_s"] for leg in legs}
    jvm = {}
    if "tally-jvm" in rate:
        jvm = {"jvm_over": {leg["system"]: rate["tally-jvm"] / leg["rows_per_s"] for leg in legs
                            if leg["system"] != "tally-jvm"},
               "jvm_stored_over_postgresql": rate["tally-jvm-stored"] / rate["postgresql"]}
    return {"benchmark": "spark_read", "rows": rows, "buckets": buckets, "rounds": rounds,
            "spark_partitions": partitions,
            "tally_load_seconds": tally_load, "legs": legs,
            "tally_over": {leg["system"]: rate["tally"] / leg["rows_per_s"] for leg in legs
                           if not leg["system"].startswith("tally")},
            "stored_over_postgresql": rate["tally-stored"] / rate["postgresql"],
            **jvm,
            "ok": all(verified.values())}


def format_text(outcome: dict) -> str:
    lines = [f"Spark batch read of {outcome['rows']:,} rows (k, v, c, s), Tally's "
             f"{outcome['buckets']} buckets in {outcome['spark_partitions']} Spark partitions; "
             f"after a warm-up round, the median of {outcome['rounds']} rounds "
             f"in rotated order (Tally loaded in {outcome['tally_load_seconds']:.1f} s)"]
    for leg in outcome["legs"]:
        rounds = ", ".join(f"{s:.2f}" for s in leg["round_seconds"])
        lines.append(f"  {leg['system']:<18} {leg['rows_per_s']:>12,.0f} rows/s  "
                     f"({leg['seconds']:.2f} s; rounds {rounds} s; {leg['partitions']} Spark "
                     f"partitions)  verified={leg['verified']}")
    for system, ratio in outcome["tally_over"].items():
        lines.append(f"  tally / {system}: {ratio:.2f}x")
    lines.append(f"  tally-stored / postgresql: {outcome['stored_over_postgresql']:.2f}x")
    for system, ratio in outcome.get("jvm_over", {}).items():
        lines.append(f"  tally-jvm / {system}: {ratio:.2f}x")
    if "jvm_stored_over_postgresql" in outcome:
        lines.append(f"  tally-jvm-stored / postgresql: "
                     f"{outcome['jvm_stored_over_postgresql']:.2f}x")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--buckets", type=int, default=4)
    parser.add_argument("--partitions", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seed", type=int, default=11)
    parser.add_argument("--result", metavar="FILE",
                        help="also write the result as JSON to FILE (for `tally bench`)")
    args = parser.parse_args(argv)
    outcome = run(args.rows, args.buckets, args.rounds, seed=args.seed,
                  partitions=args.partitions)
    if args.result:
        with open(args.result, "w") as f:
            json.dump(outcome, f)
    print(format_text(outcome))
    return 0 if outcome["ok"] else 1


def run_in_own_process(rows: int, seed: int) -> dict:
    """`run` in a fresh Python process. The JDBC driver must be on the classpath the JVM was
    launched with: a JVM an earlier benchmark of the same run started (and whose session it
    stopped) cannot load it any more, so `tally bench` runs this benchmark in its own process.
    Its progress shows on this process's output."""
    from tally.bench.proc import child_env

    with tempfile.TemporaryDirectory(prefix="tally-bench-read-") as scratch:
        result = os.path.join(scratch, "result.json")
        done = subprocess.run([sys.executable, "-m", "tally.bench.spark_read", "--rows",
                               str(rows), "--seed", str(seed), "--result", result],
                              env=child_env())
        if not os.path.exists(result):
            raise RuntimeError(f"the Spark read benchmark's process failed (exit code "
                               f"{done.returncode}); its output is above")
        with open(result) as f:
            return json.load(f)


if __name__ == "__main__":
    sys.exit(main())

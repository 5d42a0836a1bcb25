"""Spark benchmark: one streaming job shape into Tally, PostgreSQL and a pypaimon table.

    python -m tally.bench.spark [--rows N] [--keys K] [--files F] [--per-batch B]

The same Structured Streaming job (a Parquet file source read `--per-batch` files per
micro-batch, availableNow) aggregates `k` -> sum(v), sum(c) into:

- Tally, through TallySink (exactly once: lock, baselines, one task per bucket, MERGE_STATE);
- PostgreSQL 15 (Debian's package, installed when missing), a private server on a free loopback
  port in a temporary directory run as the `postgres` user: foreachBatch -> foreachPartition,
  each partition folded per key in Python, then psycopg `executemany` of INSERT ... ON CONFLICT
  (k) DO UPDATE SET v = t.v + EXCLUDED.v, in key order (no deadlocks between partitions);
- a pypaimon primary-key table with `merge-engine=aggregation` (sum): foreachBatch collects the
  batch as Arrow and writes + commits it (pypaimon has no Spark writer; its merge happens on read);
- nothing: a no-op job of the shape TallySink's tasks run (mapInArrow, repartitionById shuffle,
  mapInArrow, collect), the cost of that shape alone, with no store behind it.

The three stores are verified against a plain-Python fold. Then the latency of small micro-batches
(tally.bench.spark_latency). `run()` returns the structured result for `tally bench`; rows/s are
source rows over the streaming query's wall time (start to end).
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import os
import shutil
import subprocess
import sys
import statistics
import tempfile
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from tally.bench import spark_latency
from tally.bench.private_postgres import PrivatePostgres
from tally.bench.progress import Progress

# --- setup -----------------------------------------------------------------------------------

def _pip(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check",
                    *args], check=True)


def ensure_python_packages() -> None:
    """psycopg and pypaimon, installed when missing. pypaimon pins pyarrow<20 although it runs
    on newer ones: the venv's pyarrow is put back after installing it."""
    try:
        importlib.import_module("psycopg")
    except ImportError:
        _pip("psycopg[binary]>=3.1")
    try:
        importlib.import_module("pypaimon")
    except ImportError:
        _pip("pypaimon")
        if pa.__version__ != importlib.metadata.version("pyarrow"):
            _pip(f"pyarrow=={pa.__version__}")
    importlib.invalidate_caches()


# --- workload --------------------------------------------------------------------------------

def make_source(directory: str, rows: int, keys: int, files: int, seed: int) -> dict:
    """Parquet files of (k, v, c); returns the reference fold {k: (sum v, sum c)}."""
    rng = np.random.default_rng(seed)
    os.makedirs(directory, exist_ok=True)
    total_v = np.zeros(keys, np.int64)
    total_c = np.zeros(keys, np.int64)
    per = rows // files
    first = time.time() - 10 * files
    for f in range(files):
        k = rng.integers(0, keys, per)
        v = rng.integers(-100, 1000, per)
        c = np.ones(per, np.int64)
        np.add.at(total_v, k, v)
        np.add.at(total_c, k, c)
        path = os.path.join(directory, f"part-{f:04d}.parquet")
        pq.write_table(pa.table({"k": k, "v": v, "c": c}), path)
        os.utime(path, (first + 10 * f, first + 10 * f))
    seen = np.flatnonzero(total_c)
    return {int(i): (int(total_v[i]), int(total_c[i])) for i in seen}


def _stream(spark, source: str, per_batch: int):
    return (spark.readStream.schema("k long, v long, c long")
            .option("maxFilesPerTrigger", per_batch).parquet(source))


def _timed(query) -> float:
    started = time.monotonic()
    query.awaitTermination()
    if query.exception() is not None:
        raise RuntimeError(str(query.exception()))
    return time.monotonic() - started


# --- the three sinks -------------------------------------------------------------------------

def run_tally(spark, source, per_batch, work, buckets, expected) -> dict:
    from sink import TallySink
    from tally import client
    from tally.server import LocalCluster

    with LocalCluster(os.path.join(work, "tally"), tablet_servers=2) as cluster:
        sink = TallySink(cluster.url, "bench.totals", options={
            "create-table": "true", "primary-key": "k", "bucket.num": str(buckets),
            "fields.v.agg": "sum", "fields.c.agg": "sum"})
        seconds = _timed(sink.start(_stream(spark, source, per_batch), os.path.join(work, "ck-t"),
                                    trigger={"availableNow": True}))
        with client.connect(cluster.url) as conn:
            got = {r["k"]: (r["v"], r["c"]) for r in conn.table("bench.totals").to_arrow()
                   .to_pylist()}
        spark_latency.wait_for_release(sink)
    return {"system": "tally", "seconds": seconds, "verified": got == expected}


class _NoWrite:
    """The no-op leg's per-bucket step: consumes the bucket's rows, answers one row."""

    def __call__(self, batches):
        rows = sum(batch.num_rows for batch in batches)
        yield pa.RecordBatch.from_pydict({"rows": [rows]})


class _NoAssign:
    """The no-op leg's first stage: a bucket column (the key modulo the partition count)."""

    def __init__(self, buckets: int):
        self.buckets = buckets

    def __call__(self, batches):
        for batch in batches:
            keys = batch.column(0).to_numpy(zero_copy_only=False)
            yield batch.append_column("bucket", pa.array((keys % self.buckets).astype(np.int32)))


def noop_shape(df, buckets: int) -> int:
    """TallySink's task shape with nothing behind it: mapInArrow adding a bucket column,
    repartitionById into one partition per bucket, mapInArrow, collect (one action)."""
    assigned = df.mapInArrow(_NoAssign(buckets), "k long, v long, c long, bucket int")
    rows = assigned.repartitionById(buckets, "bucket").mapInArrow(_NoWrite(), "rows long") \
        .collect()
    return sum(r["rows"] for r in rows)


def run_noop(spark, source, per_batch, work, buckets, expected) -> dict:
    seen = []
    query = (_stream(spark, source, per_batch).writeStream
             .foreachBatch(lambda df, _: seen.append(noop_shape(df, buckets)))
             .option("checkpointLocation", os.path.join(work, "ck-noop"))
             .trigger(availableNow=True).start())
    seconds = _timed(query)
    rows = sum(count for _, count in expected.values())
    return {"system": "no-op shape", "seconds": seconds, "verified": sum(seen) == rows}


def _pg_partition(dsn: str):
    def write(rows):
        import psycopg

        totals: dict = {}
        for r in rows:
            v, c = totals.get(r.k, (0, 0))
            totals[r.k] = (v + r.v, c + r.c)
        if not totals:
            return
        with psycopg.connect(dsn, autocommit=False) as conn, conn.cursor() as cur:
            cur.executemany(
                "INSERT INTO totals AS t (k, v, c) VALUES (%s, %s, %s) ON CONFLICT (k) DO "
                "UPDATE SET v = t.v + EXCLUDED.v, c = t.c + EXCLUDED.c",
                [(k, v, c) for k, (v, c) in sorted(totals.items())])
            conn.commit()
    return write


def run_postgres(spark, source, per_batch, work, expected) -> dict:
    import psycopg

    with PrivatePostgres() as pg:
        with psycopg.connect(pg.dsn, autocommit=True) as conn:
            conn.execute("CREATE TABLE totals (k BIGINT PRIMARY KEY, v BIGINT, c BIGINT)")
        write = _pg_partition(pg.dsn)
        query = (_stream(spark, source, per_batch).writeStream
                 .foreachBatch(lambda df, _: df.foreachPartition(write))
                 .option("checkpointLocation", os.path.join(work, "ck-pg"))
                 .trigger(availableNow=True).start())
        seconds = _timed(query)
        with psycopg.connect(pg.dsn) as conn:
            got = {k: (v, c) for k, v, c in conn.execute("SELECT k, v, c FROM totals")}
    return {"system": "postgresql", "seconds": seconds, "verified": got == expected}


def run_paimon(spark, source, per_batch, work, buckets, expected) -> dict:
    from pypaimon import CatalogFactory, Schema

    catalog = CatalogFactory.create({"warehouse": os.path.join(work, "paimon")})
    catalog.create_database("bench", True)
    arrow = pa.schema([pa.field("k", pa.int64(), nullable=False), ("v", pa.int64()),
                       ("c", pa.int64())])
    catalog.create_table("bench.totals", Schema.from_pyarrow_schema(
        arrow, primary_keys=["k"], options={
            "merge-engine": "aggregation", "fields.v.aggregate-function": "sum",
            "fields.c.aggregate-function": "sum", "bucket": str(buckets)}), False)
    table = catalog.get_table("bench.totals")

    def write(df, _):
        batch = df.toArrow().cast(arrow)
        if batch.num_rows == 0:
            return
        builder = table.new_batch_write_builder()
        writer, commit = builder.new_write(), builder.new_commit()
        writer.write_arrow(batch)
        commit.commit(writer.prepare_commit())
        writer.close()
        commit.close()

    query = (_stream(spark, source, per_batch).writeStream.foreachBatch(write)
             .option("checkpointLocation", os.path.join(work, "ck-paimon"))
             .trigger(availableNow=True).start())
    seconds = _timed(query)
    read = table.new_read_builder()
    rows = read.new_read().to_arrow(read.new_scan().plan().splits()).to_pylist()
    got = {r["k"]: (r["v"], r["c"]) for r in rows}
    return {"system": "pypaimon", "seconds": seconds, "verified": got == expected}


LEGS = {  # system -> leg(spark, source, per_batch, work, buckets, expected)
    "tally": run_tally,
    "postgresql": lambda spark, source, per_batch, work, _buckets, expected:
        run_postgres(spark, source, per_batch, work, expected),
    "pypaimon": run_paimon,
    "no-op shape": run_noop,
}
STORES = ("tally", "postgresql", "pypaimon")  # the legs Tally is compared with (and itself)


def run_leg(system: str, spark, source, per_batch, work, buckets, expected) -> dict:
    os.makedirs(work, exist_ok=True)
    return LEGS[system](spark, source, per_batch, work, buckets, expected)


def rotated(round_number: int) -> list[str]:
    """The legs' order in a round: each round starts one leg later, so over the rounds no leg
    always runs first (right after the warm-up, when the JVM is least warm) or last."""
    names = list(LEGS)
    shift = round_number % len(names)
    return names[shift:] + names[:shift]


# --- driver ----------------------------------------------------------------------------------

def run(rows: int = 800_000, keys: int = 20_000, files: int = 8, per_batch: int = 2,
        buckets: int = 4, seed: int = 7, master: str = "local[2]", rounds: int = 3,
        latency_batches: int = 40) -> dict:
    """Run the legs in one SparkSession; rows/s and ratios (Tally over the others), then the
    small-batch latency (tally.bench.spark_latency, `latency_batches` per query; 0 skips it).

    One untimed warm-up round at full size (Spark's JIT keeps speeding up well past a small
    job: a leg's first full-size run was measured up to 40% slower than its second), then
    `rounds` timed rounds in rotated leg order; each leg counts its median round.
    """
    ensure_python_packages()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    work = tempfile.mkdtemp(prefix="tally-bench-spark-")
    spark = (SparkSession.builder.master(master).appName("tally-bench-spark")
             .config("spark.ui.enabled", "false").config("spark.sql.shuffle.partitions", "2")
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    runs: dict[str, list[dict]] = {name: [] for name in LEGS}
    progress = Progress(len(LEGS) * (1 + rounds) + (1 if latency_batches else 0))
    try:
        source = os.path.join(work, "source")
        expected = make_source(source, rows, keys, files, seed)
        for name in LEGS:  # warm-up, untimed
            progress.step(f"warm-up: {name}")
            leg = run_leg(name, spark, source, per_batch, os.path.join(work, f"w-{name}"),
                          buckets, expected)
            progress.done(f"{leg['seconds']:.1f} s of streaming (untimed)")
        for round_number in range(rounds):
            for name in rotated(round_number):
                progress.step(f"round {round_number + 1}/{rounds}: {name}")
                leg = run_leg(name, spark, source, per_batch,
                              os.path.join(work, f"r{round_number}-{name}"), buckets, expected)
                runs[name].append(leg)
                progress.done(f"{(rows // files) * files / leg['seconds']:,.0f} rows/s")
        latency = None
        if latency_batches:
            progress.step("latency of 1,000-row micro-batches")
            latency = spark_latency.run(spark, work, batches=latency_batches, keys=keys,
                                        buckets=buckets)
            progress.done(f"tally / no-op {latency['ratio']:.2f}x")
    finally:
        spark.stop()
        shutil.rmtree(work, ignore_errors=True)
    legs = []
    for name, done in runs.items():
        legs.append({"system": name, "seconds": statistics.median(r["seconds"] for r in done),
                     "round_seconds": [r["seconds"] for r in done],
                     "verified": all(r["verified"] for r in done)})
    total = (rows // files) * files
    for leg in legs:
        leg["rows"] = total
        leg["rows_per_s"] = total / leg["seconds"]
    tally = legs[0]["rows_per_s"]
    ratios = {leg["system"]: tally / leg["rows_per_s"] for leg in legs[1:]
              if leg["system"] in STORES}
    noop = next(leg for leg in legs if leg["system"] == "no-op shape")
    return {"benchmark": "spark", "rows": total, "keys": keys, "micro_batches": files // per_batch,
            "rounds": rounds, "legs": legs, "tally_over": ratios,
            "tally_share_of_noop": tally / noop["rows_per_s"],
            "targets": dict(TARGETS), "latency": latency,
            "ok": all(leg["verified"] for leg in legs)
            and (latency is None or latency["visible"])}


# Tally's rows/s over each store's, at least (issue 22).
TARGETS = {"postgresql": 2.5, "pypaimon": 5.0}


def target_lines(outcome: dict) -> list[str]:
    """One line per target: the ratio, the target, met or MISSED."""
    lines = []
    for system, target in outcome["targets"].items():
        ratio = outcome["tally_over"].get(system, 0.0)
        lines.append(f"Tally / {system} >= {target:g}x: {ratio:.2f}x, "
                     f"{'met' if ratio >= target else 'MISSED'}")
    latency = outcome.get("latency")
    if latency:
        lines.append(f"1,000-row micro-batch visible within {latency['target_ratio']:g}x a no-op "
                     f"foreachBatch: {latency['ratio']:.2f}x, "
                     f"{'met' if latency['ratio'] <= latency['target_ratio'] else 'MISSED'}")
    return lines


def format_text(outcome: dict) -> str:
    lines = [f"Spark streaming job: {outcome['rows']:,} rows, {outcome['keys']:,} keys, "
             f"{outcome['micro_batches']} micro-batches (sum(v), sum(c) per key); after a "
             f"warm-up round, the median of {outcome['rounds']} rounds in rotated order"]
    for leg in outcome["legs"]:
        rounds = ", ".join(f"{s:.1f}" for s in leg["round_seconds"])
        lines.append(f"  {leg['system']:<11} {leg['rows_per_s']:>12,.0f} rows/s  "
                     f"({leg['seconds']:.1f} s; rounds {rounds} s)  verified={leg['verified']}")
    for system, ratio in outcome["tally_over"].items():
        lines.append(f"  tally / {system}: {ratio:.2f}x")
    lines.append(f"  tally / the no-op shape: {outcome['tally_share_of_noop']:.2f}x")
    if outcome.get("latency"):
        from tally.bench.spark_latency import format_text as latency_text

        lines.append(latency_text(outcome["latency"]))
    lines += [f"  target: {line}" for line in target_lines(outcome)]
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=800_000)
    parser.add_argument("--keys", type=int, default=20_000)
    parser.add_argument("--files", type=int, default=8)
    parser.add_argument("--per-batch", type=int, default=2)
    parser.add_argument("--buckets", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--latency-batches", type=int, default=40,
                        help="micro-batches per latency query (0: no latency measurement)")
    args = parser.parse_args(argv)
    outcome = run(args.rows, args.keys, args.files, args.per_batch, args.buckets,
                  rounds=args.rounds, latency_batches=args.latency_batches)
    print(format_text(outcome))
    return 0 if outcome["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())

"""`tally bench`: every benchmark of Tally, in one list, run in order, printed, and reported.

Each entry of BENCHMARKS names a benchmark module's `run()` (which returns structured
results), its text rendering (printed as it finishes), its markdown and plot renderers (for
`--report`, tally.bench.markdown and tally.bench.charts) and its verification; `by_convention`
finds the renderers by the benchmark's name. Sizes follow `--rows`
(the default 1M reproduces the numbers in docs/benchmarks.md; smaller values give a quick run).

A missed throughput target is printed, not an error: numbers vary between machines, and a wrong
result is what must fail. A benchmark that cannot run (say, no Java for Spark) is reported as
failed and the others still run.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import time
import traceback
from typing import Any, Callable


@dataclasses.dataclass(frozen=True)
class Sizes:
    """How big each benchmark runs. `scaled(rows)` derives every size from the row count."""

    rows: int = 1_000_000
    keys: int = 100_000
    batch: int = 100_000
    repeat: int = 3
    seed: int = 42
    lookups: int = 5_000
    undo_tables: tuple[int, ...] = (1_000_000, 4_000_000)
    undo_batches: tuple[int, ...] = (1_000, 10_000, 100_000)
    spark_rows: int = 800_000
    spark_keys: int = 20_000
    latency_batches: int = 40
    read_rows: int = 1_000_000
    fault_trials: int = 5

    @classmethod
    def scaled(cls, rows: int = 1_000_000, keys: int = 100_000, batch: int = 100_000,
               repeat: int = 3, seed: int = 42, fault_trials: int = 5) -> "Sizes":
        return cls(rows=rows, keys=keys, batch=batch, repeat=repeat, seed=seed,
                   fault_trials=fault_trials,
                   lookups=max(100, min(5_000, rows // 20)),
                   undo_tables=(rows, 4 * rows),
                   undo_batches=tuple(sorted({max(10, rows // 1000), max(10, rows // 100),
                                              max(10, rows // 10)})),
                   spark_rows=max(8_000, rows * 4 // 5), spark_keys=max(100, keys // 5),
                   latency_batches=max(8, min(40, rows // 25_000)),
                   read_rows=max(10_000, rows))


@dataclasses.dataclass(frozen=True)
class Benchmark:
    name: str
    title: str
    about: str                                  # what is measured, how, and the target
    run: Callable[[Sizes], Any]
    text: Callable[[Any], str]
    ok: Callable[[Any], bool]                   # the results verified
    markdown: Callable[[Any], str]
    chart: Callable[[Any, Any], list]           # (result, directory) -> PNG paths


@dataclasses.dataclass
class Outcome:
    benchmark: Benchmark
    result: Any = None
    seconds: float = 0.0
    error: str | None = None


def _ingest(s: Sizes):
    from tally.bench import ingest

    return ingest.run(rows=s.rows, keys=s.keys, batch=s.batch, seed=s.seed, repeat=s.repeat,
                      samples=min(1000, s.keys))


def _rollups(s: Sizes):
    from tally.bench import rollup_bench as rollups

    return rollups.run(rows=s.rows, batch=s.batch, seed=s.seed, repeat=s.repeat,
                       samples=min(1000, s.keys))


def _cluster(s: Sizes):
    from tally.bench import cluster

    return cluster.run(rows=s.rows, keys=s.keys, batch=s.batch, seed=s.seed,
                       lookups=s.lookups, samples=min(200, s.keys))


def _undo(s: Sizes):
    from tally.bench import undo

    return undo.run(table_rows=s.undo_tables, batch_keys=s.undo_batches,
                    target_keys=s.undo_batches[len(s.undo_batches) // 2])


def _spark(s: Sizes):
    from tally.bench import spark

    return spark.run(rows=s.spark_rows, keys=s.spark_keys, seed=s.seed,
                     latency_batches=s.latency_batches)


def _spark_read(s: Sizes):
    from tally.bench import spark_read

    return spark_read.run_in_own_process(rows=s.read_rows, seed=s.seed)


def _replication(s: Sizes):
    from tally.bench import replication

    return replication.run(rows=max(10_000, s.rows // 2), keys=max(1_000, s.keys // 2),
                           batch=max(1_000, s.batch // 2), seed=s.seed)


def _tiering(s: Sizes):
    from tally.bench import tiering

    return tiering.run(rows=max(10_000, s.rows * 3), keys=max(1_000, s.keys * 3),
                       batch=max(1_000, s.batch // 5), seed=s.seed)


def _faults(s: Sizes):
    from tally.bench import faults

    return faults.run(trials=s.fault_trials, rows=max(10_000, s.rows // 5),
                      keys=max(1_000, s.keys // 5), batch=max(1_000, s.batch // 5), seed=s.seed)


def lazy(module: str, attribute: str) -> Callable:
    """`module.attribute`, imported at the first call: listing the benchmarks (the CLI's
    choices) must not import pyarrow, Spark or matplotlib."""
    def call(*args):
        import importlib

        return getattr(importlib.import_module(module), attribute)(*args)
    return call


def by_convention(name: str, title: str, about: str, run: Callable[[Sizes], Any],
                  ok: Callable[[Any], bool], module: str | None = None) -> Benchmark:
    """A benchmark wired by the suite's convention: its text is `format_text` of
    tally.bench.<module> (default: <name>), its markdown and chart the functions named <name>
    in tally.bench.markdown and tally.bench.charts."""
    return Benchmark(name, title, about, run,
                     lazy(f"tally.bench.{module or name}", "format_text"), ok,
                     lazy("tally.bench.markdown", name), lazy("tally.bench.charts", name))


BENCHMARKS = [
    by_convention(
        "ingest", "Ingest: the engine, its floor, DuckDB, ClickHouse and a naive loop",
        "`KvTablet.put` of Arrow batches beside four other ways to build the same table from "
        "the same data, each run in a fresh process: the floor (all the input in one pyarrow "
        "group-by, every row encoded in the engine's row format, one RocksDB write batch with "
        "one fsync: no read-modify-write, no changelog, the least any store must do), DuckDB "
        "(an embedded file, one transaction per batch aggregating it and folding it into the "
        "table), ClickHouse (chdb in process: an AggregatingMergeTree, one insert per batch "
        "pre-aggregating it into per-key aggregate states; its rows/s until the last insert "
        "returned, when the table is readable, and until `OPTIMIZE TABLE ... FINAL` merged "
        "it) and a naive per-row rocksdict read-modify-write loop (get, unpickle, merge, "
        "pickle, put). Rows/s count the writes (the engine's include its final flush of "
        "buffered rows to RocksDB); median of --repeat alternating runs. Targets: the engine "
        ">= 50% of the floor on both cases, >= 2.5x DuckDB on (a) repeated keys and >= 2x on "
        "(b) unique keys, >= 1.5x ClickHouse's insert-only rows/s on both, >= 5x and >= 1.2x "
        "the naive loop. Every side's table is compared "
        "with the naive loop's on sampled keys. The last line shows how the engine's peak "
        "memory grows with the table.",
        _ingest, lazy("tally.bench.ingest", "verified")),
    by_convention(
        "rollups", "Rollups: one write feeding three rollups, Tally against ClickHouse",
        "Click events (event_id, ts, product, region, user, clicks, amount in cents), in time "
        "order, written in batches into a source table that feeds three rollups: per minute x "
        "product (count, sums), per hour x region (count, sums, max) and per day (count, sums, "
        "min, max). Tally: a `KvTablet` for the events and one per rollup, each batch "
        "projected by the rollup's `RollupSpec` and put into its tablet. ClickHouse (chdb in "
        "process): a MergeTree for the events and three materialized views into "
        "AggregatingMergeTree tables (ClickHouse runs them inside the insert). Both timed "
        "until every rollup is readable: every write returned, then a read of each rollup's "
        "rows (ClickHouse's merged by GROUP BY). Each side in a fresh process, median of "
        "--repeat alternating runs. Target: Tally >= 1.5x ClickHouse. Both sides' rollups are "
        "compared with one pyarrow group-by of the whole input on sampled keys of each "
        "rollup, and their row counts with it.",
        _rollups, lambda r: r["verified"], module="rollup_bench"),
    by_convention(
        "cluster", "Client vs in-process, and lookup latency",
        "The ingest workload (case a) through one client upsert writer to a LocalCluster of "
        "tablet-server processes, timed until the flush that acknowledges every row, against "
        "`KvTablet.put` in one process (target >= 0.7x). Then single-key lookups over Flight "
        "(target p99 < 2 ms, and <= 1.5x the p99 of a no-op Flight round trip to a tablet "
        "server, the floor on this machine, measured in turn with the lookups), and "
        "`lookup_many` of 1,000 keys (target >= 20x the keys/s of single lookups). Sampled keys "
        "are compared between the two sides.",
        _cluster, lambda r: r["ok"]),
    by_convention(
        "undo", "Undo time vs batch size and table size",
        "In one tablet of the ingest table shape: write a batch of existing keys, then "
        "`undo_bucket` it back to the offset before the batch; both timed, three rounds of "
        "new batches, each side's median. The undo/write ratio is the number to watch: the "
        "target (<= 1.5x, flat as the table grows) is the middle batch size's (10k keys); the "
        "others show how the ratio moves with the batch. Every undo is verified: the touched "
        "keys are back to their state before the batch.",
        _undo, lambda results: all(r["verified"] for r in results)),
    by_convention(
        "spark", "Spark streaming into Tally, PostgreSQL and pypaimon",
        "The same Structured Streaming job (a Parquet file source, a few files per micro-batch, "
        "sum per key) into Tally through `TallySink` (exactly once), into PostgreSQL with "
        "`INSERT ... ON CONFLICT DO UPDATE` from foreachPartition, into a pypaimon "
        "primary-key table with the aggregation merge engine, and into nothing through a no-op "
        "job of TallySink's task shape; rows/s over the query's wall time (median of rotated "
        "rounds after a warm-up round), every result verified against a plain-Python fold "
        "(targets >= 2.5x PostgreSQL, >= 5x pypaimon). Then micro-batches of 1,000 rows: "
        "per-batch time into Tally, each batch read back by a lookup, against the same query "
        "with a no-op foreachBatch (target <= 1.5x). See tally.bench.spark.",
        _spark, lambda r: r["ok"]),
    by_convention(
        "spark_read", "Spark batch reads: Tally, PostgreSQL over JDBC, Parquet",
        "The same rows (k, v, c, s) read by Spark from a Tally table (`format(\"tally\")`, its "
        "buckets grouped into as many Spark partitions as `local[2]` has cores, the "
        "`spark-partitions` option; once with the rows still in the buckets' row buffers, once "
        "from a table whose rows are all in RocksDB, `tally-stored`), from PostgreSQL over "
        "JDBC (split on the key into as many "
        "partitions), from Parquet files, and from a Python data source that only yields "
        "Arrow batches of those files (the floor of any Python data source); each read "
        "materialized through Spark's `noop` writer; rows/s (median of rotated rounds after a "
        "warm-up round), every leg verified (count and sums). Target: Tally >= 2x JDBC. See "
        "tally.bench.spark_read.",
        _spark_read, lambda r: r["ok"]),
    by_convention(
        "replication", "Replication: ingest at RF 1 and RF 3, failover time",
        "Half the ingest workload (case a) through one client upsert writer into two tables "
        "of one 3-server LocalCluster, replication factor 1 and 3 (min.insync.replicas 2), "
        "timed until the flush that acknowledges every row (target RF 3 >= 0.5x RF 1); then "
        "20 kill -9 of the leader of one bucket, each timed until the first write of that "
        "bucket is acknowledged by the new leader (target p99 <= 10 s). Sampled keys are "
        "compared between the two tables. See tally.bench.replication.",
        _replication, lambda r: r["ok"]),
    by_convention(
        "tiering", "Tiering into Delta Lake: throughput, lag, cost on ingest",
        "Three times the ingest workload (case a) through one client upsert writer into tables "
        "of 4 buckets on one LocalCluster: one with the lake off, one tiered into Delta Lake "
        "by a tiering process while it is written (freshness 1s); the ratio is tiering's cost "
        "on ingest (target >= 0.8x; the lake-off side is the mean of a run before and after). The lag is sampled every 0.25 s: from the table reaching "
        "its end offsets to the lake reaching them (p50, p99); throughput is changelog records "
        "tiered per second. The lake is compared with the live table. See tally.bench.tiering.",
        _tiering, lambda r: r["ok"]),
    Benchmark(
        "faults", "Faults: failover and write unavailability per fault, RF 3 against RF 1",
        "One 3-server LocalCluster at replication factor 3 (min in-sync replicas 2, the "
        "default session timeout), tablet server 2 in its own network namespace; a probe writes "
        "one key back to back. Per fault kind (kill -9, pause and partition of a leader, a "
        "follower's disk full, a coordinator restart during a failover), --fault-trials "
        "trials, each timed from the fault to the acknowledgement of the first write begun once "
        "it is in force (recovery, target p99 <= 5 s after a leader's fault) and the longest "
        "gap between acknowledged writes around it (unavailability); p50 and p99. Then a fifth of the ingest workload (case a) at RF 1 "
        "and RF 3 (target >= 0.6x). The probe key must count every acknowledged write and at "
        "most the ambiguous ones besides. Needs root, ip and iptables. See tally.bench.faults "
        "and docs/reliability.md.",
        _faults, lazy("tally.bench.faults", "format_text"), lambda r: r["ok"],
        lazy("tally.bench.faults", "markdown"), lazy("tally.bench.faults", "chart")),
]
NAMES = [b.name for b in BENCHMARKS]


def run_suite(only: list[str] | None = None, sizes: Sizes | None = None,
              report: str | None = None, command: str = "tally bench",
              stream=sys.stdout) -> int:
    """Run the chosen benchmarks in order; print each; write the report; 0 when every one ran
    and verified, else 1."""
    sizes = sizes or Sizes()
    chosen = [b for b in BENCHMARKS if not only or b.name in only]
    load_start = os.getloadavg()[0]
    outcomes = []
    for i, bench in enumerate(chosen, 1):
        print(f"\n=== [{i}/{len(chosen)}] {bench.title} ===", file=stream, flush=True)
        started = time.perf_counter()
        outcome = Outcome(bench)
        try:
            outcome.result = bench.run(sizes)
            print("\n" + bench.text(outcome.result), file=stream, flush=True)
        except Exception as e:  # noqa: BLE001 - one broken benchmark must not hide the rest
            outcome.error = f"{type(e).__name__}: {e}"
            traceback.print_exc()
            print(f"{bench.name} FAILED: {outcome.error}", file=stream, flush=True)
        outcome.seconds = time.perf_counter() - started
        outcomes.append(outcome)
    if report:
        from tally.bench.report import write

        files = write(report, outcomes, command, (load_start, os.getloadavg()[0]),
                      [b.title for b in BENCHMARKS])
        print(f"\nreport written to {files[0]} (plots: {', '.join(str(f) for f in files[1:])})",
              file=stream)
    failed = [o.benchmark.name for o in outcomes
              if o.error is not None or not o.benchmark.ok(o.result)]
    if failed:
        print(f"verification FAILED or benchmark did not run: {', '.join(failed)}",
              file=sys.stderr)
        return 1
    return 0

"""Latency of small micro-batches: 1,000 rows visible in Tally vs a no-op foreachBatch.

The same streaming query (a Parquet file source, one file of `rows_per_batch` rows per
micro-batch, availableNow) runs twice per round, in alternating order:

- into Tally through TallySink, each batch followed (inside foreachBatch, so inside the batch's
  time) by a point lookup of one key of that batch that must return the key's running totals
  after it: the batch is visible to readers when the batch ends;
- with a no-op foreachBatch (the function returns at once; Spark still plans the batch, lists
  files and writes its offset and commit logs).

A batch's time is Spark's own `triggerExecution` of the query progress (the whole trigger:
offsets, the batch, the commit log). The first `skip` batches of each query are left out (the
sink's first batch also acquires its lock and recovers). Target: Tally's median <= 1.5x the
no-op's median.
"""

from __future__ import annotations

import os
import statistics
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

TARGET_RATIO = 1.5


def make_batches(directory: str, batches: int, rows_per_batch: int, keys: int,
                 seed: int) -> list[tuple[int, tuple[int, int]]]:
    """One Parquet file per micro-batch (distinct modification times, so the file source takes
    them in order); per batch, a key of it and that key's (sum v, sum c) once it is applied."""
    rng = np.random.default_rng(seed)
    os.makedirs(directory, exist_ok=True)
    total_v = np.zeros(keys, np.int64)
    total_c = np.zeros(keys, np.int64)
    probes = []
    first = 1_000_000_000
    for b in range(batches):
        k = rng.integers(0, keys, rows_per_batch)
        v = rng.integers(-100, 1000, rows_per_batch)
        np.add.at(total_v, k, v)
        np.add.at(total_c, k, 1)
        path = os.path.join(directory, f"batch-{b:05d}.parquet")
        pq.write_table(pa.table({"k": k, "v": v, "c": np.ones(rows_per_batch, np.int64)}), path)
        os.utime(path, (first + 10 * b, first + 10 * b))
        probe = int(k[0])
        probes.append((probe, (int(total_v[probe]), int(total_c[probe]))))
    return probes


def wait_for_release(sink, timeout: float = 30.0) -> None:
    """Until the sink's query listener ended its run (released the lock): stopping the cluster
    first would leave that release retrying against servers that are gone."""
    deadline = time.monotonic() + timeout
    while sink.owner_ids() and time.monotonic() < deadline:
        time.sleep(0.05)


def _stream(spark, source: str):
    return (spark.readStream.schema("k long, v long, c long")
            .option("maxFilesPerTrigger", 1).parquet(source))


def _batch_millis(query, skip: int, batches: int) -> list[float]:
    """Batches `skip` .. `batches` - 1 of a finished query (a no-op foreachBatch never reads
    its rows, so its progress counts no input rows: batches are told apart by id)."""
    query.awaitTermination()
    if query.exception() is not None:
        raise RuntimeError(str(query.exception()))
    return [float(p.durationMs["triggerExecution"]) for p in query.recentProgress
            if skip <= p.batchId < batches]


def tally_query(spark, url: str, table: str, source: str, checkpoint: str, probes,
                buckets: int):
    """The Tally query, started: (query, misses, sink, conn); `misses` fills with every batch
    whose probe key did not read back its expected totals when the batch ended."""
    from sink import TallySink
    from tally import client

    sink = TallySink(url, table, options={
        "create-table": "true", "primary-key": "k", "bucket.num": str(buckets),
        "fields.v.agg": "sum", "fields.c.agg": "sum"})
    conn = client.connect(url)
    handles = []  # the table exists once the sink's first batch created it
    misses = []

    def write_and_look(df, batch_id):
        sink(df, batch_id)
        if not handles:
            handles.append(conn.table(table))
        key, want = probes[batch_id]
        row = handles[0].lookup({"k": key})
        if row is None or (row["v"], row["c"]) != want:
            misses.append((batch_id, key, row, want))

    query = (_stream(spark, source).writeStream.foreachBatch(write_and_look)
             .option("checkpointLocation", checkpoint).trigger(availableNow=True).start())
    return query, misses, sink, conn


def run(spark, work: str, batches: int = 40, rows_per_batch: int = 1_000, keys: int = 20_000,
        buckets: int = 4, rounds: int = 2, skip: int = 3, seed: int = 11) -> dict:
    """Per-batch times of both queries over `rounds` alternating rounds (see module doc)."""
    from tally.server import LocalCluster

    source = os.path.join(work, "latency-source")
    probes = make_batches(source, batches, rows_per_batch, keys, seed)
    times: dict[str, list[float]] = {"tally": [], "no-op foreachBatch": []}
    visible = True
    with LocalCluster(os.path.join(work, "latency-tally"), tablet_servers=2) as cluster:
        for round_number in range(rounds):
            order = ["no-op foreachBatch", "tally"] if round_number % 2 == 0 else \
                ["tally", "no-op foreachBatch"]
            for leg in order:
                checkpoint = os.path.join(work, f"latency-ck-{round_number}-{len(leg)}")
                if leg == "tally":
                    query, misses, sink, conn = tally_query(
                        spark, cluster.url, f"bench.latency{round_number}", source, checkpoint,
                        probes, buckets)
                    try:
                        times[leg] += _batch_millis(query, skip, batches)
                    finally:
                        conn.close()
                    wait_for_release(sink)
                    visible = visible and not misses
                else:
                    query = (_stream(spark, source).writeStream
                             .foreachBatch(lambda df, batch_id: None)
                             .option("checkpointLocation", checkpoint)
                             .trigger(availableNow=True).start())
                    times[leg] += _batch_millis(query, skip, batches)
    legs = {name: summary(values) for name, values in times.items()}
    ratio = legs["tally"]["median_ms"] / legs["no-op foreachBatch"]["median_ms"]
    return {"batches": batches, "rows_per_batch": rows_per_batch, "rounds": rounds,
            "skipped": skip, "legs": legs, "ratio": ratio, "target_ratio": TARGET_RATIO,
            "visible": visible}


def summary(millis: list[float]) -> dict:
    ordered = sorted(millis)
    return {"count": len(ordered), "median_ms": statistics.median(ordered),
            "p90_ms": ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))],
            "millis": millis}


def format_text(latency: dict) -> str:
    lines = [f"Micro-batches of {latency['rows_per_batch']:,} rows ({latency['batches']} per "
             f"query, first {latency['skipped']} left out, {latency['rounds']} rounds):"]
    for name, leg in latency["legs"].items():
        lines.append(f"  {name:<20} median {leg['median_ms']:7.0f} ms  p90 "
                     f"{leg['p90_ms']:7.0f} ms  ({leg['count']} batches)")
    mark = "met" if latency["ratio"] <= latency["target_ratio"] else "MISSED"
    lines.append(f"  tally / no-op: {latency['ratio']:.2f}x (target <= "
                 f"{latency['target_ratio']}x: {mark}); every batch visible to a lookup when "
                 f"it ended: {latency['visible']}")
    return "\n".join(lines)

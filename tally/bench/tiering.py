"""Tiering benchmark: how fast a tiering process copies a table into Delta Lake while ingest
runs at full speed, how far behind the lake stays, and what tiering costs the ingest.

One LocalCluster (one tablet server, embedded metadata, a lake root), two tables of the ingest
shape with 4 buckets, in the same run:
  plain    the lake off: client ingest alone
  tiered   `table.datalake.enabled`, freshness `freshness`, one tiering process running
Both are written by one client upsert writer at full speed (case a of the ingest workload), the
lake-off table before and after the tiered one (their mean counts); the ratio tiered / plain
is tiering's cost on ingest. While the tiered table is written, a
sampler records every `sample_every` seconds the table's end offsets and the lake's offsets:
the lag of a sample is the time from when the table reached its end offsets to when the lake
reached them (p50, p99), and the lake's throughput is the records it tiered per second from
the first sample to the one where it caught up. The lake is checked against the live table
once it caught up.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

from tally.bench.client_ingest import timed_upserts
from tally.bench.progress import Progress
from tally.bench.workload import Workload, table_descriptor

RATIO_TARGET = 0.8   # a tiering process should cost ingest at most a fifth


def _ingest(conn, name: str, batches, total: int, progress: Progress, label: str) -> dict:
    progress.step(label)
    return timed_upserts(conn, name, batches, total, progress)


class LagSampler:
    """Samples the table's end offsets and the lake's offsets until stopped."""

    def __init__(self, conn, name: str, every: float) -> None:
        self.conn, self.name, self.every = conn, name, every
        self.samples: list[tuple[float, int, int]] = []  # (seconds, table records, lake records)
        self.ends: list[tuple[float, dict]] = []
        self.lakes: list[tuple[float, dict]] = []
        self._stop = threading.Event()
        self.started = time.perf_counter()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            self.sample()

    def sample(self) -> tuple[dict, dict]:
        now = time.perf_counter() - self.started
        ends = self.conn.admin.list_offsets(self.name)
        snapshot = self.conn.admin.lake_snapshot(self.name)
        lake = dict(snapshot.offsets) if snapshot else {}
        self.ends.append((now, ends))
        self.lakes.append((now, lake))
        self.samples.append((now, sum(ends.values()), sum(lake.get(k, 0) for k in ends)))
        return ends, lake

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def lags(self) -> list[float]:
        """Per end-offsets sample, seconds until the lake held all of it (caught-up ones)."""
        out = []
        for at, ends in self.ends:
            reached = next((t for t, lake in self.lakes if t >= at and
                            all(lake.get(k, 0) >= e for k, e in ends.items())), None)
            if reached is not None and sum(ends.values()):
                out.append(reached - at)
        return out


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def _tiered(cluster, conn, name: str, batches, total: int, every: float,
            progress: Progress) -> dict:
    sampler = LagSampler(conn, name, every)
    result = _ingest(conn, name, batches, total, progress,
                     "client upserts with a tiering process copying the table")
    progress.step("the lake catching up")
    caught = time.perf_counter()
    while True:
        ends, lake = sampler.sample()
        if all(lake.get(k, 0) >= e for k, e in ends.items()):
            break
        if time.perf_counter() - caught > 600:
            raise RuntimeError("the lake did not catch up within 10 minutes")
        time.sleep(every)
    sampler.stop()
    progress.done(f"{time.perf_counter() - caught:.1f} s after the last write")
    lags = sampler.lags()
    return {**result, "lag_p50_s": _percentile(lags, 0.5), "lag_p99_s": _percentile(lags, 0.99),
            "lag_max_s": max(lags), "records": sampler.samples[-1][1],
            "tiered_records_per_s": _throughput(sampler.samples), "samples": sampler.samples,
            "lag_samples": len(lags)}


def _throughput(samples: list[tuple[float, int, int]]) -> float:
    """Records the lake took per second, from its first move to its catching up (over the
    whole run when it moved once only)."""
    moved = [(t, lake) for t, _, lake in samples if lake > 0]
    if len(moved) >= 2 and moved[-1][0] > moved[0][0] and moved[-1][1] > moved[0][1]:
        return (moved[-1][1] - moved[0][1]) / (moved[-1][0] - moved[0][0])
    return samples[-1][2] / max(1e-3, samples[-1][0] - samples[0][0])


def _verify(conn, name: str) -> dict:
    import deltalake

    snapshot = conn.admin.lake_snapshot(name)
    lake = deltalake.DeltaTable(snapshot.path).to_pyarrow_table().sort_by("id")
    live = conn.table(name).to_arrow().sort_by("id")
    cast = lake.cast(live.schema)
    return {"rows": live.num_rows, "lake_rows": lake.num_rows, "equal": cast.equals(live),
            "version": snapshot.version}


def run(rows: int = 3_000_000, keys: int = 300_000, batch: int = 20_000, seed: int = 42,
        freshness: str = "1s", sample_every: float = 0.25, workdir: str | None = None,
        stream=sys.stdout) -> dict:
    import tally
    from tally.server import LocalCluster

    workload = Workload(rows=rows, keys=keys, batch=batch, seed=seed)
    progress = Progress(4, stream)
    root = Path(workdir or tempfile.mkdtemp(prefix="tally-bench-tiering-"))
    try:
        with LocalCluster(str(root / "cluster"), tablet_servers=1,
                          datalake_dir=str(root / "lake"), tiering=True) as cluster:
            with tally.connect(cluster.url, retry_timeout=300) as conn:
                batches = list(workload.batches())
                for name, lake in (("default.plain", False), ("default.tiered", True),
                                   ("default.plain_after", False)):
                    descriptor = table_descriptor()
                    descriptor.bucket_count = 4
                    descriptor.properties["table.datalake.enabled"] = str(lake).lower()
                    descriptor.properties["table.datalake.freshness"] = freshness
                    conn.admin.create_table(name, descriptor)
                before = _ingest(conn, "default.plain", batches, workload.rows, progress,
                                 "client upserts, the lake off")
                tiered = _tiered(cluster, conn, "default.tiered", batches, workload.rows,
                                 sample_every, progress)
                after = _ingest(conn, "default.plain_after", batches, workload.rows, progress,
                                "client upserts, the lake off, again")
                check = _verify(conn, "default.tiered")
                # the lake-off side is run before and after the tiered one: the mean of both
                # takes the warm-up and the drift of a shared machine out of the ratio
                seconds = (before["seconds"] + after["seconds"]) / 2
                plain = {"rows": workload.rows, "seconds": seconds,
                         "rows_per_s": workload.rows / seconds,
                         "runs_rows_per_s": [before["rows_per_s"], after["rows_per_s"]]}
    finally:
        if workdir is None:
            shutil.rmtree(root, ignore_errors=True)
    return {"workload": workload.label, "freshness": freshness, "plain": plain,
            "tiered": tiered, "ratio": tiered["rows_per_s"] / plain["rows_per_s"],
            "ratio_target": RATIO_TARGET, "verify": check, "ok": check["equal"]}


def format_text(result: dict) -> str:
    t = result["tiered"]
    return "\n".join([
        f"tiering benchmark: {result['workload']}, 1 tablet server, 4 buckets, freshness "
        f"{result['freshness']}",
        f"  ingest, lake off        {result['plain']['rows_per_s']:>12,.0f} rows/s",
        f"  ingest, tiering running {t['rows_per_s']:>12,.0f} rows/s",
        f"  tiered / plain: {result['ratio']:.2f}x (target >= {result['ratio_target']}x)",
        f"  tiering throughput {t['tiered_records_per_s']:,.0f} changelog records/s",
        f"  lag from the table's offsets to the lake's: p50 {t['lag_p50_s']:.2f} s, "
        f"p99 {t['lag_p99_s']:.2f} s, max {t['lag_max_s']:.2f} s ({t['lag_samples']} samples)",
        f"  verified: lake version {result['verify']['version']}, "
        f"{result['verify']['lake_rows']:,} rows, equal to the live table: "
        f"{result['verify']['equal']}",
    ])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tally.bench.tiering",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=3_000_000)
    parser.add_argument("--keys", type=int, default=300_000)
    parser.add_argument("--batch", type=int, default=20_000)
    parser.add_argument("--freshness", default="1s")
    args = parser.parse_args(argv)
    result = run(rows=args.rows, keys=args.keys, batch=args.batch, freshness=args.freshness)
    print()
    print(format_text(result))
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())

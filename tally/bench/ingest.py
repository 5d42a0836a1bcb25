"""Ingest benchmark: KvTablet.put beside its floor, DuckDB and a naive per-row loop.

Cases (issue 2, section 6; issue 22), both with the four-column workload of
tally.bench.workload:
  (a) `rows` rows over `keys` random keys; (b) `rows` unique keys.
Four sides write the same generated data, each measurement in a fresh process:
  - the engine: `KvTablet.put` of each Arrow batch (tally.bench.engine);
  - the floor: one group-by of all the input, one write batch, one fsync (tally.bench.floor),
    the least any store must do; the engine is reported as a share of it (target >= 50%);
  - DuckDB: an embedded file, one transaction per batch (tally.bench.duckdb_peer; target: the
    engine >= 2.5x DuckDB on (a), >= 2x on (b));
  - ClickHouse: chdb's AggregatingMergeTree, one pre-aggregating insert per batch
    (tally.bench.clickhouse_peer; target: the engine >= 1.5x its insert-only rows/s on both
    cases; its rows/s once fully merged by OPTIMIZE FINAL are reported beside);
  - the naive loop: per row get, unpickle, merge, pickle, put (tally.bench.naive; target: the
    engine >= 5x on (a), >= 1.2x on (b)).
Sides alternate within each of `repeat` rounds and each side's median counts. After every round
the other sides' tables are compared with the naive loop's on sampled keys. A last engine
run on tables `rss_scales` times larger than (b) shows whether peak RSS grows with table size:
it rises while the row buffer and RocksDB's memtables fill, then stays flat.

`run()` returns a list of dicts; `format_text()` renders them (tally.bench.markdown and
tally.bench.charts make the report's table and plot).
"""

from __future__ import annotations

import shutil
import statistics
import tempfile
from pathlib import Path

from tally.bench.proc import run_job
from tally.bench.progress import Progress
from tally.bench.workload import Workload

MB = 1024 * 1024
TARGETS = {"a": 5.0, "b": 1.2}  # engine / naive
FLOOR_SHARE = 0.5  # engine / floor, both cases
DUCKDB_TARGETS = {"a": 2.5, "b": 2.0}  # engine / DuckDB
CLICKHOUSE_TARGETS = {"a": 1.5, "b": 1.5}  # engine / ClickHouse insert-only
SIDES = ("engine", "floor", "duckdb", "clickhouse", "naive")
COMPARED = ("engine", "floor", "duckdb", "clickhouse")  # each checked against the naive loop


def cases(rows: int, keys: int, batch: int, seed: int) -> list[tuple[str, Workload]]:
    return [
        ("a", Workload(rows=rows, keys=keys, batch=batch, seed=seed)),
        ("b", Workload(rows=rows, keys=None, batch=batch, seed=seed)),
    ]


def _workload_args(workload: Workload) -> dict:
    return {"rows": workload.rows, "keys": workload.keys, "batch": workload.batch, "seed": workload.seed}


def _measure(side: str, path: Path, workload: Workload, progress: Progress, label: str) -> dict:
    progress.step(f"{side} {label}")
    result = run_job(
        side,
        {"path": str(path), "workload": _workload_args(workload)},
        on_progress=lambda done: progress.rows(done, workload.rows),
    )
    result["rows_per_s"] = result["rows"] / result["seconds"]
    if "merged_seconds" in result:  # ClickHouse: until OPTIMIZE FINAL merged every part
        result["merged_rows_per_s"] = result["rows"] / result["merged_seconds"]
    result["peak_rss_mb"] = result["peak_rss_bytes"] / MB
    progress.done(f"{result['rows_per_s']:,.0f} rows/s, peak RSS {result['peak_rss_mb']:.0f} MB")
    return result


def _verify(paths: dict[str, Path], workload: Workload, samples: int, progress: Progress) -> dict:
    """Each compared side against the naive loop, a fresh process each; per side its result."""
    progress.step("verify " + ", ".join(COMPARED) + " == naive")
    checks = {}
    for side in COMPARED:
        checks[side] = run_job("verify", {
            "side": side,
            "side_path": str(paths[side]),
            "naive_path": str(paths["naive"]),
            "workload": _workload_args(workload),
            "samples": samples,
        })
    bad = [f"{side}: {'; '.join(c['problems'][:3])}" for side, c in checks.items() if not c["ok"]]
    first = checks[COMPARED[0]]
    progress.done("MISMATCH " + " | ".join(bad) if bad else
                  f"{first['sampled']:,} sampled keys agree on every side, "
                  f"{first['table_rows']:,} rows")
    return checks


def run_case(case: str, workload: Workload, workdir: Path, repeat: int, samples: int,
             progress: Progress) -> dict:
    """Every side's runs of one case (alternating, `repeat` times), each round verified."""
    runs: dict[str, list[dict]] = {side: [] for side in SIDES}
    checks = []
    label = f"({case}) {workload.label}"
    for attempt in range(repeat):
        paths = {side: workdir / f"{side}-{case}-{attempt}" for side in SIDES}
        for side in SIDES:
            runs[side].append(_measure(side, paths[side], workload, progress, label))
        checks.append(_verify(paths, workload, samples, progress))
        for path in paths.values():
            shutil.rmtree(path, ignore_errors=True)
    rate = {side: statistics.median(r["rows_per_s"] for r in runs[side]) for side in SIDES}
    # Rows per second of the process's CPU time (its threads included): steadier than wall
    # time on a machine other work shares, and a check on the wall-time ratios.
    cpu_rate = {side: statistics.median(r["rows"] / max(r["cpu_seconds"], 1e-9)
                                        for r in runs[side]) for side in SIDES}
    ratio = rate["engine"] / rate["naive"]
    floor_share = rate["engine"] / rate["floor"]
    duckdb_ratio = rate["engine"] / rate["duckdb"]
    clickhouse_ratio = rate["engine"] / rate["clickhouse"]
    clickhouse_merged = statistics.median(r["merged_rows_per_s"] for r in runs["clickhouse"])
    problems = [f"{side}: {p}" for round_checks in checks for side, c in round_checks.items()
                for p in c["problems"]]
    return {
        "kind": "throughput",
        "case": case,
        "label": workload.label,
        "rows": workload.rows,
        "keys": workload.distinct_keys,
        "batch": workload.batch,
        "repeat": repeat,
        "engine_rows_per_s": rate["engine"],
        "naive_rows_per_s": rate["naive"],
        "floor_rows_per_s": rate["floor"],
        "duckdb_rows_per_s": rate["duckdb"],
        "ratio": ratio,
        "target": TARGETS[case],
        "met": ratio >= TARGETS[case],
        "floor_share": floor_share,
        "floor_target": FLOOR_SHARE,
        "floor_met": floor_share >= FLOOR_SHARE,
        "duckdb_ratio": duckdb_ratio,
        "duckdb_target": DUCKDB_TARGETS[case],
        "duckdb_met": duckdb_ratio >= DUCKDB_TARGETS[case],
        "clickhouse_rows_per_s": rate["clickhouse"],
        "clickhouse_merged_rows_per_s": clickhouse_merged,
        "clickhouse_ratio": clickhouse_ratio,
        "clickhouse_merged_ratio": rate["engine"] / clickhouse_merged,
        "clickhouse_target": CLICKHOUSE_TARGETS[case],
        "clickhouse_met": clickhouse_ratio >= CLICKHOUSE_TARGETS[case],
        "verified": all(c["ok"] for round_checks in checks for c in round_checks.values()),
        "sampled": checks[-1]["engine"]["sampled"],
        "problems": problems[:10],
        "engine_peak_rss_mb": max(r["peak_rss_mb"] for r in runs["engine"]),
        "naive_peak_rss_mb": max(r["peak_rss_mb"] for r in runs["naive"]),
        **{f"{side}_runs": [round(r["rows_per_s"]) for r in runs[side]] for side in SIDES},
        "cpu_rows_per_s": cpu_rate,
    }


def run_rss(unique: dict, workload: Workload, scales: tuple[int, ...], workdir: Path,
            progress: Progress) -> dict:
    """Peak RSS of the engine at case (b)'s table size and at `scales` times that size."""
    sizes = [{"table_rows": workload.rows, "peak_rss_mb": unique["engine_peak_rss_mb"]}]
    for scale in scales:
        larger = Workload(rows=workload.rows * scale, keys=None, batch=workload.batch,
                          seed=workload.seed)
        path = workdir / "engine-rss"
        result = _measure("engine", path, larger, progress, f"(b x{scale}) {larger.label}")
        shutil.rmtree(path, ignore_errors=True)
        sizes.append({"table_rows": larger.rows, "peak_rss_mb": result["peak_rss_mb"],
                      "rows_per_s": result["rows_per_s"]})
    progress.step("baseline: interpreter + pyarrow + engine code + one batch")
    baseline = run_job("baseline", {"workload": _workload_args(workload)})["peak_rss_bytes"] / MB
    progress.done(f"peak RSS {baseline:.0f} MB")
    return {
        "kind": "rss",
        "baseline_mb": baseline,
        "sizes": sizes,
        # between the two largest tables: what more rows cost once buffers are full
        "growth": sizes[-1]["peak_rss_mb"] / sizes[-2]["peak_rss_mb"] - 1.0,
    }


def run(rows: int = 1_000_000, keys: int = 100_000, batch: int = 100_000, seed: int = 42,
        repeat: int = 1, samples: int = 1000, rss_scales: tuple[int, ...] = (4, 8),
        workdir: str | None = None, progress: Progress | None = None) -> list[dict]:
    """Run the whole ingest benchmark; return one dict per case plus one for peak RSS."""
    steps = 2 * repeat * (len(SIDES) + 1) + (len(rss_scales) + 1 if rss_scales else 0)
    progress = progress or Progress(steps)
    from tally.bench import clickhouse_peer, duckdb_peer

    duckdb_version = duckdb_peer.ensure_installed()  # before any measurement, never during one
    clickhouse_version = clickhouse_peer.ensure_installed()
    base = Path(tempfile.mkdtemp(prefix="tally-bench-", dir=workdir))
    try:
        results = []
        for case, workload in cases(rows, keys, batch, seed):
            result = run_case(case, workload, base, repeat, samples, progress)
            result["duckdb_version"] = duckdb_version
            result["clickhouse_version"] = clickhouse_version
            results.append(result)
        if rss_scales:
            unique = next(r for r in results if r["case"] == "b")
            results.append(run_rss(unique, cases(rows, keys, batch, seed)[1][1], tuple(rss_scales),
                                   base, progress))
        return results
    finally:
        shutil.rmtree(base, ignore_errors=True)


# --- text rendering ---------------------------------------------------------------------------

HEADERS = ["case", "engine rows/s", "floor rows/s", "engine / floor", "DuckDB rows/s",
           "engine / DuckDB", "ClickHouse insert rows/s", "engine / ClickHouse",
           "ClickHouse merged rows/s", "naive rows/s", "engine / naive", "verified",
           "engine peak RSS"]


def _against(value: float, target: float, percent: bool = False) -> str:
    shown = f"{value:.0%}" if percent else f"{value:.2f}x"
    wanted = f"{target:.0%}" if percent else f"{target:g}x"
    return f"{shown} (>= {wanted} {'met' if value >= target else 'MISSED'})"


def table_rows(results: list[dict]) -> list[list[str]]:
    """One row of HEADERS per throughput case (shared by the text and markdown forms)."""
    rows = []
    for r in results:
        if r["kind"] != "throughput":
            continue
        verified = f"{r['sampled']:,} keys ok" if r["verified"] else "MISMATCH"
        rows.append([
            f"({r['case']}) {r['label']}",
            f"{r['engine_rows_per_s']:,.0f}",
            f"{r['floor_rows_per_s']:,.0f}",
            _against(r["floor_share"], r["floor_target"], percent=True),
            f"{r['duckdb_rows_per_s']:,.0f}",
            _against(r["duckdb_ratio"], r["duckdb_target"]),
            f"{r['clickhouse_rows_per_s']:,.0f}",
            _against(r["clickhouse_ratio"], r["clickhouse_target"]),
            f"{r['clickhouse_merged_rows_per_s']:,.0f} ({r['clickhouse_merged_ratio']:.2f}x)",
            f"{r['naive_rows_per_s']:,.0f}",
            _against(r["ratio"], r["target"]),
            verified,
            f"{r['engine_peak_rss_mb']:,.0f} MB",
        ])
    return rows


def versions_line(results: list[dict]) -> str | None:
    cases = [r for r in results if r["kind"] == "throughput"]
    if not cases:
        return None
    r = cases[0]
    def cpu_ratio(c: dict, side: str) -> float:
        return c["cpu_rows_per_s"]["engine"] / c["cpu_rows_per_s"][side]

    cpu = "; ".join(
        f"({c['case']}) {cpu_ratio(c, 'floor'):.0%} of the floor, "
        f"{cpu_ratio(c, 'duckdb'):.2f}x DuckDB, {cpu_ratio(c, 'clickhouse'):.2f}x ClickHouse"
        for c in cases)
    return (f"DuckDB {r.get('duckdb_version')}, {r.get('clickhouse_version')}; ClickHouse "
            "merged: until OPTIMIZE FINAL returned, the engine's ratio to that in brackets; "
            f"every side's median of {r['repeat']} alternating runs; naive peak RSS "
            f"{r['naive_peak_rss_mb']:,.0f} MB; the engine by rows per second of process CPU "
            f"time: {cpu}")


def rss_line(results: list[dict]) -> str | None:
    for r in results:
        if r["kind"] == "rss":
            sizes = ", ".join(f"{s['table_rows']:,} keys {s['peak_rss_mb']:,.0f} MB"
                              for s in r["sizes"])
            return (
                f"engine peak RSS by table size: {sizes} ({r['growth']:+.0%} between the two "
                f"largest); baseline before any put {r['baseline_mb']:,.0f} MB; put at the "
                f"largest size: {r['sizes'][-1]['rows_per_s']:,.0f} rows/s"
            )
    return None


def problems(results: list[dict]) -> list[str]:
    return [f"({r['case']}) {p}" for r in results if r["kind"] == "throughput"
            for p in r["problems"]]


def verified(results: list[dict]) -> bool:
    return all(r["verified"] for r in results if r["kind"] == "throughput")


def format_text(results: list[dict]) -> str:
    from tabulate import tabulate

    align = ["left"] + ["right"] * (len(HEADERS) - 1)
    lines = [tabulate(table_rows(results), HEADERS, colalign=align, disable_numparse=True)]
    for extra in (versions_line(results), rss_line(results)):
        if extra:
            lines.append(extra)
    lines.extend("verification problem: " + p for p in problems(results))
    return "\n".join(lines)

"""Ingest benchmark: KvTablet.put against a naive per-row RocksDB loop, side by side.

Cases (issue 2, section 6), both with the four-column workload of tally.bench.workload:
  (a) `rows` rows over `keys` random keys: target >= 5x the naive loop;
  (b) `rows` unique keys: target >= 1.2x.
Each measurement (engine run, naive run, verification) is a fresh process. Both sides of a case
write the same generated data; then the two results are compared on sampled keys. A last engine
runs on tables `rss_scales` times larger than (b) show whether peak RSS grows with table size:
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
TARGETS = {"a": 5.0, "b": 1.2}


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
    result["peak_rss_mb"] = result["peak_rss_bytes"] / MB
    progress.done(f"{result['rows_per_s']:,.0f} rows/s, peak RSS {result['peak_rss_mb']:.0f} MB")
    return result


def _verify(engine_path: Path, naive_path: Path, workload: Workload, samples: int, progress: Progress) -> dict:
    progress.step("verify engine == naive")
    args = {
        "engine_path": str(engine_path),
        "naive_path": str(naive_path),
        "workload": _workload_args(workload),
        "samples": samples,
    }
    result = run_job("verify", args)
    if result["ok"]:
        progress.done(f"{result['sampled']:,} sampled keys agree, {result['table_rows']:,} rows")
    else:
        progress.done("MISMATCH: " + "; ".join(result["problems"][:3]))
    return result


def run_case(case: str, workload: Workload, workdir: Path, repeat: int, samples: int,
             progress: Progress) -> dict:
    """Engine and naive runs of one case (alternating, `repeat` times), each verified."""
    engine_runs, naive_runs, checks = [], [], []
    label = f"({case}) {workload.label}"
    for attempt in range(repeat):
        engine_path = workdir / f"engine-{case}-{attempt}"
        naive_path = workdir / f"naive-{case}-{attempt}"
        engine_runs.append(_measure("engine", engine_path, workload, progress, label))
        naive_runs.append(_measure("naive", naive_path, workload, progress, label))
        checks.append(_verify(engine_path, naive_path, workload, samples, progress))
        shutil.rmtree(engine_path, ignore_errors=True)
        shutil.rmtree(naive_path, ignore_errors=True)
    engine_rate = statistics.median(r["rows_per_s"] for r in engine_runs)
    naive_rate = statistics.median(r["rows_per_s"] for r in naive_runs)
    ratio = engine_rate / naive_rate
    return {
        "kind": "throughput",
        "case": case,
        "label": workload.label,
        "rows": workload.rows,
        "keys": workload.distinct_keys,
        "batch": workload.batch,
        "repeat": repeat,
        "engine_rows_per_s": engine_rate,
        "naive_rows_per_s": naive_rate,
        "ratio": ratio,
        "target": TARGETS[case],
        "met": ratio >= TARGETS[case],
        "verified": all(c["ok"] for c in checks),
        "sampled": checks[-1]["sampled"],
        "problems": [p for c in checks for p in c["problems"]][:10],
        "engine_peak_rss_mb": max(r["peak_rss_mb"] for r in engine_runs),
        "naive_peak_rss_mb": max(r["peak_rss_mb"] for r in naive_runs),
        "engine_runs": [round(r["rows_per_s"]) for r in engine_runs],
        "naive_runs": [round(r["rows_per_s"]) for r in naive_runs],
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
    steps = 2 * repeat * 3 + (len(rss_scales) + 1 if rss_scales else 0)
    progress = progress or Progress(steps)
    base = Path(tempfile.mkdtemp(prefix="tally-bench-", dir=workdir))
    try:
        results = []
        for case, workload in cases(rows, keys, batch, seed):
            results.append(run_case(case, workload, base, repeat, samples, progress))
        if rss_scales:
            unique = next(r for r in results if r["case"] == "b")
            results.append(run_rss(unique, cases(rows, keys, batch, seed)[1][1], tuple(rss_scales),
                                   base, progress))
        return results
    finally:
        shutil.rmtree(base, ignore_errors=True)


# --- text rendering ---------------------------------------------------------------------------

HEADERS = ["case", "engine rows/s", "naive rows/s", "ratio", "target", "verified",
           "engine peak RSS", "naive peak RSS"]


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
            f"{r['naive_rows_per_s']:,.0f}",
            f"{r['ratio']:.2f}x",
            f">= {r['target']:g}x {'met' if r['met'] else 'MISSED'}",
            verified,
            f"{r['engine_peak_rss_mb']:,.0f} MB",
            f"{r['naive_peak_rss_mb']:,.0f} MB",
        ])
    return rows


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
    rows = [HEADERS] + table_rows(results)
    widths = [max(len(row[i]) for row in rows) for i in range(len(HEADERS))]
    lines = []
    for n, row in enumerate(rows):
        cells = [row[0].ljust(widths[0])] + [c.rjust(w) for c, w in zip(row[1:], widths[1:])]
        lines.append("  ".join(cells))
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    rss = rss_line(results)
    if rss:
        lines.append(rss)
    lines.extend("verification problem: " + p for p in problems(results))
    return "\n".join(lines)

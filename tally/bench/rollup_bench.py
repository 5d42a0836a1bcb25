"""Rollup benchmark: one write of events feeding three rollups, Tally against ClickHouse.

The workload (tally.bench.events): click events in time order, written into a source table
and rolled up per minute x product, per hour x region and per day (count, sums, min, max).
  - Tally (tally.bench.rollup_engine): a KvTablet for the events and one per rollup, each
    batch projected by the rollup's `RollupSpec` and put into its tablet;
  - ClickHouse (tally.bench.rollup_clickhouse, chdb in process): a MergeTree for the events
    and three materialized views into AggregatingMergeTree tables.
Both are timed from the first write until every rollup is readable: all writes returned and a
read of each rollup's rows. Each side runs in a fresh process, alternating, `repeat` rounds;
each side's median counts (target: Tally >= 1.5x ClickHouse). After every round both sides'
rollups are compared with one pyarrow group-by of the whole input (tally.bench.events) on
sampled keys of each rollup, and their row counts with the reference's.
"""

from __future__ import annotations

import shutil
import statistics
import tempfile
from pathlib import Path

from tally.bench import proc
from tally.bench.events import ROLLUPS, EventWorkload, reference, sample_keys
from tally.bench.progress import Progress

TARGET = 1.5  # Tally / ClickHouse, events per second until every rollup is readable
SIDES = ("engine", "clickhouse")
NAMES = {"engine": "Tally", "clickhouse": "ClickHouse"}
MODULES = {"engine": "tally.bench.rollup_engine", "clickhouse": "tally.bench.rollup_clickhouse"}


def run_job(job: str, args: dict, progress=None) -> dict:
    """A measurement process's work (tally.bench.worker runs `rollup_*` jobs here)."""
    import importlib

    workload = EventWorkload(**args["events"])
    if job == "rollup_verify":
        return verify(args["paths"], workload, args["samples"])
    side = job[len("rollup_"):]
    if side not in MODULES:
        raise SystemExit(f"unknown bench job {job!r}")
    return importlib.import_module(MODULES[side]).ingest(args["path"], workload, progress)


def compare(expected: dict[tuple, dict], got: dict[tuple, dict], keys: list[tuple],
            side: str, rollup: str) -> list[str]:
    """A message per sampled key whose row differs from the reference (empty when all agree)."""
    problems = []
    for key in keys:
        if got.get(key) != expected[key]:
            problems.append(f"{side} {rollup} {key}: {got.get(key)!r}, expected {expected[key]!r}")
    if len(got) != len(expected):
        problems.append(f"{side} {rollup} holds {len(got):,} rows, the reference {len(expected):,}")
    return problems


def verify(paths: dict[str, str], workload: EventWorkload, samples: int) -> dict:
    """Every side's rollups against the reference on `samples` keys of each rollup."""
    import importlib

    expected = reference(workload)
    problems: list[str] = []
    sampled = 0
    for side, path in paths.items():
        module = importlib.import_module(MODULES[side])
        got = module.read_rollups(path)
        for rollup in ROLLUPS:
            keys = sample_keys(list(expected[rollup.name]), samples, workload.seed)
            if side == SIDES[0]:
                sampled += len(keys)
            problems += compare(expected[rollup.name], got[rollup.name], keys, side, rollup.name)
        count = module.source_rows(path)
        if count != workload.rows:
            problems.append(f"{side} events table holds {count:,} rows, {workload.rows:,} written")
    return {"ok": not problems, "problems": problems[:10], "sampled": sampled,
            "rollup_rows": {r.name: len(expected[r.name]) for r in ROLLUPS}}


def _measure(side: str, path: Path, workload: EventWorkload, progress: Progress) -> dict:
    progress.step(f"rollups: {NAMES[side]}, {workload.label}")
    result = proc.run_job(f"rollup_{side}", {"path": str(path), "events": workload.args()},
                          on_progress=lambda done: progress.rows(done, workload.rows))
    result["rows_per_s"] = result["rows"] / result["seconds"]
    progress.done(f"{result['rows_per_s']:,.0f} events/s until every rollup is readable "
                  f"(writes {result['write_seconds']:.2f} s, reads {result['read_seconds']:.2f} s)")
    return result


def run(rows: int = 1_000_000, batch: int = 100_000, seed: int = 42, repeat: int = 3,
        samples: int = 1000, workdir: str | None = None,
        progress: Progress | None = None) -> dict:
    """Run the rollup benchmark; one dict of results (see format_text)."""
    from tally.bench import clickhouse_peer

    progress = progress or Progress(repeat * (len(SIDES) + 1))
    version = clickhouse_peer.ensure_installed()  # before any measurement, never during one
    workload = EventWorkload(rows=rows, batch=batch, seed=seed)
    base = Path(tempfile.mkdtemp(prefix="tally-bench-rollups-", dir=workdir))
    runs: dict[str, list[dict]] = {side: [] for side in SIDES}
    checks = []
    try:
        for attempt in range(repeat):
            # alternate which side goes first, so a slow spell of the machine hits both
            order = SIDES if attempt % 2 == 0 else SIDES[::-1]
            paths = {side: base / f"{side}-{attempt}" for side in SIDES}
            for side in order:
                runs[side].append(_measure(side, paths[side], workload, progress))
            progress.step("rollups: verify both sides against the reference")
            check = proc.run_job("rollup_verify", {"paths": {s: str(p) for s, p in paths.items()},
                                                   "events": workload.args(), "samples": samples})
            progress.done("MISMATCH " + " | ".join(check["problems"][:3]) if not check["ok"]
                          else f"{check['sampled']:,} sampled rollup keys agree on both sides")
            checks.append(check)
            for path in paths.values():
                shutil.rmtree(path, ignore_errors=True)
    finally:
        shutil.rmtree(base, ignore_errors=True)

    def median(side: str, key: str) -> float:
        return statistics.median(r[key] for r in runs[side])

    rate = {side: median(side, "rows_per_s") for side in SIDES}
    ratio = rate["engine"] / rate["clickhouse"]
    return {
        "benchmark": "rollups",
        "workload": workload.label,
        "rows": rows,
        "batch": batch,
        "repeat": repeat,
        "rollups": [{"name": r.name, "keys": list(r.keys), "columns": dict(r.columns),
                     "rows": checks[-1]["rollup_rows"][r.name]} for r in ROLLUPS],
        "sides": {side: {"rows_per_s": rate[side],
                         "write_seconds": median(side, "write_seconds"),
                         "read_seconds": median(side, "read_seconds"),
                         "seconds": median(side, "seconds"),
                         "cpu_rows_per_s": statistics.median(
                             r["rows"] / max(r["cpu_seconds"], 1e-9) for r in runs[side]),
                         "runs": [round(r["rows_per_s"]) for r in runs[side]]}
                  for side in SIDES},
        "ratio": ratio,
        "target": TARGET,
        "met": ratio >= TARGET,
        "verified": all(c["ok"] for c in checks),
        "sampled": checks[-1]["sampled"],
        "problems": [p for c in checks for p in c["problems"]][:10],
        "clickhouse_version": version,
    }


# --- text rendering ---------------------------------------------------------------------------

HEADERS = ["side", "events/s", "writes s", "reads s", "every run's events/s", "verified"]


def table_rows(result: dict) -> list[list[str]]:
    verified = f"{result['sampled']:,} keys ok" if result["verified"] else "MISMATCH"
    return [[NAMES[side], f"{s['rows_per_s']:,.0f}", f"{s['write_seconds']:.2f}",
             f"{s['read_seconds']:.2f}", " / ".join(f"{r:,}" for r in s["runs"]), verified]
            for side, s in result["sides"].items()]


def rollup_lines(result: dict) -> list[str]:
    return [f"{r['name']}: key {', '.join(r['keys'])}; "
            + ", ".join(f"{name} = {expr}" for name, expr in r["columns"].items())
            + f" ({r['rows']:,} rows)" for r in result["rollups"]]


def ratio_line(result: dict) -> str:
    sides = result["sides"]
    cpu = sides["engine"]["cpu_rows_per_s"] / sides["clickhouse"]["cpu_rows_per_s"]
    return (f"Tally / ClickHouse: {result['ratio']:.2f}x (target >= {result['target']:g}x: "
            f"{'met' if result['met'] else 'MISSED'}); by events per second of process CPU "
            f"time {cpu:.2f}x; {result['clickhouse_version']}; median of {result['repeat']} "
            "alternating runs")


def format_text(result: dict) -> str:
    from tabulate import tabulate

    lines = [f"{result['workload']}, batches of {result['batch']:,}; rollups:"]
    lines += ["  " + line for line in rollup_lines(result)]
    align = ["left"] + ["right"] * (len(HEADERS) - 1)
    lines.append(tabulate(table_rows(result), HEADERS, colalign=align, disable_numparse=True))
    lines.append(ratio_line(result))
    lines.extend("verification problem: " + p for p in result["problems"])
    return "\n".join(lines)

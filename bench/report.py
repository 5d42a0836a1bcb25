"""Render benchmark results (the list of dicts bench.ingest.run returns) as text or markdown."""

from __future__ import annotations

import os
import platform

HEADERS = ["case", "engine rows/s", "naive rows/s", "ratio", "target", "verified",
           "engine peak RSS", "naive peak RSS"]


def _rows(results: list[dict]) -> list[list[str]]:
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


def _rss_line(results: list[dict]) -> str | None:
    for r in results:
        if r["kind"] == "rss":
            small, large = r["sizes"]
            return (
                f"engine peak RSS by table size: {small['table_rows']:,} keys {small['peak_rss_mb']:,.0f} MB, "
                f"{large['table_rows']:,} keys {large['peak_rss_mb']:,.0f} MB ({r['growth']:+.0%}); "
                f"baseline before any put {r['baseline_mb']:,.0f} MB; "
                f"put at the larger size: {large['rows_per_s']:,.0f} rows/s"
            )
    return None


def _problems(results: list[dict]) -> list[str]:
    return [f"({r['case']}) {p}" for r in results if r["kind"] == "throughput" for p in r["problems"]]


def format_text(results: list[dict]) -> str:
    rows = [HEADERS] + _rows(results)
    widths = [max(len(row[i]) for row in rows) for i in range(len(HEADERS))]
    lines = []
    for n, row in enumerate(rows):
        cells = [row[0].ljust(widths[0])] + [c.rjust(w) for c, w in zip(row[1:], widths[1:])]
        lines.append("  ".join(cells))
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    rss = _rss_line(results)
    if rss:
        lines.append(rss)
    lines.extend("verification problem: " + p for p in _problems(results))
    return "\n".join(lines)


def format_markdown(results: list[dict], command: str = "tally bench") -> str:
    lines = [
        "# Tally ingest benchmark",
        "",
        f"Command: `{command}` on {platform.machine()} ({os.cpu_count()} cores), Python {platform.python_version()}.",
        "KvTablet.put of Arrow batches against a naive per-row rocksdict read-modify-write loop "
        "(get, unpickle, merge, pickle, put) on the same data, each run in a fresh process; "
        "rows/s count only the writes.",
        "",
        "| " + " | ".join(HEADERS) + " |",
        "|---|" + "---:|" * (len(HEADERS) - 1),
    ]
    lines.extend("| " + " | ".join(row) + " |" for row in _rows(results))
    rss = _rss_line(results)
    if rss:
        lines += ["", rss[0].upper() + rss[1:] + "."]
    problems = _problems(results)
    if problems:
        lines += ["", "Verification problems:", ""] + [f"- {p}" for p in problems]
    return "\n".join(lines) + "\n"

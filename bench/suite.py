"""The benchmarks `tally bench` knows, run in order, printed and optionally written as markdown."""

from __future__ import annotations

import sys
from pathlib import Path

BENCHMARKS = ("ingest",)


def run_suite(only: list[str] | None = None, rows: int = 1_000_000, keys: int = 100_000,
              batch: int = 100_000, repeat: int = 1, seed: int = 42, report: str | None = None,
              command: str = "tally bench") -> int:
    """Run the chosen benchmarks; print a table; return 0, or 1 when a verification failed.

    A missed throughput target is printed, not an error: numbers vary between machines, and a
    wrong result is what must fail.
    """
    from bench import ingest
    from bench.report import format_markdown, format_text

    results: list[dict] = []
    for name in only or BENCHMARKS:
        if name == "ingest":
            print(f"ingest benchmark: {rows:,} rows, {keys:,} keys for (a), batches of {batch:,}, "
                  f"{repeat} run(s) per side", flush=True)
            results += ingest.run(rows=rows, keys=keys, batch=batch, seed=seed, repeat=repeat)
    print()
    print(format_text(results))
    if report:
        Path(report).write_text(format_markdown(results, command))
        print(f"\nreport written to {report}")
    failed = [r for r in results if r["kind"] == "throughput" and not r["verified"]]
    if failed:
        print("verification FAILED: the engine and the naive loop disagree", file=sys.stderr)
        return 1
    return 0

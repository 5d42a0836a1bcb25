"""The benchmarks `tally bench` knows, run in order, printed and optionally written as markdown."""

from __future__ import annotations

import sys
from pathlib import Path

BENCHMARKS = ("ingest", "cluster", "undo")


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
    cluster_texts: list[str] = []
    cluster_ok = True
    for name in only or BENCHMARKS:
        if name == "ingest":
            print(f"ingest benchmark: {rows:,} rows, {keys:,} keys for (a), batches of {batch:,}, "
                  f"{repeat} run(s) per side", flush=True)
            results += ingest.run(rows=rows, keys=keys, batch=batch, seed=seed, repeat=repeat)
        elif name == "cluster":  # issue 3: the client against a LocalCluster (bench/cluster.py)
            from bench import cluster

            print(f"cluster benchmark: {rows:,} rows over {keys:,} keys through the client",
                  flush=True)
            outcome = cluster.run(rows=rows, keys=keys, batch=batch, seed=seed)
            cluster_texts.append(cluster.format_text(outcome))
            cluster_ok = cluster_ok and outcome["ok"]
        elif name == "undo":  # issue 5: undo time vs write time, by batch and table size
            from bench import undo

            print("undo benchmark: a batch written then undone, 1M and 4M-row tables", flush=True)
            outcome = undo.run()
            cluster_texts.append(undo.format_text(outcome))
            cluster_ok = cluster_ok and all(r["verified"] for r in outcome)
    print()
    if results:
        print(format_text(results))
    for text in cluster_texts:
        print("\n" + text)
    if report:
        markdown = format_markdown(results, command) if results else f"# `{command}`\n"
        markdown += "".join(f"\n```\n{text}\n```\n" for text in cluster_texts)
        Path(report).write_text(markdown)
        print(f"\nreport written to {report}")
    if not cluster_ok:
        print("verification FAILED: the cluster and the in-process tablet disagree",
              file=sys.stderr)
        return 1
    failed = [r for r in results if r["kind"] == "throughput" and not r["verified"]]
    if failed:
        print("verification FAILED: the engine and the naive loop disagree", file=sys.stderr)
        return 1
    return 0

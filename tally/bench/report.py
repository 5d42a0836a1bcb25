"""The benchmark report: one markdown document with every benchmark's tables and plots.

`write(path, outcomes, command)` writes `path` (e.g. docs/benchmarks.md) and the PNG plots
into the directory beside it named after it (docs/benchmarks/*.png), linked relatively, so the
report renders on GitHub and in any markdown viewer. A benchmark that failed to run gets its
error in the report instead of numbers; the others are still written.
"""

from __future__ import annotations

import os
import platform
import time
from pathlib import Path


def machine_line(command: str, load: tuple[float, float]) -> str:
    return (f"Measured by `{command}` on {time.strftime('%Y-%m-%d', time.gmtime())}: "
            f"{platform.machine()}, {os.cpu_count()} cores, Python "
            f"{platform.python_version()}, {platform.system()}; load average "
            f"{load[0]:.1f} at the start and {load[1]:.1f} at the end (other work on the machine "
            "slows every side alike, but not always by the same factor).")


def write(path: str | Path, outcomes: list, command: str, load: tuple[float, float]) -> list[Path]:
    """Write the report and its plots; returns every file written. `outcomes` are
    tally.bench.suite.Outcome values (benchmark, result, seconds, error)."""
    path = Path(path)
    images = path.parent / path.stem
    images.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    lines = ["# Tally benchmarks", "", machine_line(command, load), "",
             "Every benchmark verifies what it measured (the *verified* columns) and reports a "
             "missed target rather than hiding it. Re-run the command to measure your machine.",
             ""]
    lines += [f"- [{o.benchmark.title}](#{_anchor(o.benchmark.title)})" for o in outcomes]
    for outcome in outcomes:
        bench = outcome.benchmark
        lines += ["", f"## {bench.title}", "", bench.about, ""]
        if outcome.error is not None:
            lines += [f"**Not measured**: the benchmark failed: `{outcome.error}`"]
            continue
        lines += [bench.markdown(outcome.result), ""]
        for png in bench.chart(outcome.result, images):
            written.append(png)
            lines.append(f"![{bench.title}]({images.name}/{png.name})")
        lines += ["", f"<sub>{outcome.seconds:.0f} s, `tally bench --only {bench.name}`</sub>"]
    path.write_text("\n".join(lines) + "\n")
    return [path] + written


def _anchor(title: str) -> str:
    """GitHub's heading anchor: lower case, spaces to '-', punctuation dropped."""
    kept = "".join(c for c in title.lower() if c.isalnum() or c in " -")
    return kept.replace(" ", "-")

"""The benchmark report: one markdown document with every benchmark's tables and plots.

`write(path, outcomes, command)` writes `path` (e.g. docs/benchmarks.md) and the PNG plots
into the directory beside it named after it (docs/benchmarks/*.png), linked relatively, so the
report renders on GitHub and in any markdown viewer. A benchmark that failed to run gets its
error in the report instead of numbers; the others are still written. A run of some of the
benchmarks updates their sections and keeps the others.

Profiles (where the time goes, before and after a change) are measured by hand with cProfile,
py-spy or Spark's event log, not by a benchmark run: they are kept in `profiles.md` in the
plots' directory and carried into the report as its last section, so the numbers and the
reasons behind them stay on one page.
"""

from __future__ import annotations

import os
import platform
import time
from pathlib import Path

PROFILES = "profiles.md"
PROFILES_TITLE = "Profiles: where the time goes, before and after"


def machine_line(command: str, load: tuple[float, float]) -> str:
    return (f"Last measured by `{command}` on {time.strftime('%Y-%m-%d', time.gmtime())}: "
            f"{platform.machine()}, {os.cpu_count()} cores, Python "
            f"{platform.python_version()}, {platform.system()}; load average "
            f"{load[0]:.1f} at the start and {load[1]:.1f} at the end (other work on the machine "
            "slows every side alike, but not always by the same factor). Each section's last line "
            "says which run measured it.")


def write(path: str | Path, outcomes: list, command: str, load: tuple[float, float],
          titles: list[str] | None = None) -> list[Path]:
    """Write the report and its plots; returns every file written. `outcomes` are
    tally.bench.suite.Outcome values (benchmark, result, seconds, error); `titles` every
    benchmark's title in the suite's order. A benchmark not run this time keeps its section
    from the report already at `path` (so `--only X --report` re-measures X alone), each section
    saying when it was measured."""
    path = Path(path)
    images = path.parent / path.stem
    images.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    sections = _sections(path.read_text()) if path.exists() else {}
    when = time.strftime("%Y-%m-%d", time.gmtime())
    for outcome in outcomes:
        bench = outcome.benchmark
        lines = [bench.about, ""]
        if outcome.error is not None:
            lines += [f"**Not measured**: the benchmark failed: `{outcome.error}`"]
        else:
            lines += [bench.markdown(outcome.result), ""]
            for png in bench.chart(outcome.result, images):
                written.append(png)
                lines.append(f"![{bench.title}]({images.name}/{png.name})")
        lines += ["", f"<sub>{outcome.seconds:.0f} s, `tally bench --only {bench.name}`, "
                      f"{when}, load average {load[0]:.1f} to {load[1]:.1f}</sub>"]
        sections[bench.title] = "\n".join(lines)
    order = [t for t in (titles or []) if t in sections]
    order += [o.benchmark.title for o in outcomes if o.benchmark.title not in order]
    profiles = images / PROFILES
    if profiles.exists():
        sections[PROFILES_TITLE] = profiles.read_text().strip()
        order.append(PROFILES_TITLE)
    lines = ["# Tally benchmarks", "", machine_line(command, load), "",
             "Every benchmark verifies what it measured (the *verified* columns) and reports a "
             "missed target rather than hiding it. Re-run the command to measure your machine.",
             ""]
    lines += [f"- [{title}](#{_anchor(title)})" for title in order]
    for title in order:
        lines += ["", f"## {title}", "", sections[title].strip()]
    path.write_text("\n".join(lines) + "\n")
    return [path] + written


def _sections(text: str) -> dict[str, str]:
    """The report's sections by title (the text under each `## ` heading)."""
    sections: dict[str, str] = {}
    title = None
    for line in text.splitlines():
        if line.startswith("## "):
            title = line[3:].strip()
            sections[title] = ""
        elif title is not None:
            sections[title] += line + "\n"
    return sections


def _anchor(title: str) -> str:
    """GitHub's heading anchor: lower case, spaces to '-', punctuation dropped."""
    kept = "".join(c for c in title.lower() if c.isalnum() or c in " -")
    return kept.replace(" ", "-")

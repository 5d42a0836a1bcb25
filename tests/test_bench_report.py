"""`tally bench --report` end to end on tiny sizes: every local benchmark runs, verifies, and
lands in one markdown report with its PNG plot beside it.

The Spark benchmark is left out here (it starts a JVM and PostgreSQL); its renderers run on
the full `tally bench` only. Timings are never asserted: only that the report is complete.
"""

from __future__ import annotations

import io

from tally.bench.suite import BENCHMARKS, Sizes, run_suite
from tally.cli.main import build_parser

TINY = Sizes(rows=3_000, keys=500, batch=1_000, lookups=50, undo_tables=(2_000, 4_000),
             undo_batches=(20, 200), repeat=1)
LOCAL = ["ingest", "rollups", "cluster", "undo"]


def test_report_has_every_local_benchmark_with_its_plot(tmp_path):
    out = io.StringIO()
    report = tmp_path / "benchmarks.md"
    assert run_suite(only=LOCAL, sizes=TINY, report=str(report), command="tally bench (test)",
                     stream=out) == 0
    text = report.read_text()
    assert text.startswith("# Tally benchmarks\n") and "tally bench (test)" in text
    for bench in BENCHMARKS:
        if bench.name not in LOCAL:
            continue
        assert f"## {bench.title}" in text
        assert f"![{bench.title}](benchmarks/{bench.name}.png)" in text
        png = tmp_path / "benchmarks" / f"{bench.name}.png"
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "MISMATCH" not in text and "NO |" not in text and "Not measured" not in text
    ingest_header = next(row for row in _markdown_rows(text) if row[0] == "case")
    assert ingest_header[6:9] == ["ClickHouse insert rows/s", "engine / ClickHouse",
                                  "ClickHouse merged rows/s"]
    rollup_rows = {row[0]: row for row in _markdown_rows(text) if row[0] in ("Tally", "ClickHouse")}
    assert set(rollup_rows) == {"Tally", "ClickHouse"}
    assert all(row[-1].endswith("keys ok") for row in rollup_rows.values())
    assert "Tally / ClickHouse: " in text and "(target >= 1.5x: " in text
    printed = out.getvalue()
    assert "[1/4]" in printed and "undo/write" in printed and "report written to" in printed


def test_the_command_line_knows_every_benchmark():
    args = build_parser().parse_args(["bench", "--only", "spark", "--only", "undo", "--rows",
                                      "200_000", "--report", "out.md"])
    assert args.only == ["spark", "undo"] and args.rows == 200_000 and args.report == "out.md"
    sizes = Sizes.scaled(rows=args.rows)
    assert sizes.undo_tables == (200_000, 800_000) and sizes.undo_batches == (200, 2_000, 20_000)
    assert sizes.spark_rows == 160_000


def test_a_partial_run_keeps_the_other_sections_and_the_profiles(tmp_path):
    report = tmp_path / "benchmarks.md"
    (tmp_path / "benchmarks").mkdir()
    (tmp_path / "benchmarks" / "profiles.md").write_text("### put\n\nprofile lines\n")
    titles = {b.name: b.title for b in BENCHMARKS}
    assert run_suite(only=["ingest", "undo"], sizes=TINY, report=str(report),
                     command="tally bench (first)", stream=io.StringIO()) == 0
    first = report.read_text()
    ingest = first[first.index(f"## {titles['ingest']}"):first.index(f"## {titles['undo']}")]
    assert run_suite(only=["undo"], sizes=TINY, report=str(report),
                     command="tally bench (second)", stream=io.StringIO()) == 0
    text = report.read_text()
    assert "tally bench (second)" in text and "tally bench (first)" not in text
    assert ingest in text  # kept as it was, before the re-measured section
    assert text.index(f"## {titles['ingest']}") < text.index(f"## {titles['undo']}") \
        < text.index("## Profiles")
    assert text.count(f"## {titles['undo']}") == 1 and "profile lines" in text


def test_the_spark_renderers_show_every_leg_the_latency_and_the_targets(tmp_path):
    """The Spark benchmark's text, markdown and plot from a result of its shape (running it
    needs a JVM and PostgreSQL; its numbers here are made up and never checked)."""
    from tally.bench import charts, markdown, spark

    legs = [{"system": name, "seconds": s, "round_seconds": [s, s], "verified": True,
             "rows": 8_000, "rows_per_s": 8_000 / s}
            for name, s in [("tally", 1.0), ("postgresql", 3.0), ("pypaimon", 6.0),
                            ("no-op shape", 0.8)]]
    latency = {"batches": 10, "rows_per_batch": 1_000, "rounds": 2, "skipped": 3,
               "legs": {"tally": {"count": 14, "median_ms": 150.0, "p90_ms": 180.0,
                                  "millis": [150.0] * 14},
                        "no-op foreachBatch": {"count": 14, "median_ms": 120.0, "p90_ms": 130.0,
                                               "millis": [120.0] * 14}},
               "ratio": 1.25, "target_ratio": 1.5, "visible": True}
    result = {"benchmark": "spark", "rows": 8_000, "keys": 100, "micro_batches": 4, "rounds": 2,
              "legs": legs, "tally_over": {"postgresql": 3.0, "pypaimon": 6.0},
              "tally_share_of_noop": 0.8, "targets": dict(spark.TARGETS), "latency": latency,
              "ok": True}
    text = spark.format_text(result)
    assert "no-op shape" in text and "no-op foreachBatch" in text and "1.25x" in text
    page = markdown.spark(result)
    assert "Tally / postgresql >= 2.5x: 3.00x, met" in page
    assert "Tally / pypaimon >= 5x: 6.00x, met" in page
    assert ["tally", "150", "180", "14"] in _markdown_rows(page)
    assert "within 1.5x a no-op foreachBatch: 1.25x, met" in page
    png = charts.spark(result, tmp_path)[0]
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def _markdown_rows(page: str) -> list[list[str]]:
    """The cells of every markdown table row on `page`, stripped of their padding."""
    return [[cell.strip() for cell in line.strip().strip("|").split("|")]
            for line in page.splitlines() if line.startswith("|")]

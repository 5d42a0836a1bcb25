"""The ingest benchmark end to end on tiny sizes: it runs, and the engine's, the floor's,
DuckDB's and ClickHouse's tables agree with the naive loop's; the rollup benchmark's two sides
agree with a group-by of the whole input.

ClickHouse is chdb (the `test` extra lists it): without it these tests skip, saying so.

Timings are never asserted here (they depend on the machine); only correctness and the shape
of the results that `tally bench --report` renders.
"""

from __future__ import annotations

import pyarrow as pa
import pytest

from tally.bench import events, ingest
from tally.bench import rollup_bench as rollups
from tally.bench.markdown import ingest as ingest_markdown
from tally.bench.progress import Progress
from tally.bench.workload import Workload


def test_workload_is_deterministic_and_shaped():
    workload = Workload(rows=2_500, keys=300, batch=1_000, seed=3)
    first = [b.to_pydict() for b in workload.batches()]
    again = [b.to_pydict() for b in workload.batches()]
    assert first == again
    assert [len(b["id"]) for b in first] == [1_000, 1_000, 500]
    assert len({i for b in first for i in b["id"]}) <= 300
    unique = Workload(rows=2_500, keys=None, batch=1_000, seed=3)
    ids = [i for b in unique.batches() for i in b.column("id").to_pylist()]
    assert len(set(ids)) == 2_500


def _needs_chdb():
    from tally.bench import clickhouse_peer

    if not clickhouse_peer.available():
        pytest.skip("chdb (in-process ClickHouse, the ClickHouse side) is not installed")


def test_ingest_bench_small_run_verifies(tmp_path):
    _needs_chdb()
    results = ingest.run(rows=20_000, keys=2_000, batch=5_000, samples=300, rss_scales=(2, 4),
                         workdir=str(tmp_path), progress=Progress(13, stream=None))
    throughput = [r for r in results if r["kind"] == "throughput"]
    assert [r["case"] for r in throughput] == ["a", "b"]
    for r in throughput:
        assert r["verified"], r["problems"]
        assert r["sampled"] == 300
        for side in ("engine", "floor", "duckdb", "clickhouse", "naive"):
            assert r[f"{side}_rows_per_s"] > 0 and len(r[f"{side}_runs"]) == 1
        assert r["floor_share"] > 0 and r["duckdb_ratio"] > 0 and r["clickhouse_ratio"] > 0
        assert 0 < r["clickhouse_merged_rows_per_s"] and r["clickhouse_target"] == 1.5
        assert r["engine_peak_rss_mb"] > 0
    assert throughput[1]["keys"] == 20_000
    rss = next(r for r in results if r["kind"] == "rss")
    assert [s["table_rows"] for s in rss["sizes"]] == [20_000, 40_000, 80_000]
    assert 0 < rss["baseline_mb"] <= rss["sizes"][0]["peak_rss_mb"]
    text = ingest.format_text(results)
    assert "(a) 20,000 rows over 2,000 keys" in text and "peak RSS" in text
    assert "DuckDB 2." in text and "chdb 4." in text
    header = ingest_markdown(results).splitlines()[0]
    cells = [cell.strip() for cell in header.strip("|").split("|")]
    assert cells[:3] == ["case", "engine rows/s", "floor rows/s"]
    assert "ClickHouse insert rows/s" in cells and "engine / ClickHouse" in cells
    assert list(tmp_path.iterdir()) == []  # the bench cleans up its data directories


def test_events_are_deterministic_in_time_order_and_unique():
    workload = events.EventWorkload(rows=2_500, batch=1_000, seed=5)
    first = [b.to_pydict() for b in workload.batches()]
    assert first == [b.to_pydict() for b in workload.batches()]
    ids = [i for b in first for i in b["event_id"]]
    assert len(set(ids)) == 2_500
    ts = [t for b in first for t in b["ts"]]
    # in time order up to the jitter of a minute, spread over the whole span
    assert all((b - a).total_seconds() > -60 for a, b in zip(ts, ts[1:]))
    assert (ts[-1] - ts[0]).total_seconds() > (workload.hours - 1) * 3600


def test_rollup_bench_small_run_verifies_both_sides(tmp_path):
    _needs_chdb()
    result = rollups.run(rows=20_000, batch=5_000, repeat=1, samples=200, workdir=str(tmp_path),
                         progress=Progress(3, stream=None))
    assert result["verified"], result["problems"]
    counts = {r["name"]: r["rows"] for r in result["rollups"]}
    assert counts["by_day"] == 2 and counts["by_hour_region"] == 48 * 10
    assert result["sampled"] == 200 + 200 + 2
    for side in ("engine", "clickhouse"):
        s = result["sides"][side]
        assert s["rows_per_s"] > 0 and len(s["runs"]) == 1
        assert s["seconds"] >= s["write_seconds"] > 0
    assert result["ratio"] > 0 and result["target"] == 1.5
    text = rollups.format_text(result)
    assert "by_minute_product: key date_trunc('minute', ts) AS minute, product" in text
    assert "Tally / ClickHouse" in text and "MISMATCH" not in text
    assert list(tmp_path.iterdir()) == []


def test_rollup_check_finds_a_wrong_row_and_a_lost_one():
    workload = events.EventWorkload(rows=3_000, batch=1_000)
    expected = events.reference(workload)["by_hour_region"]
    keys = sorted(expected)
    wrong = {k: dict(v) for k, v in expected.items()}
    wrong[keys[3]]["clicks"] += 1
    del wrong[keys[5]]
    problems = rollups.compare(expected, wrong, keys, "engine", "by_hour_region")
    assert len(problems) == 3 and str(keys[3]) in problems[0]
    assert f"holds {len(keys) - 1:,} rows, the reference {len(keys):,}" in problems[2]
    assert rollups.compare(expected, expected, keys, "engine", "by_hour_region") == []


def test_the_rollup_sides_use_the_engines_rollup_definitions():
    """The Tally side projects through RollupSpec; the ClickHouse views spell the same keys."""
    from tally.bench import rollup_clickhouse, rollup_engine

    specs = rollup_engine.specs()
    assert [s.name for s in specs] == [f"bench.{r.name}" for r in events.ROLLUPS]
    batch = events.EventWorkload(rows=100, batch=100).make_batch(0)
    projected = specs[1].project(pa.Table.from_batches([batch]))
    assert projected.column_names == ["hour", "region", "events", "clicks", "amount",
                                      "max_amount"]
    statements = rollup_clickhouse.create_statements(events.ROLLUPS[1])
    view = statements[1]
    assert "toStartOfHour(e.ts) AS hour" in view and "GROUP BY hour, region" in view

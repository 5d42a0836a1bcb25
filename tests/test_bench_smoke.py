"""The ingest benchmark end to end on tiny sizes: it runs, and the engine's, the floor's and
DuckDB's tables agree with the naive loop's.

Timings are never asserted here (they depend on the machine); only correctness and the shape
of the results that `tally bench --report` renders.
"""

from __future__ import annotations

from tally.bench import ingest
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


def test_ingest_bench_small_run_verifies(tmp_path):
    results = ingest.run(rows=20_000, keys=2_000, batch=5_000, samples=300, rss_scales=(2, 4),
                         workdir=str(tmp_path), progress=Progress(13, stream=None))
    throughput = [r for r in results if r["kind"] == "throughput"]
    assert [r["case"] for r in throughput] == ["a", "b"]
    for r in throughput:
        assert r["verified"], r["problems"]
        assert r["sampled"] == 300
        for side in ("engine", "floor", "duckdb", "naive"):
            assert r[f"{side}_rows_per_s"] > 0 and len(r[f"{side}_runs"]) == 1
        assert r["floor_share"] > 0 and r["duckdb_ratio"] > 0
        assert r["engine_peak_rss_mb"] > 0
    assert throughput[1]["keys"] == 20_000
    rss = next(r for r in results if r["kind"] == "rss")
    assert [s["table_rows"] for s in rss["sizes"]] == [20_000, 40_000, 80_000]
    assert 0 < rss["baseline_mb"] <= rss["sizes"][0]["peak_rss_mb"]
    text = ingest.format_text(results)
    assert "(a) 20,000 rows over 2,000 keys" in text and "peak RSS" in text
    assert "DuckDB 2." in text
    header = ingest_markdown(results).splitlines()[0]
    assert [cell.strip() for cell in header.strip("|").split("|")][:3] == [
        "case", "engine rows/s", "floor rows/s"]
    assert list(tmp_path.iterdir()) == []  # the bench cleans up its data directories

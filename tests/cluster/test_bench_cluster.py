"""Smoke test of the cluster benchmark (tally.bench.cluster) on a tiny workload."""

from __future__ import annotations

import io

from tally.bench import cluster


def test_cluster_benchmark_runs_and_verifies():
    out = io.StringIO()
    result = cluster.run(rows=3000, keys=500, batch=1000, lookups=50, samples=50, stream=out)
    assert result["ok"] and result["verify"]["mismatches"] == 0
    assert result["cluster"]["rows"] == result["in_process"]["rows"] == 3000
    assert result["lookup"]["p50_ms"] > 0 and result["ratio"] > 0
    text = cluster.format_text(result)
    assert "ratio cluster / in-process" in text and "p99" in text

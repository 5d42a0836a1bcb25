"""`tally bench --only faults`: registered in the suite and the command line, and its text,
markdown and plot render a result of its shape (running it takes minutes and root; the
numbers here are made up and never checked)."""

from __future__ import annotations

from tally.bench import faults
from tally.bench.suite import BENCHMARKS, Sizes
from tally.cli.main import build_parser


def result() -> dict:
    kinds = [{"kind": kind, "trials": 2, "recovery_s": [1.0, 2.0], "unavailable_s": [1.5, 2.5],
              "given_up": 0, "recovery_p50_s": 1.0, "recovery_p99_s": 2.0,
              "unavailable_p50_s": 1.5, "unavailable_p99_s": 2.5} for kind in faults.KINDS]
    side = {"rows_per_s": 100_000.0, "seconds": 1.0, "rounds": [100_000.0]}
    return {"workload": "(a) 1,000 rows over 100 keys", "rf1": side,
            "rf3": {**side, "rows_per_s": 70_000.0}, "ratio": 0.7, "ratio_target": 0.6,
            "rounds": 1, "faults": kinds, "recovery_target_s": 5.0, "trials": 2,
            "verify": {"acknowledged": 10, "ambiguous": 1, "counted": 10, "ok": True}, "ok": True}


def test_faults_is_a_benchmark_with_its_trials_flag():
    assert "faults" in [b.name for b in BENCHMARKS]
    args = build_parser().parse_args(["bench", "--only", "faults", "--fault-trials", "7"])
    assert args.only == ["faults"] and args.fault_trials == 7
    assert Sizes.scaled(fault_trials=args.fault_trials).fault_trials == 7


def test_the_renderers_show_every_fault_and_the_targets(tmp_path):
    text = faults.format_text(result())
    for kind in faults.KINDS:
        assert kind in text
    assert "0.70x (target >= 0.6x)" in text and "10 acknowledged, 1 ambiguous (ok)" in text
    md = faults.markdown(result())
    assert "| kill -9 of a leader" in md and "met" in md and "MISSED" not in md
    [png] = faults.chart(result(), tmp_path)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

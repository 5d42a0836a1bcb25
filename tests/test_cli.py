"""The `tally` command's parsing and its cheap subcommands (bench itself: test_bench_smoke.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import tally
from tally.cli.main import build_parser, main


def test_version_prints_the_package_version(capsys):
    assert main(["version"]) == 0
    assert capsys.readouterr().out.strip() == tally.__version__


def test_version_does_not_import_the_engine():
    # `tally version` must stay instant: no pyarrow, no engine, no bench
    code = ("import sys; from tally.cli.main import main; main(['version']); "
            "print(sorted(m for m in ('pyarrow', 'merge_engine', 'tally.bench') "
            "if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=Path(__file__).resolve().parent.parent)
    assert out.stdout.splitlines()[-1] == "[]"


def test_demo_crashes_restarts_undoes_and_verifies(capsys):
    """The README's main command, end to end: exit 0 only when every row is exact."""
    assert main(["demo"]) == 0
    out = capsys.readouterr().out
    for words in ("single-node", "killed (SIGKILL) inside micro-batch", " undone, ",
                  "every row is exact", "top products"):
        assert words in out


def test_bench_arguments():
    args = build_parser().parse_args(["bench", "--rows", "20_000", "--keys", "2000", "--only", "ingest",
                                      "--report", "r.md"])
    assert (args.rows, args.keys, args.batch, args.only, args.report) == (20_000, 2_000, 100_000, ["ingest"], "r.md")
    with pytest.raises(SystemExit):
        build_parser().parse_args(["bench", "--rows", "0"])
    with pytest.raises(SystemExit):
        build_parser().parse_args(["bench", "--only", "nothing"])

"""The `tally` command's parsing and its cheap subcommands (bench itself: test_bench_smoke.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pyarrow as pa
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


def test_bench_help_names_every_benchmark():
    """`--only`'s help lists the suite's benchmarks, all of them and no others."""
    from tally.bench.suite import NAMES
    from tally.cli.main import BENCHMARK_NAMES

    assert list(BENCHMARK_NAMES) == NAMES
    for name in NAMES:
        assert build_parser().parse_args(["bench", "--only", name]).only == [name]


@pytest.mark.parametrize("arrow_type", [
    pa.bool_(), pa.int8(), pa.int16(), pa.int32(), pa.int64(), pa.uint8(), pa.uint64(),
    pa.float16(), pa.float32(), pa.float64(), pa.string(), pa.large_string(), pa.binary(),
    pa.large_binary(), pa.date32(), pa.date64(), pa.decimal128(18, 2), pa.decimal256(40, 5),
    pa.timestamp("us"), pa.timestamp("ms", tz="UTC"), pa.timestamp("ns", tz="Europe/Paris"),
    pa.time32("ms"), pa.time64("us"), pa.list_(pa.string()), pa.large_list(pa.int64()),
    pa.list_(pa.list_(pa.int32())), pa.binary(16)])
def test_create_reads_every_type_as_describe_prints_it(arrow_type):
    """`tally describe` prints str(type); `tally create` must read it back."""
    from tally.cli.column_types import parse_type

    assert parse_type(str(arrow_type)) == arrow_type


@pytest.mark.parametrize("sql, arrow_type", [
    ("bigint", pa.int64()), ("INT", pa.int32()), ("smallint", pa.int16()),
    ("tinyint", pa.int8()), ("double", pa.float64()), ("float", pa.float32()),
    ("boolean", pa.bool_()), ("date", pa.date32()), ("timestamp", pa.timestamp("us")),
    ("decimal(18,2)", pa.decimal128(18, 2)), ("DECIMAL(10, 0)", pa.decimal128(10, 0)),
    ("array<string>", pa.list_(pa.string())), ("varchar", pa.string())])
def test_create_reads_sql_type_names(sql, arrow_type):
    from tally.cli.column_types import parse_type

    assert parse_type(sql) == arrow_type


@pytest.mark.parametrize("text", ["integerish", "decimal(18)", "decimal(50,2)", "list<>",
                                  "timestamp[hours]", ""])
def test_create_refuses_an_unknown_type_naming_it(text):
    from tally.cli.column_types import parse_type
    from tally.errors import InvalidOptionError

    with pytest.raises(InvalidOptionError, match="column type"):
        parse_type(text)


def test_usage_errors_are_one_line_and_status_2(capsys):
    assert main(["nothing"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("tally: ") and err.count("\n") == 1 and "nothing" in err
    assert main(["bench", "--rows", "0"]) == 2
    assert "must be a positive integer" in capsys.readouterr().err

"""`tally scan` and `tally changelog` stream: rows are printed as batches come, a page at a time
in the table format, batch by batch in CSV and JSON Lines, and no more than a batch and a page
is held (tally.cli.output).

The printer's bounds are checked with a generator of batches that counts what it handed out;
the commands themselves run against a real LocalCluster, as a shell runs them.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pytest

from tally.cli.main import main
from tally.cli.output import emit, emit_arrow, table_pages
from tally.server import LocalCluster
from tests.cluster.cli_fixtures import conn, url  # noqa: F401 (fixtures)

ROOT = Path(__file__).resolve().parent.parent.parent


class CountedBatches:
    """`count` batches of `rows` rows each (a column `k` numbering the rows), counting how
    many were handed out and how many are still referenced (alive)."""

    def __init__(self, count: int, rows: int) -> None:
        self.count, self.rows = count, rows
        self.handed_out = 0

    def __iter__(self):
        for i in range(self.count):
            self.handed_out += 1
            yield pa.record_batch({"k": pa.array(range(i * self.rows, (i + 1) * self.rows),
                                                 pa.int64()),
                                   "name": pa.array([f"n{j}" for j in range(self.rows)])})


class WatchedStream(io.StringIO):
    """A stream noting, at each write, how many batches its source had handed out."""

    def __init__(self, source: CountedBatches) -> None:
        super().__init__()
        self.source = source
        self.writes: list[tuple[int, str]] = []

    def write(self, text: str) -> int:
        if text:
            self.writes.append((self.source.handed_out, text))
        return super().write(text)


def test_a_page_is_handed_out_before_more_batches_are_asked_for():
    source = CountedBatches(count=10, rows=3)
    pages = table_pages(iter(source), page_rows=7)
    first = next(pages)
    # 7 rows need three batches of 3; the page is handed out before the fourth is asked for
    assert source.handed_out == 3
    assert sum(part.num_rows for part in first) == 7
    sizes = [sum(part.num_rows for part in page) for page in pages]
    assert sizes == [7, 7, 7, 2] and source.handed_out == 10
    assert list(table_pages(iter([]), page_rows=7)) == [[]]  # a header for no rows


def test_a_batch_larger_than_a_page_is_printed_page_by_page():
    source = CountedBatches(count=2, rows=25)
    stream = WatchedStream(source)
    assert emit_arrow(pa.schema([("k", pa.int64()), ("name", pa.string())]), source, "table",
                      stream=stream, page_rows=10) == 50
    out = stream.getvalue()
    assert out.count("━╇━") == 5 and out.count("│") == 50  # five pages of ten rows
    # the first page was written when one batch of two had been read
    assert stream.writes[0][0] == 1
    lines = stream.getvalue().splitlines()
    assert lines[0].split() == ["k", "┃", "name"] and lines[2].split() == ["0", "│", "n0"]


@pytest.mark.parametrize("fmt", ["table", "csv", "json"])
def test_every_format_prints_the_first_rows_before_the_last_batch_is_read(fmt):
    source = CountedBatches(count=5, rows=1000)
    stream = WatchedStream(source)
    schema = pa.schema([("k", pa.int64()), ("name", pa.string())])
    assert emit_arrow(schema, source, fmt, stream=stream, page_rows=1000) == 5000
    with_rows = [(read, text) for read, text in stream.writes if "n0" in text]
    assert with_rows and with_rows[0][0] == 1  # the first batch's rows, before the second
    out = stream.getvalue()
    if fmt == "json":
        assert [json.loads(line)["k"] for line in out.splitlines()] == list(range(5000))
    elif fmt == "csv":
        assert out.splitlines()[0] == "k,name" and len(out.splitlines()) == 5001
    else:
        assert out.count("━╇━") == 5  # a page per batch of 1000


def test_rows_of_python_values_are_paged_too():
    stream = io.StringIO()
    assert emit(["K", "V"], ([i, None] for i in range(5)), "table", stream=stream,
                page_rows=2, title="five") == 5
    out = stream.getvalue()
    assert out.splitlines()[0] == "five" and out.count("━╇━") == 3
    assert out.count("null") == 5


# --- the commands, against a cluster ---------------------------------------------------------

ROWS = 30_000


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with LocalCluster(str(tmp_path_factory.mktemp("streaming")), tablet_servers=1) as c:
        yield c


@pytest.fixture(scope="module")
def big(cluster, conn):
    """A table of 30,000 rows in 3 buckets: many pages of a few rows."""
    assert main(["create", "stream.rows", "k:bigint", "name:string", "-o", "primary-key=k",
                 "-o", "bucket.num=3", "--url", cluster.url]) == 0
    table = conn.table("stream.rows")
    with table.upsert_writer() as writer:
        writer.upsert(pa.table({"k": pa.array(range(ROWS), pa.int64()),
                                "name": pa.array([f"row-{i}" for i in range(ROWS)])}))
        writer.flush()
    return table


def tally(*argv: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "tally.cli.main", *argv],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=ROOT, env=os.environ.copy())


@pytest.mark.parametrize("command", ["scan", "changelog"])
def test_the_first_page_arrives_while_the_command_still_runs(cluster, big, command):
    """The first page (header, rule, 50 rows) comes out while the process is still running:
    the 30,000 rows after it are more than a pipe holds, so it cannot have finished."""
    proc = tally(command, "stream.rows", "--page-rows", "50")
    try:
        first = [proc.stdout.readline() for _ in range(52)]
        assert proc.poll() is None, proc.stderr.read()
        assert "┃" in first[0] and "╇" in first[1]
        assert all("│" in line for line in first[2:])
        rest = proc.stdout.read()
    finally:
        proc.kill() if proc.poll() is None else None
    proc.wait(timeout=120)
    assert proc.returncode == 0
    rows = [line for line in first[2:] + rest.splitlines() if "│" in line]
    assert len(rows) == ROWS
    # a header and rule per page of at most 50 rows (fewer where rows waited a second)
    assert rest.count("╇") >= ROWS // 50 - 1


@pytest.mark.parametrize("fmt", ["csv", "json"])
def test_csv_and_json_lines_stream_from_the_commands(cluster, big, fmt):
    proc = tally("scan", "stream.rows", "--format", fmt)
    try:
        first = proc.stdout.readline()
        assert proc.poll() is None
        rest = proc.stdout.read()
    finally:
        proc.kill() if proc.poll() is None else None
    proc.wait(timeout=120)
    assert proc.returncode == 0
    lines = [first] + rest.splitlines()
    assert len(lines) == ROWS + (fmt == "csv")


def test_the_changelog_is_read_in_ranges_and_prints_every_record(capsys, cluster, big):
    from tally.cli.read_commands import changelog_batches

    buckets = big.meta.all_buckets()
    batches = list(changelog_batches(big, buckets, None, None, read_records=4_000))
    assert max(b.num_rows for b in batches) <= 4_000
    assert sum(b.num_rows for b in batches) == ROWS
    assert sorted(k for b in batches for k in b.column("k").to_pylist()) == list(range(ROWS))
    limited = list(changelog_batches(big, buckets, None, 9_000, read_records=4_000))
    assert sum(b.num_rows for b in limited) == 9_000


def test_page_rows_must_be_positive(capsys):
    assert main(["scan", "stream.rows", "--page-rows", "0"]) == 2
    assert "--page-rows" in capsys.readouterr().err

"""The `tally` table commands against a real LocalCluster: what each prints, and the exit
status and single line of each failure (tally.cli.exit_codes).

Most commands run in-process through `main(argv)`; a few run as real subprocesses, as a shell
would run them. One cluster serves the whole module (one metadata store: the commands only
talk to the client, which is the same for both).
"""

from __future__ import annotations

import csv
import datetime
import decimal
import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tally.cli.main import main
from tally.server import LocalCluster
from tests.cluster.cli_fixtures import conn, url  # noqa: F401 (fixtures)

ROOT = Path(__file__).resolve().parent.parent.parent
OK, FAILED, USAGE, NOT_FOUND, UNREACHABLE = 0, 1, 2, 3, 4


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with LocalCluster(str(tmp_path_factory.mktemp("cli")), tablet_servers=2) as c:
        yield c


def run(capsys, *argv) -> tuple[int, str, str]:
    capsys.readouterr()  # what earlier client calls logged (a retry after a table's creation)
    status = main(list(argv))
    out, err = capsys.readouterr()
    return status, out, err


def json_lines(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines()]


def one_line_error(err: str, *words: str) -> None:
    """A failure prints exactly one line, `tally: ...`, with `words` in it, and no traceback."""
    assert err.startswith("tally: ") and err.count("\n") == 1, err
    assert "Traceback" not in err
    for word in words:
        assert word in err, (word, err)


SHOP = ["product:string", "revenue:decimal(18,2)", "orders:bigint", "tags:string",
        "day:date"]
SHOP_OPTIONS = ["-o", "primary-key=product,day", "-o", "partition-key=day", "-o",
                "bucket.num=3", "-o", "fields.revenue.agg=sum", "-o", "fields.orders.agg=count",
                "-o", "fields.tags.agg=string_agg", "-o", "fields.tags.string_agg.distinct=true"]


@pytest.fixture(scope="module")
def shop(cluster, conn):
    """shop.orders, created by `tally create`, with rows written by the client."""
    assert main(["create", "shop.orders", *SHOP, *SHOP_OPTIONS, "--url", cluster.url]) == OK
    table = conn.table("shop.orders")
    with table.upsert_writer() as writer:
        for product, amount, tag, day in [("kayak", "10.50", "red", 1), ("tent", "99.00", "big", 1),
                                          ("kayak", "4.25", "blue", 1), ("rope", "3.10", "red", 2),
                                          ("kayak", "1.00", "red", 2), ("tent", "5.00", "x", 2)]:
            writer.upsert([{"product": product, "revenue": decimal.Decimal(amount), "orders": 1,
                            "tags": tag, "day": datetime.date(2026, 11, day)}])
            writer.flush()  # one write each: kayak's second on day 1 is an update (-U, +U)
    return table


def plain(row: dict) -> dict:
    """A row as `--format json` writes it: decimals as strings, dates as ISO 8601."""
    return {k: str(v) if isinstance(v, decimal.Decimal) else
            v.isoformat() if isinstance(v, datetime.date) else v for k, v in row.items()}


# --- catalog --------------------------------------------------------------------------------

def test_create_then_describe_shows_every_function_parameter_key_and_option(capsys, shop):
    status, out, _ = run(capsys, "describe", "shop.orders", "--format", "json")
    assert status == OK
    described = json.loads(out)
    columns = {c["name"]: c for c in described["columns"]}
    assert [c["name"] for c in described["columns"]] == ["product", "revenue", "orders", "tags",
                                                         "day"]
    assert columns["revenue"]["type"] == "decimal128(18, 2)"
    assert columns["revenue"]["function"] == "sum" and columns["orders"]["function"] == "count"
    # Every parameter, defaults included: distinct as asked, the delimiter by default.
    assert columns["tags"]["function"] == "string_agg"
    assert columns["tags"]["parameters"]["distinct"] is True
    assert columns["tags"]["parameters"]["delimiter"] == ","
    assert columns["product"]["function"] is None and columns["product"]["key"] == "primary"
    assert columns["day"]["key"] == "primary, partition" and not columns["day"]["nullable"]
    assert (described["primary_key"], described["partition_key"], described["buckets"]) == \
        (["product", "day"], ["day"], 3)
    assert sorted(described["partitions"]) == ["2026-11-01", "2026-11-02"]
    assert described["options"] == {"table.merge-engine": "aggregation"}
    assert described["created_at"].endswith("+00:00")

    status, out, _ = run(capsys, "describe", "shop.orders")
    assert status == OK
    for words in ("string_agg", "distinct=true", 'delimiter=","', "decimal128(18, 2)",
                  "primary key:   product, day", "partition key: day", "buckets:       3",
                  "table.merge-engine=aggregation"):
        assert words in out, words


def test_a_described_table_can_be_created_again_from_its_output(capsys, shop, conn):
    """The types `describe` prints are types `create` takes."""
    described = json.loads(run(capsys, "describe", "shop.orders", "--format", "json")[1])
    columns = [f"{c['name']}:{c['type']}" for c in described["columns"]]
    assert run(capsys, "create", "copy.orders", *columns, *SHOP_OPTIONS)[0] == OK
    assert conn.admin.describe_table("copy.orders").descriptor.schema == \
        conn.admin.describe_table("shop.orders").descriptor.schema
    assert run(capsys, "drop", "copy.orders")[0] == OK


def test_tables_lists_one_database_or_all(capsys, shop):
    assert run(capsys, "create", "other.t", "k:int", "v:bigint", "-o", "primary-key=k",
               "-o", "fields.v.agg=max")[0] == OK
    status, out, _ = run(capsys, "tables", "--format", "json")
    assert status == OK
    assert {"table": "shop.orders"} in json_lines(out) and {"table": "other.t"} in json_lines(out)
    status, out, _ = run(capsys, "tables", "other", "--format", "csv")
    assert (status, out) == (OK, "table\nother.t\n")
    status, out, _ = run(capsys, "tables", "shop")
    assert status == OK and "shop.orders" in out and "other.t" not in out
    status, _, err = run(capsys, "tables", "nowhere")
    assert status == NOT_FOUND
    one_line_error(err, "nowhere")
    assert run(capsys, "drop", "other.t")[0] == OK


def test_create_and_drop_and_their_failures(capsys, conn):
    args = ["create", "life.t", "k:int64", "n:int64", "-o", "primary-key=k",
            "-o", "fields.n.agg=sum"]
    status, out, _ = run(capsys, *args)
    assert status == OK and "created life.t" in out
    status, _, err = run(capsys, *args)
    assert status == FAILED
    one_line_error(err, "life.t")
    status, out, _ = run(capsys, *args, "--if-not-exists")
    assert status == OK and "exists already as declared" in out and "nothing changed" in out
    other = [a.replace("fields.n.agg=sum", "fields.n.agg=max") for a in args]
    status, _, err = run(capsys, *other, "--if-not-exists")
    assert status == FAILED
    one_line_error(err, "life.t exists with another declaration")
    assert conn.admin.describe_table("life.t").descriptor.schema.column("n").agg.value == "sum"
    status, out, _ = run(capsys, "drop", "life.t")
    assert status == OK and "dropped life.t" in out
    status, _, err = run(capsys, "drop", "life.t")
    assert status == NOT_FOUND
    one_line_error(err, "life.t")
    assert run(capsys, "drop", "life.t", "--if-exists")[0] == OK
    status, _, err = run(capsys, "describe", "life.t")
    assert status == NOT_FOUND
    one_line_error(err, "life.t", "does not exist")


@pytest.mark.parametrize("args, words", [
    (["k:int64", "n:int64", "-o", "primary-key=k", "-o", "merge-mode=overwrite"],
     ["merge-mode", "does not declare a table"]),
    (["k:int64", "n:int64", "-o", "primary-key=k", "-o", "fields.n.agg=average"],
     ["average"]),
    (["k:int64", "n:int64", "-o", "primary-key=k", "-o", "fields.m.agg=sum"], ["fields.m.agg"]),
    (["k:int64", "n:int64", "-o", "fields.n.agg=sum"], ["primary-key"]),
    (["k:int64", "n:int64", "-o", "primary-key=j"], ["'j'"]),
    (["k:int64", "n:integerish", "-o", "primary-key=k"], ["integerish"]),
    (["k", "-o", "primary-key=k"], ["NAME:TYPE", "'k'"]),
    (["k:int64", "n:int64", "-o", "primary-key=k", "-o", "bucket.num=zero"], ["bucket.num"]),
    (["k:int64", "n:int64", "-o", "primary-key=k", "-o", "table.colour=red"],
     ["table.colour"]),
    (["k:int64", "n:string", "-o", "primary-key=k", "-o", "fields.n.agg=sum"], ["n"]),
])
def test_create_refuses_bad_declarations_with_the_usage_status(capsys, conn, args, words):
    status, _, err = run(capsys, "create", "bad.t", *args)
    assert status == USAGE
    one_line_error(err, *words)
    assert "bad" not in conn.admin.list_databases()  # nothing was created


# --- reads ----------------------------------------------------------------------------------

def test_scan_prints_what_to_arrow_returns_in_every_format(capsys, shop):
    expected = [plain(r) for r in shop.to_arrow().to_pylist()]
    assert len(expected) == 5
    def ordered(rows):  # a scan streams bucket by bucket: compare without order
        return sorted(rows, key=lambda r: json.dumps(r, sort_keys=True))

    status, out, _ = run(capsys, "scan", "shop.orders", "--format", "json")
    assert status == OK and ordered(json_lines(out)) == ordered(expected)

    status, out, _ = run(capsys, "scan", "shop.orders", "--columns", "revenue,product",
                         "--limit", "2", "--format", "csv")
    assert status == OK
    got = list(csv.DictReader(io.StringIO(out)))
    assert len(got) == 2 and all(
        row in [{"revenue": r["revenue"], "product": r["product"]} for r in expected]
        for row in got)
    assert out.splitlines()[0] == "revenue,product"

    status, out, _ = run(capsys, "scan", "shop.orders", "--filter", "product=kayak",
                         "--filter", "product=rope", "--format", "json")
    assert status == OK
    assert ordered(json_lines(out)) == ordered(
        [r for r in expected if r["product"] in ("kayak", "rope")])
    status, _, err = run(capsys, "scan", "shop.orders", "--filter", "colour=red")
    assert status == USAGE
    one_line_error(err, "'colour'")

    status, out, _ = run(capsys, "scan", "shop.orders")
    lines = out.splitlines()
    assert status == OK and len(lines) == 2 + len(expected)  # header, rule, one line per row
    assert "red,blue" in out and "14.75" in out  # kayak on day 1

    status, _, err = run(capsys, "scan", "shop.orders", "--columns", "product,price")
    assert status == USAGE
    one_line_error(err, "'price'", "product, revenue")
    status, _, err = run(capsys, "scan", "shop.gone")
    assert status == NOT_FOUND
    one_line_error(err, "shop.gone")


def test_lookup_reads_key_values_in_their_column_types(capsys, shop):
    status, out, _ = run(capsys, "lookup", "shop.orders", "product=kayak", "day=2026-11-01",
                         "--format", "json")
    assert status == OK
    assert json_lines(out) == [plain(shop.lookup({"product": "kayak",
                                                  "day": datetime.date(2026, 11, 1)}))]
    assert json_lines(out)[0]["revenue"] == "14.75" and json_lines(out)[0]["orders"] == 2

    status, out, err = run(capsys, "lookup", "shop.orders", "product=canoe", "day=2026-11-01")
    assert (status, out) == (NOT_FOUND, "")
    one_line_error(err, "no row", "product=canoe")
    for argv, words in [(["product=kayak", "day=yesterday"], ["day", "'yesterday'"]),
                        (["product=kayak"], ["day=..."]),
                        (["product=kayak", "day=2026-11-01", "orders=1"], ["'orders'"]),
                        (["product", "day=2026-11-01"], ["COLUMN=VALUE"])]:
        status, _, err = run(capsys, "lookup", "shop.orders", *argv)
        assert status == USAGE, argv
        one_line_error(err, *words)


def test_changelog_prints_every_bucket_records_as_the_client_reads_them(capsys, shop, conn):
    log = conn.admin.list_log_offsets("shop.orders")
    expected = []
    for partition, bucket in sorted(log, key=lambda pb: (pb[0], pb[1])):
        start, end = log[(partition, bucket)]
        if end > start:
            records = shop.changelog(bucket, start, end, partition=partition).to_pylist()
            expected += [{"partition": partition, "bucket": bucket,
                          **{k: v for k, v in plain(r).items()
                             if k not in ("_unwritten", "_contributions", "_tokens")}}
                         for r in records]
    status, out, _ = run(capsys, "changelog", "shop.orders", "--format", "json")
    assert status == OK and json_lines(out) == expected
    # Five keys inserted; kayak of day 1 written twice: one update, as -U and +U.
    assert [r["_change_type"] for r in expected].count("+I") == 5
    assert [(r["_change_type"], r["revenue"]) for r in expected if r["_change_type"] != "+I"] \
        == [("-U", "10.50"), ("+U", "14.75")]

    # One bucket, from an offset, limited; the hidden state columns on request.
    partition, bucket = next(pb for pb, (s, e) in log.items() if e - s >= 3)
    status, out, _ = run(capsys, "changelog", "shop.orders", "--partition", partition,
                         "--bucket", str(bucket), "--from", "1", "--limit", "2", "--format",
                         "json", "--hidden")
    printed = json_lines(out)
    assert status == OK and [r["_offset"] for r in printed] == [1, 2]
    assert all(r["bucket"] == bucket and r["partition"] == partition and "_unwritten" in r
               for r in printed)
    status, out, _ = run(capsys, "changelog", "shop.orders", "--limit", "3", "--format", "csv")
    assert status == OK and len(out.splitlines()) == 4

    status, _, err = run(capsys, "changelog", "shop.orders", "--bucket", "3")
    assert status == USAGE
    one_line_error(err, "0..2", "3")
    status, _, err = run(capsys, "changelog", "shop.orders", "--partition", "2030-01-01")
    assert status == NOT_FOUND
    one_line_error(err, "2030-01-01")
    status, _, err = run(capsys, "changelog", "shop.orders", "--bucket", "one")
    assert status == USAGE


def test_offsets_prints_each_bucket_log_range(capsys, shop, conn):
    status, out, _ = run(capsys, "offsets", "shop.orders", "--format", "json")
    assert status == OK
    log = conn.admin.list_log_offsets("shop.orders")
    assert json_lines(out) == [
        {"partition": p, "bucket": b, "log_start": s, "log_end": e, "records": e - s}
        for (p, b), (s, e) in sorted(log.items(), key=lambda item: item[0])]
    assert sum(r["records"] for r in json_lines(out)) == 7  # 5 inserts, one update (-U, +U)
    status, out, _ = run(capsys, "offsets", "shop.orders")
    assert status == OK and "LOG START" in out and "2026-11-02" in out


def test_offsets_shows_each_consumer_position_lag_and_hold(capsys, shop, conn):
    table = conn.table("shop.orders")
    reader = table.changelog_reader(start="earliest", consumer="cli-billing")
    first = reader.poll()
    reader.commit()
    try:
        status, out, _ = run(capsys, "offsets", "shop.orders", "--consumers", "--format", "json")
        assert status == OK
        rows = [r for r in json_lines(out) if r["consumer"] == "cli-billing"]
        log = conn.admin.list_log_offsets("shop.orders")
        assert {(r["partition"], r["bucket"]) for r in rows} == set(log)
        assert sum(r["lag"] for r in rows) == 0
        assert first.num_rows == sum(end - start for start, end in log.values())
        assert all(r["position"] == log[(r["partition"], r["bucket"])][1] for r in rows)
        assert all(r["holding"] == "yes" and r["updated"].endswith("+00:00") for r in rows)
        status, out, _ = run(capsys, "offsets", "shop.orders")
        assert status == OK and "changelog consumers" in out and "cli-billing" in out
    finally:
        conn.admin.remove_consumer("shop.orders", "cli-billing")
    status, out, _ = run(capsys, "offsets", "shop.orders")
    assert status == OK and "cli-billing" not in out


# --- cluster commands -----------------------------------------------------------------------

def test_servers_and_locks(capsys, cluster, conn, shop):
    status, out, _ = run(capsys, "servers", "--url", cluster.url, "--format", "json")
    assert status == OK
    servers = json_lines(out)
    assert len(servers) == 2 and {s["state"] for s in servers} == {"live"}
    assert {s["address"] for s in servers} == {h.address for h in cluster.tablet_servers}

    lease = conn.locks.acquire("shop.orders", "cli-test", ["revenue"], ttl=60)
    try:
        status, out, _ = run(capsys, "locks", "--format", "json")
        assert status == OK
        (lock,) = [r for r in json_lines(out) if r["owner"] == "cli-test"]
        assert (lock["table"], lock["columns"], lock["token"]) == \
            ("shop.orders", "revenue", lease.token)
    finally:
        conn.locks.release(lease)
    status, out, _ = run(capsys, "locks", "shop.orders")
    assert (status, out) == (OK, "no column locks\n")
    status, _, err = run(capsys, "locks", "--discard", "someone")
    assert status == USAGE
    one_line_error(err, "--discard")


# --- failures -------------------------------------------------------------------------------

def test_usage_errors_are_one_line_with_status_2(capsys, monkeypatch):
    status, out, err = run(capsys, "tablez")
    assert (status, out) == (USAGE, "")
    one_line_error(err, "tablez")
    status, _, err = run(capsys, "scan", "shop.orders", "--format", "xml")
    assert status == USAGE
    one_line_error(err, "xml")
    status, _, err = run(capsys, "scan", "shop.orders", "--limit", "-1")
    assert status == USAGE
    status, _, err = run(capsys, "tables", "--url", "http://127.0.0.1:1")
    assert status == USAGE
    one_line_error(err, "http")
    monkeypatch.delenv("TALLY_URL")
    status, _, err = run(capsys, "tables")
    assert status == USAGE
    one_line_error(err, "--url", "TALLY_URL")
    assert run(capsys, "--help")[0] == OK


def test_verbose_adds_the_traceback(capsys):
    for argv in (["-v", "describe", "shop.none"], ["describe", "shop.none", "--verbose"]):
        status, _, err = run(capsys, *argv)
        assert status == NOT_FOUND
        assert "Traceback" in err and "NotFoundError" in err
        assert err.splitlines()[-1] == "tally: table 'shop.none' does not exist"


def cli(*argv, env=None, timeout=120) -> subprocess.CompletedProcess:
    """`tally ARGV` as a shell runs it: a new process."""
    return subprocess.run([sys.executable, "-m", "tally.cli.main", *argv], capture_output=True,
                          text=True, cwd=ROOT, env={**os.environ, **(env or {})},
                          timeout=timeout)


def test_as_real_processes(cluster, shop):
    done = cli("scan", "shop.orders", "--format", "csv", "--url", cluster.url)
    assert done.returncode == OK, done.stderr
    assert done.stdout.splitlines()[0] == "product,revenue,orders,tags,day"
    assert len(done.stdout.splitlines()) == 6
    done = cli("describe", "shop.missing", env={"TALLY_URL": cluster.url})
    assert (done.returncode, done.stdout) == (NOT_FOUND, "")
    one_line_error(done.stderr, "shop.missing")


def test_scan_stops_quietly_when_the_reader_closes_the_pipe(cluster, shop):
    """`tally scan ... | head -1`: the reader leaves early; that is no failure."""
    proc = subprocess.Popen([sys.executable, "-m", "tally.cli.main", "scan", "shop.orders",
                             "--format", "json", "--url", cluster.url],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT)
    proc.stdout.close()  # before the command writes anything
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == OK and b"Traceback" not in err


def test_the_session_in_the_cli_doc_runs_as_written(tmp_path):
    """docs/cli.md's first shell block: a cluster, create, describe, a write, lookup, scan,
    changelog, offsets, drop, as a shell runs them."""
    text = (ROOT / "docs" / "cli.md").read_text()
    block = text.split("```sh\n", 1)[1].split("```", 1)[0]
    env = {k: v for k, v in os.environ.items() if k != "TALLY_URL"}
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
    env["TMPDIR"] = str(tmp_path)  # the block's mktemp -d
    done = subprocess.run(["bash", "-c", block], capture_output=True, text=True, env=env,
                          cwd=tmp_path, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    assert "created shop.totals" in out and "sum" in out and "count" in out
    # the scan's two rows, in either order (a bucket's buffered rows come in no key order)
    assert re.search(r"^(kayak,150\.00,2\ntent,80\.50,1|tent,80\.50,1\nkayak,150\.00,2)$",
                     out, re.M)
    for change in ("+I", "-U", "+U"):
        assert change in out
    assert "dropped shop.totals" in out


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_changelog_piped_to_a_file_draws_progress_on_the_terminal_only(shop, monkeypatch):
    """The bar goes to stderr (a terminal) and never into the rows (stdout, a file)."""
    piped = io.StringIO()
    monkeypatch.setattr(sys, "stdout", piped)
    assert main(["changelog", "shop.orders", "--format", "csv"]) == OK
    expected = piped.getvalue()
    terminal, piped = Terminal(), io.StringIO()
    monkeypatch.setattr(sys, "stdout", piped)
    monkeypatch.setattr(sys, "stderr", terminal)
    assert main(["changelog", "shop.orders", "--format", "csv"]) == OK
    assert piped.getvalue() == expected and len(expected.splitlines()) == 8
    assert "reading shop.orders's changelog" in terminal.getvalue()


def test_add_column(capsys, conn):
    assert main(["create", "grow.t", "k:int64", "n:int64", "-o", "primary-key=k",
                 "-o", "fields.n.agg=sum"]) == OK
    capsys.readouterr()
    status, out, _ = run(capsys, "add-column", "grow.t", "tags:string", "--agg", "string_agg",
                         "-p", "delimiter=;")
    assert status == OK and out.strip() == "added column tags to grow.t (column id 2)"
    column = conn.admin.describe_table("grow.t").descriptor.schema.column("tags")
    assert (column.agg.value, column.params["delimiter"]) == ("string_agg", ";")
    status, _, err = run(capsys, "add-column", "grow.t", "m:string", "--agg", "sum")
    assert status != OK and len(err.strip().splitlines()) == 1 and "sum column 'm'" in err
    assert conn.admin.describe_table("grow.t").descriptor.schema.names == ["k", "n", "tags"]

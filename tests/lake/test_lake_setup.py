"""A lake nothing could tier is refused when it is turned on, never left to lag in silence.

Real clusters and processes: a coordinator without `--datalake-dir`; one with a lake directory
whose processes (coordinator and tablet servers) run in a Python that cannot import deltalake,
as a clone set up without the `[lake]` extra would. That Python is made by a `sitecustomize`
on the child processes' PYTHONPATH that blocks the import (`sys.modules['deltalake'] = None`);
the test process keeps its own deltalake, so a tiering process started from it can tier.
"""

from __future__ import annotations

import csv
import io
import os
import signal
import subprocess
import sys

import pyarrow as pa
import pytest

from merge_engine import Schema, TableDescriptor
from tally import client
from tally.cli.main import main
from tally.errors import LakeSetupError, MissingDependencyError
from tally.server import LocalCluster
from tests.waiting import wait_until

LAKE_ON = {"table.datalake.enabled": "true", "table.datalake.freshness": "500ms"}
PROJECT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def schema():
    return Schema.builder().column("k", pa.string()).column("v", pa.int64()) \
        .primary_key("k").build()


@pytest.fixture(scope="module")
def without_deltalake(tmp_path_factory):
    """A PYTHONPATH entry whose sitecustomize makes `import deltalake` fail."""
    path = tmp_path_factory.mktemp("no-deltalake")
    (path / "sitecustomize.py").write_text("import sys\nsys.modules['deltalake'] = None\n")
    return str(path)


@pytest.fixture(scope="module")
def no_lake_dir(tmp_path_factory):
    with LocalCluster(str(tmp_path_factory.mktemp("no-lake-dir")), tablet_servers=1) as c:
        yield c


@pytest.fixture(scope="module")
def no_deltalake(tmp_path_factory, without_deltalake):
    """A cluster with a lake directory whose own processes cannot import deltalake."""
    root = tmp_path_factory.mktemp("no-deltalake-cluster")
    with pytest.MonkeyPatch.context() as env:
        env.setenv("PYTHONPATH", without_deltalake)  # read by LocalCluster's children only
        cluster = LocalCluster(str(root / "cluster"), tablet_servers=1,
                               datalake_dir=str(root / "lake"), tier_timeout=3.0)
        cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()


def tally_tier(url: str, tier_id: str, pythonpath: str | None = None) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (pythonpath, PROJECT) if p)}
    return subprocess.Popen([sys.executable, "-m", "tally.cli", "tier", "--url", url,
                             "--tier-id", tier_id], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, cwd=PROJECT)


def run_cli(capsys, *argv) -> tuple[int, str, str]:
    capsys.readouterr()
    status = main(list(argv))
    out, err = capsys.readouterr()
    return status, out, err


def setup_of(conn) -> dict:
    return conn.coordinator_action("lake_setup")


def test_without_a_lake_directory_turning_the_lake_on_is_refused(no_lake_dir, capsys):
    with client.connect(no_lake_dir.url, retry_timeout=60) as conn:
        with pytest.raises(LakeSetupError, match="no lake directory: start it with "
                                                 "--datalake-dir URI"):
            conn.admin.create_table("default.born_lake", TableDescriptor(schema(),
                                                                          properties=LAKE_ON))
        assert "born_lake" not in conn.admin.list_tables("default")

        conn.admin.create_table("default.later_lake", TableDescriptor(schema()))
        before = conn.admin.describe_table("default.later_lake").descriptor.to_json()
        with pytest.raises(LakeSetupError, match="--datalake-dir"):
            conn.admin.set_table_options("default.later_lake", LAKE_ON)
        status, out, err = run_cli(capsys, "set-options", "default.later_lake", "--set",
                                   "table.datalake.enabled=true", "--url", no_lake_dir.url)
        assert status == 2 and out == ""
        assert err.count("\n") == 1 and "default.later_lake" in err and "--datalake-dir" in err
        assert conn.admin.describe_table("default.later_lake").descriptor.to_json() == before
        # the options that do not turn the lake on are still changed
        assert conn.admin.set_table_options("default.later_lake", {
            "table.datalake.freshness": "5s"}) == {"table.datalake.freshness": "5s"}

    status, out, _ = run_cli(capsys, "lake", "--url", no_lake_dir.url)
    assert status == 0
    assert "lake directory: NOT OK: none: start the coordinator with --datalake-dir" in out


def test_tally_tier_without_deltalake_refuses_in_one_line(no_lake_dir, without_deltalake):
    proc = tally_tier(no_lake_dir.url, "tier-blind", without_deltalake)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 1, (out, err)
    assert out == "" and err.count("\n") == 1, err
    assert err.startswith("tally: ") and "pip install 'tally-aggregates[lake]'" in err
    # the library's tiering process refuses as well, before it heartbeats
    env = {**os.environ, "PYTHONPATH": os.pathsep.join((without_deltalake, PROJECT))}
    probe = subprocess.run(
        [sys.executable, "-c", "from tally.lake import TierService\n"
         "try:\n    TierService(conn=None)\n"
         "except Exception as e:\n    print(type(e).__name__)\n"],
        capture_output=True, text=True, env=env, cwd=PROJECT, timeout=120)
    assert probe.stdout.strip() == MissingDependencyError.__name__, probe.stderr
    # and so does a local cluster that would start tiering processes, before starting anything
    data_dir = os.path.join(without_deltalake, "local-cluster")
    probe = subprocess.run(
        [sys.executable, "-c", "import sys\nfrom tally.server import LocalCluster\n"
         "try:\n    LocalCluster(sys.argv[1], tablet_servers=1, datalake_dir=sys.argv[1] + "
         "'/lake', tiering=True).start()\n"
         "except Exception as e:\n    print(type(e).__name__, e)\n", data_dir],
        capture_output=True, text=True, env=env, cwd=PROJECT, timeout=120)
    assert probe.stdout.startswith(MissingDependencyError.__name__), probe.stderr
    assert "pip install 'tally-aggregates[lake]'" in probe.stdout
    assert not os.path.exists(os.path.join(data_dir, "coordinator"))
    with client.connect(no_lake_dir.url, retry_timeout=60) as conn:
        assert setup_of(conn)["tier_processes"] == []


def test_a_heartbeat_without_deltalake_gets_no_tables(no_deltalake):
    with client.connect(no_deltalake.url, retry_timeout=60) as conn:
        with pytest.raises(MissingDependencyError, match=r"tally-aggregates\[lake\]"):
            conn.coordinator_action("tier_heartbeat", {"tier_id": "tier-old", "deltalake": None})
        assert setup_of(conn)["tier_processes"] == []


def test_without_deltalake_anywhere_the_lake_waits_for_a_tiering_process(no_deltalake, capsys):
    url = no_deltalake.url
    with client.connect(url, retry_timeout=60) as conn:
        assert setup_of(conn)["deltalake"] is None  # the coordinator's Python cannot import it
        with pytest.raises(LakeSetupError, match=r"no tiering process can import deltalake.*"
                                                 r"pip install 'tally-aggregates\[lake\]'"):
            conn.admin.create_table("default.waits", TableDescriptor(schema(),
                                                                      properties=LAKE_ON))
        assert "waits" not in conn.admin.list_tables("default")
        status, out, _ = run_cli(capsys, "lake", "--url", url)
        assert status == 0
        assert "lake: NOT OK: no tiering process can import deltalake" in out
        assert "deltalake in the coordinator: NOT OK: not importable" in out

        tier = tally_tier(url, "tier-able")  # this test's own Python: deltalake imports
        try:
            def able():
                return any(p["tier_id"] == "tier-able" and p["live"] and p["deltalake"]
                           for p in setup_of(conn)["tier_processes"])

            wait_until(able, "the tiering process registering with its deltalake")
            conn.admin.create_table("default.tiers", TableDescriptor(schema(),
                                                                      properties=LAKE_ON))
            with conn.table("default.tiers").upsert_writer() as writer:
                writer.upsert([{"k": "a", "v": 1}])
            ends = conn.admin.list_offsets("default.tiers")
            wait_until(lambda: (s := conn.admin.lake_snapshot("default.tiers")) is not None
                       and all(s.offsets.get(k, 0) >= e for k, e in ends.items()),
                       "the lake of default.tiers catching up")

            status, out, _ = run_cli(capsys, "lake", "--url", url)
            assert status == 0
            assert "lake: a table's lake can be turned on" in out
            assert "tiering process tier-able: live" in out and "1 tables held" in out
            assert "default.tiers" in out
            status, out, _ = run_cli(capsys, "lake", "--setup", "--format", "csv", "--url", url)
            rows = list(csv.DictReader(io.StringIO(out)))
            assert status == 0 and {"what": "tiering process tier-able", "ok": "true"}.items() \
                <= next(r for r in rows if r["what"].endswith("tier-able")).items()
        finally:
            tier.send_signal(signal.SIGTERM)
            tier.communicate(timeout=60)

        # once the process stopped heartbeating, nothing could tier a new lake again
        wait_until(lambda: not any(p["live"] for p in setup_of(conn)["tier_processes"]),
                   "the stopped tiering process counting as gone")
        conn.admin.create_table("default.after", TableDescriptor(schema()))
        with pytest.raises(LakeSetupError, match="no tiering process can import deltalake"):
            conn.admin.set_table_options("default.after", LAKE_ON)
        assert conn.admin.set_table_options("default.tiers", {
            "table.datalake.freshness": "5s"})["table.datalake.enabled"] == "true"

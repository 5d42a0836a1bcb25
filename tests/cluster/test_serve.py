"""`tally serve`: the single-process embedded default (and with ZooKeeper), restart on its dir."""

from __future__ import annotations

import json
import os
import select
import shutil
import signal
import subprocess
import sys
import time

from tally import client
from tests.cluster import reference_workload

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def start_serve(data_dir: str, *extra: str) -> tuple[subprocess.Popen, str]:
    tally = shutil.which("tally", path=os.path.dirname(sys.executable))
    cmd = [tally] if tally else [sys.executable, "-m", "tally.cli.main"]
    proc = subprocess.Popen([*cmd, "serve", "--data-dir", data_dir, *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, cwd=ROOT)
    deadline = time.monotonic() + 60
    line = b""
    while time.monotonic() < deadline and b"\n" not in line:
        if select.select([proc.stdout], [], [], 0.1)[0]:
            line += os.read(proc.stdout.fileno(), 4096)
        assert proc.poll() is None, "tally serve exited"
    ready = json.loads(line.decode().split(" ", 1)[1])
    return proc, ready["address"]


def stop(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(20) == 0
    proc.stdout.close()


def test_tally_serve_runs_everything_in_one_process(tmp_path, metadata_store):
    extra = ["--zookeeper", metadata_store] if metadata_store else []
    data = reference_workload.batches(seed=9, count=2, rows=300)
    proc, url = start_serve(str(tmp_path), *extra)
    try:
        with client.connect(url) as conn:
            conn.admin.create_table("default.one", reference_workload.descriptor(buckets=3))
            w = conn.table("default.one").upsert_writer()
            w.upsert(data[0])
            w.flush()
    finally:
        stop(proc)
    proc, url = start_serve(str(tmp_path), *extra)  # same data dir, new port
    try:
        with client.connect(url) as conn:
            w = conn.table("default.one").upsert_writer()
            w.upsert(data[1])
            w.flush()
            got = reference_workload.as_state(conn.table("default.one").to_arrow())
            assert got == reference_workload.fold(data)
            assert [s["live"] for s in conn.admin.list_servers()] == [True]
    finally:
        stop(proc)


def test_tally_serve_with_an_auth_file_and_the_cli_with_a_token_file(tmp_path, monkeypatch,
                                                                     capsys):
    """Secrets come from files and the environment, never argv: the server's auth file through
    $TALLY_AUTH_FILE, the CLI's token through --token-file or $TALLY_TOKEN."""
    from tally.cli.main import main
    from tally.errors import PermissionDeniedError
    from tally.server.credentials import new_secret, write_auth_file

    auth, reader = str(tmp_path / "auth.toml"), new_secret()
    write_auth_file(auth, new_secret(), {"dash": (reader, "read")})
    monkeypatch.setenv("TALLY_AUTH_FILE", auth)
    proc, url = start_serve(str(tmp_path / "data"))
    monkeypatch.delenv("TALLY_AUTH_FILE")
    try:
        token_file = tmp_path / "token"
        token_file.write_text(reader + "\n")
        assert main(["servers", "--url", url, "--token-file", str(token_file)]) == 0
        assert "live" in capsys.readouterr().out
        monkeypatch.setenv("TALLY_TOKEN", reader)
        assert main(["locks", "--url", url]) == 0
        assert "no column locks" in capsys.readouterr().out
        with client.connect(url, token=reader) as conn:  # a read token cannot create a table
            try:
                conn.admin.create_table("default.nope", reference_workload.descriptor(buckets=1))
                raise AssertionError("a read token created a table")
            except PermissionDeniedError as e:
                assert "requires role admin" in str(e)
        monkeypatch.delenv("TALLY_TOKEN")
        assert main(["servers", "--url", url]) == 5  # denied: one line, no traceback
        err = capsys.readouterr().err
        assert err.startswith("tally: ") and err.count("\n") == 1 and "Traceback" not in err
    finally:
        stop(proc)
    assert reader not in " ".join(proc.args)

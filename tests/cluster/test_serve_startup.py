"""`tally serve` that cannot start says why in one line on stderr, naming the port or path, with
the CLI's exit status (tally.cli.exit_codes) and no gRPC or kazoo log lines; `--verbose` adds
the traceback. Each case runs the real command in a subprocess, as a shell would."""

from __future__ import annotations

import argparse
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tally.server.serve_args import add_serve_arguments

ROOT = Path(__file__).resolve().parent.parent.parent
FAILED, USAGE, UNREACHABLE = 1, 2, 4


def tally(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tally.cli.main", *argv], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)


def one_line(done: subprocess.CompletedProcess, status: int, *words: str) -> None:
    lines = done.stderr.strip().splitlines()
    assert done.returncode == status and len(lines) == 1, (done.returncode, done.stderr)
    assert lines[0].startswith("tally: ") and "Traceback" not in done.stderr
    for word in words:
        assert word in lines[0], (word, lines[0])


@pytest.fixture
def taken_port():
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        yield holder.getsockname()[1]


@pytest.mark.parametrize("option", ["--port", "--metrics-port", "--part-read-port"])
def test_a_taken_port_is_one_line_naming_it(tmp_path, taken_port, option):
    done = tally("serve", "--data-dir", str(tmp_path), option, str(taken_port))
    one_line(done, FAILED, f"127.0.0.1:{taken_port}", "Address already in use")


def test_a_port_another_server_holds_is_refused_though_grpc_would_share_it(tmp_path):
    """gRPC listens with SO_REUSEPORT: without the check a second server would share the
    first one's port and take half its callers."""
    from tally.server.process import ServerProcess

    args = add_serve_arguments(argparse.ArgumentParser()).parse_args(
        ["--data-dir", str(tmp_path / "first")])
    first = ServerProcess(args)
    try:
        done = tally("serve", "--data-dir", str(tmp_path / "second"), "--port",
                     str(first.flight.port))
        one_line(done, FAILED, f"127.0.0.1:{first.flight.port}", "Address already in use")
    finally:
        first.close()


def test_verbose_shows_the_traceback(tmp_path, taken_port):
    done = tally("serve", "--data-dir", str(tmp_path), "--port", str(taken_port), "--verbose")
    assert done.returncode == FAILED and "Traceback" in done.stderr
    assert done.stderr.strip().splitlines()[-1].startswith("tally: cannot serve Flight on")


def test_a_data_dir_that_cannot_be_made_is_one_line(tmp_path):
    a_file = tmp_path / "file"
    a_file.write_text("")
    one_line(tally("serve", "--data-dir", str(a_file)), USAGE, str(a_file), "not a directory")
    one_line(tally("serve", "--data-dir", str(a_file / "data")), USAGE, str(a_file / "data"),
             "cannot create it")
    one_line(tally("local-cluster", "--data-dir", str(a_file / "data")), USAGE,
             str(a_file / "data"))


def test_tls_files_that_cannot_serve_are_one_line(tmp_path):
    garbage = tmp_path / "garbage.pem"
    garbage.write_text("not a certificate\n")
    missing = tmp_path / "missing.pem"
    data = str(tmp_path / "d")
    one_line(tally("serve", "--data-dir", data, "--tls-cert", str(missing), "--tls-key",
                   str(garbage)), USAGE, "--tls-cert", str(missing), "no such file")
    one_line(tally("serve", "--data-dir", data, "--tls-cert", str(garbage), "--tls-key",
                   str(garbage)), USAGE, str(garbage), "not a PEM certificate chain")
    one_line(tally("serve", "--data-dir", data, "--tls-ca", str(garbage)), USAGE,
             "--tls-ca and --tls-verify-clients need --tls-cert")


def test_an_auth_file_that_cannot_be_read_is_one_line(tmp_path):
    data = str(tmp_path / "d")
    one_line(tally("serve", "--data-dir", data, "--auth-file", str(tmp_path)), USAGE,
             f"--auth-file {tmp_path}", "cannot read it")
    one_line(tally("serve", "--data-dir", data, "--auth-file", str(tmp_path / "none.toml")),
             USAGE, str(tmp_path / "none.toml"), "does not exist")


@pytest.mark.parametrize("argv, words", [
    (["--port", "70000"], ["--port", "70000"]),
    (["--log-level", "loud"], ["--log-level", "LOUD"]),
    (["--max-batch-bytes", "0"], ["--max-batch-bytes"]),
    (["--role", "tablet"], ["--coordinator", "--zookeeper"]),
    (["--host", "no-such-host.invalid", "--allow-unauthenticated"],
     ["no-such-host.invalid", "does not resolve"]),
])
def test_bad_option_values_are_one_line(tmp_path, argv, words):
    one_line(tally("serve", "--data-dir", str(tmp_path), *argv), USAGE, *words)


def test_local_cluster_refuses_a_cluster_of_no_tablet_servers(tmp_path):
    one_line(tally("local-cluster", "--data-dir", str(tmp_path), "--tablet-servers", "0"),
             USAGE, "--tablet-servers")


def test_zookeeper_unreachable_at_start_is_one_line_after_a_bounded_wait(tmp_path):
    """No kazoo warning per retry: the one line, with status 4 (retrying later may help)."""
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]  # bound, never listening: connections are refused
        done = tally("serve", "--data-dir", str(tmp_path), "--zookeeper", f"127.0.0.1:{port}")
    one_line(done, UNREACHABLE, f"127.0.0.1:{port}", "ZooKeeper")
    assert "kazoo" not in done.stderr


def test_local_cluster_names_why_its_coordinator_did_not_start(tmp_path):
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
        done = tally("local-cluster", "--data-dir", str(tmp_path), "--tablet-servers", "1",
                     "--zookeeper", f"127.0.0.1:{port}")
    one_line(done, UNREACHABLE, "coordinator", f"cannot reach ZooKeeper at 127.0.0.1:{port}",
             "server.log")

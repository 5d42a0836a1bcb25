"""Who may make which call, over the wire: every call of the role table, for every principal.

The matrix is generated from the one role table (`tally.server.access.REQUIRED_ROLE`): each call
goes to the coordinator and to a tablet server under no credential, an unknown one, a token of
each client role and the cluster credential. A principal the table refuses must get
AuthenticationError (no or unknown credential) or PermissionDeniedError; one it admits must get
past authorization. Admitted calls carry a body the handler refuses as malformed (an empty
object), so the matrix changes nothing whoever is admitted; the hypothesis test in
tests/reliability sends well-formed bodies by refused principals and checks nothing changed.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

import pyarrow as pa
import pyarrow.flight as flight
import pytest

from tally.errors import AuthenticationError, PermissionDeniedError, TallyError
from tally.server.access import CLIENT_ROLES, CLUSTER, REQUIRED_ROLE, allows, role_table_markdown
from tally.server.serve_args import add_serve_arguments
from tally.wire.channel import FlightChannel, normalize_address
from tally.wire.messages import bearer, dumps, remote_error

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PRINCIPALS = ["no credential", "unknown credential", *CLIENT_ROLES, CLUSTER]


def secret_of(cluster, principal: str) -> str | None:
    if principal == "no credential":
        return None
    if principal == "unknown credential":
        return "not-a-credential-of-this-cluster"
    return cluster.cluster_token if principal == CLUSTER else cluster.tokens[principal]


def call(address: str, secret: str | None, name: str) -> Exception | None:
    """Make `name` with an empty (malformed) request; the error it raised, or None."""
    client = flight.FlightClient(normalize_address(address))
    options = flight.FlightCallOptions(headers=bearer(secret), timeout=30)
    try:
        if name.startswith("do_put:"):
            descriptor = flight.FlightDescriptor.for_command(dumps({"op": name[7:]}))
            rows = pa.table({"k": pa.array([1], pa.int64())})
            writer, reader = client.do_put(descriptor, rows.schema, options)
            writer.write_table(rows)
            writer.done_writing()
            reader.read()
            writer.close()
        elif name.startswith("do_get:"):
            client.do_get(flight.Ticket(dumps({"op": name[7:]})), options).read_all()
        else:
            list(client.do_action(flight.Action(name, b"{}"), options))
        return None
    except (flight.FlightError, pa.ArrowException) as e:
        return remote_error(e, address)
    finally:
        client.close()


def expected_refusal(principal: str, required: str):
    if principal in ("no credential", "unknown credential"):
        return AuthenticationError
    return None if allows(principal, required) else PermissionDeniedError


@pytest.mark.parametrize("principal", PRINCIPALS)
def test_every_call_for_every_principal(secured_cluster, principal):
    secret = secret_of(secured_cluster, principal)
    servers = {"coordinator": secured_cluster.url,
               "tablet server": secured_cluster.tablet_servers[0].address}
    wrong = []
    for name, required in REQUIRED_ROLE.items():
        refusal = expected_refusal(principal, required)
        for where, address in servers.items():
            error = call(address, secret, name)
            if refusal is not None and not isinstance(error, refusal):
                wrong.append(f"{name} at the {where}: expected {refusal.__name__}, got {error!r}")
            if refusal is None and isinstance(error, (AuthenticationError,
                                                      PermissionDeniedError)):
                wrong.append(f"{name} at the {where}: expected to pass, got {error!r}")
    assert not wrong, "\n".join(wrong)


def test_every_served_call_is_in_the_role_table(tmp_path):
    """A server that serves an action without a row refuses to start, and every row names a
    call some server serves (an in-process server of every role: the real handler tables)."""
    from tally.server.process import ServerProcess

    args = add_serve_arguments(argparse.ArgumentParser()).parse_args(
        ["--data-dir", str(tmp_path)])
    process = ServerProcess(args)
    try:
        served = set(process.flight.actions) | set(process.flight.binary_actions) \
            | set(process.flight.raw_actions)
    finally:
        process.close()
    ops = {"do_put:put", "do_put:delete", "do_put:undo", "do_get:scan", "do_get:prefix_lookup",
           "do_get:changelog"}
    assert served | ops == set(REQUIRED_ROLE)


def test_the_security_page_prints_the_role_table():
    with open(os.path.join(ROOT, "docs", "security.md")) as f:
        page = f.read()
    assert role_table_markdown() in page, \
        "docs/security.md must hold the table that tally.server.access.role_table_markdown() " \
        "prints"


def test_clients_cannot_reach_internal_calls_through_the_client(secured_cluster):
    """The issue's probes, through the client: no client role reaches an internal action."""
    from tally import client

    with client.connect(secured_cluster.url, token=secured_cluster.tokens["admin"]) as conn:
        for name, body in [("heartbeat", {"server_id": "ts-phantom",
                                          "address": "grpc://127.0.0.1:9"}),
                           ("lock_view", {"table_id": 1}),
                           ("bucket_info", {"table_id": 1, "partition_id": 0, "bucket": 0})]:
            with pytest.raises(PermissionDeniedError, match=f"may not call '{name}'"):
                conn.coordinator_action(name, body)
        assert "ts-phantom" not in {s["server_id"] for s in conn.admin.list_servers()}
        tablet = FlightChannel(secured_cluster.tablet_servers[0].address,
                               secured_cluster.tokens["admin"])
        try:
            for name in ("install_lock_view", "drop_tablets", "truncate_bucket_log", "offsets"):
                with pytest.raises(PermissionDeniedError, match="requires role cluster"):
                    tablet.action(name, {})
        finally:
            tablet.close()


def serve(*argv: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """`python -m tally.server` that must refuse to start (it would serve forever otherwise)."""
    return subprocess.run([sys.executable, "-m", "tally.server", *argv], cwd=ROOT,
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, **(env or {})})


def test_no_credentials_on_a_non_loopback_address_is_refused(tmp_path):
    done = serve("--data-dir", str(tmp_path), "--host", "0.0.0.0")
    assert done.returncode != 0 and "refusing to serve 0.0.0.0 without credentials" in done.stderr


def test_an_auth_file_others_may_read_is_refused(tmp_path):
    from tally.server.credentials import new_secret, write_auth_file

    path = str(tmp_path / "auth.toml")
    write_auth_file(path, new_secret(), {"app": (new_secret(), "write")})
    os.chmod(path, 0o644)
    done = serve("--data-dir", str(tmp_path / "d"), env={"TALLY_AUTH_FILE": path})
    assert done.returncode != 0 and "chmod 600" in done.stderr


@pytest.mark.parametrize("text, complaint", [
    ('cluster = "short"', "at least 16"),
    ('cluster = "0123456789abcdef0123"\n[clients.a]\ntoken = "0123456789abcdef0123"\n'
     'role = "read"', "used twice"),
    ('cluster = "0123456789abcdef0123"\n[clients.a]\ntoken = "abcdefabcdefabcdefab"\n'
     'role = "root"', "role 'root'"),
    ('cluster = "0123456789abcdef0123"\nclient = 1', "unknown keys ['client']"),
])
def test_a_bad_auth_file_is_refused_naming_the_problem(tmp_path, text, complaint):
    from tally.server.credentials import Credentials

    path = tmp_path / "auth.toml"
    path.write_text(text)
    path.chmod(0o600)
    with pytest.raises(TallyError, match=complaint.replace("[", r"\[").replace("]", r"\]")):
        Credentials.load(str(path))

"""The isolated host's network faults do what they say and leave nothing behind: a listener
inside the namespace is reached through the veth pair, not reached (a silent timeout, not a
refusal) while partitioned or cut one way, reached again once healed; closing removes the
namespace and the veth pair, and kills what still ran inside."""

from __future__ import annotations

import socket
import subprocess
import sys

import pytest

from tally.bench import fault_network

LISTENER = ("import socket, sys; s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, "
            "socket.SO_REUSEADDR, 1); s.bind((sys.argv[1], 7777)); s.listen(); print('up', "
            "flush=True)\nwhile True:\n    c, _ = s.accept(); c.sendall(b'hi'); c.close()")


def reaches(address: str, timeout: float) -> bool:
    try:
        with socket.create_connection((address, 7777), timeout=timeout) as s:
            return s.recv(2) == b"hi"
    except socket.timeout:
        return False


@pytest.fixture
def host():
    reason = fault_network.available()
    if reason:
        pytest.skip(reason)
    h = fault_network.IsolatedHost()
    try:
        yield h
    finally:
        h.close()


def test_partition_cut_and_heal(host):
    listener = subprocess.Popen(host.command([sys.executable, "-c", LISTENER, host.address]),
                                stdout=subprocess.PIPE)
    try:
        assert listener.stdout.readline().strip() == b"up"
        assert reaches(host.address, 30)
        host.partition()
        assert len(host.rules()) == 2
        # a generous timeout: a dropped SYN is never answered, however long we wait
        assert not reaches(host.address, 2)
        host.heal()
        assert host.rules() == [] and reaches(host.address, 30)
        host.cut("out")   # the SYN arrives, the answer is lost
        assert not reaches(host.address, 2)
        host.heal()
        host.loss(0.5)
        assert len(host.rules()) == 2
        host.heal()
        assert reaches(host.address, 30)
    finally:
        namespace, devices = host.namespace, (host.root_device, host.inner_device)
        host.close()
        listener.wait(30)
    left = fault_network.leftovers()
    assert namespace not in left and not set(devices) & set(left), left
    assert listener.returncode is not None, "the process inside the namespace outlived it"


def test_close_is_idempotent_and_bounded(host):
    host.close()
    host.close()
    assert host.namespace not in fault_network.leftovers()
    assert host.rules() == []


def test_sweep_removes_what_a_killed_run_left_and_keeps_live_runs(host):
    dead = f"{fault_network.PREFIX}9p999999999"   # no such pid: a run killed by SIGKILL
    subprocess.run(["ip", "netns", "add", dead], check=True)
    try:
        assert dead in fault_network.sweep()
        assert dead not in fault_network.leftovers()
        assert host.namespace in fault_network.leftovers()   # this run's own is kept
    finally:
        subprocess.run(["ip", "netns", "del", dead], capture_output=True)


def test_a_connect_to_a_cut_off_host_is_unavailable_not_a_tls_failure(host):
    """gRPC reports a TCP connect that timed out as "tcp handshaker shutdown": a host cut off,
    which a client must retry (it was taken for a failed TLS handshake, never retried, so
    writes to a partitioned leader failed at once for 30 s instead of finding the new one)."""
    import pyarrow.flight as flight

    from tally.errors import AuthenticationError, UnavailableError
    from tally.wire.channel import FlightChannel
    from tally.wire.messages import remote_error

    text = ("failed to connect to all addresses; last error: UNKNOWN: ipv4:10.237.1.2:7777: "
            "tcp handshaker shutdown")
    assert type(remote_error(flight.FlightUnavailableError(text), "x")) is UnavailableError
    host.partition()
    for _ in range(3):   # each a new channel: a fresh connect to a host that answers nothing
        channel = FlightChannel(f"grpc://{host.address}:7777", None, timeout=2)
        try:
            with pytest.raises(UnavailableError) as raised:
                channel.action("ping", {})
            assert not isinstance(raised.value, AuthenticationError), raised.value
        finally:
            channel.close()

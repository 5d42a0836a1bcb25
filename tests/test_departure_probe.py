"""The departure probe ends the session of a server whose port refuses connections, and only
of such a server: a listening one, one whose process is paused (SIGSTOP), one that heartbeats
on time, or one at an address that cannot be reached or resolved keeps its session.

Real sockets and real processes; the probe's clock is injected (how late a heartbeat is), and
its pass is run by hand. A hypothesis test compares whole passes with a plain-Python model.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys

import pytest
from hypothesis import given, settings, strategies as st

from tally.server.coordinator.departure_probe import DepartureProbe, refuses_connections
from tally.server.membership import HeartbeatLiveness
from tests.conftest import zookeeper_chroot
from tests.waiting import wait_until


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def listening() -> socket.socket:
    """A listening socket that never accepts: the kernel completes connects on it anyway."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    return sock


def refusing() -> socket.socket:
    """A port bound and held but never listened on: connections to it are refused, and, unlike
    a port closed again, no other process can take it while the test runs."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    return sock


def address_of(sock: socket.socket) -> str:
    return f"grpc://127.0.0.1:{sock.getsockname()[1]}"


_HELD: list[socket.socket] = []


def closed_address() -> str:
    """The address of a port nothing listens on: a refusing() port held for the rest of the
    run (a port closed again could be taken by a parallel test and answer)."""
    sock = refusing()
    _HELD.append(sock)
    return address_of(sock)


def test_a_closed_port_refuses_and_a_listening_one_does_not():
    sock = listening()
    try:
        assert not refuses_connections(address_of(sock))
        assert not refuses_connections("127.0.0.1:" + str(sock.getsockname()[1]))
    finally:
        sock.close()
    assert refuses_connections(closed_address())


def test_an_unresolvable_or_malformed_address_tells_nothing():
    assert not refuses_connections("grpc://no-such-host.invalid:5000")
    assert not refuses_connections("grpc://127.0.0.1")


@pytest.mark.skipif(not hasattr(signal, "SIGSTOP"), reason="needs SIGSTOP")
def test_a_paused_process_still_accepts_connects():
    child = subprocess.Popen(
        [sys.executable, "-c",
         "import socket, sys, time\n"
         "s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen(16)\n"
         "print(s.getsockname()[1], flush=True)\n"
         "time.sleep(3600)\n"],
        stdout=subprocess.PIPE, text=True)
    try:
        port = int(child.stdout.readline())
        os.kill(child.pid, signal.SIGSTOP)
        liveness = HeartbeatLiveness(session_timeout=3600)
        clock = Clock()
        probe = DepartureProbe(liveness, lambda sid: None, clock=clock, start=False)
        liveness.heartbeat("paused", f"grpc://127.0.0.1:{port}")
        probe.heard("paused")
        clock.now += 60  # long silent: a suspect
        assert probe.check() == []
        assert "paused" in liveness.live()
    finally:
        child.kill()
        child.wait()
        child.stdout.close()


def test_a_departure_is_reported_once_and_a_later_heartbeat_makes_it_live_again():
    departed = []
    liveness = HeartbeatLiveness(session_timeout=3600)
    clock = Clock()
    probe = DepartureProbe(liveness, departed.append, clock=clock, start=False)
    gone = closed_address()
    liveness.heartbeat("ts-1", gone)
    probe.heard("ts-1")
    assert probe.check() == []  # heard just now: not a suspect, not probed
    clock.now += 60
    assert probe.check() == ["ts-1"]
    assert departed == ["ts-1"] and "ts-1" not in liveness.live()
    assert probe.check() == []
    sock = listening()  # restarted elsewhere: its heartbeat names the new address
    try:
        liveness.heartbeat("ts-1", address_of(sock))
        probe.heard("ts-1")
        clock.now += 60
        assert probe.check() == [] and "ts-1" in liveness.live()
    finally:
        sock.close()


def test_a_session_moved_to_another_address_is_not_ended_by_the_old_one():
    liveness = HeartbeatLiveness(session_timeout=3600)
    sock = listening()
    try:
        liveness.heartbeat("ts-1", address_of(sock))
        assert not liveness.end_session("ts-1", closed_address())
        assert "ts-1" in liveness.live()
    finally:
        sock.close()


SERVER = st.tuples(st.sampled_from(["listening", "closed", "unresolvable"]), st.booleans())


@settings(max_examples=40, deadline=None)
@given(servers=st.lists(SERVER, min_size=1, max_size=6), lateness=st.floats(0, 10))
def test_a_pass_ends_exactly_the_late_servers_that_refuse(servers, lateness):
    """Model: a server's session ends in a pass iff its last heartbeat is at least the suspect
    threshold old and its port refuses connections; every other session stays."""
    liveness = HeartbeatLiveness(session_timeout=3600)
    clock = Clock()
    departed = []
    probe = DepartureProbe(liveness, departed.append, suspect_after=1.5, clock=clock,
                           start=False)
    sockets = []
    expected = set()
    try:
        for i, (state, late) in enumerate(servers):
            sid = f"ts-{i}"
            if state == "listening":
                sockets.append(listening())
                address = address_of(sockets[-1])
            elif state == "closed":
                sockets.append(refusing())
                address = address_of(sockets[-1])
            else:
                address = f"grpc://ts-{i}.invalid:5000"
            liveness.heartbeat(sid, address)
            if not late:
                probe.heard(sid)
            if late and lateness >= 1.5 and state == "closed":
                expected.add(sid)
        # the late ones were last heard (or, never heard, the probe started) `lateness` ago
        clock.now += lateness
        for i, (_, late) in enumerate(servers):
            if not late:
                probe.heard(f"ts-{i}")
        ended = probe.check()
        assert set(ended) == expected == set(departed)
        assert set(liveness.live()) == {f"ts-{i}" for i in range(len(servers))} - expected
    finally:
        for sock in sockets:
            sock.close()


@pytest.mark.skipif(shutil.which("java") is None, reason="ZooKeeper needs Java")
def test_with_zookeeper_a_departure_deletes_the_live_node_of_that_address_only(zookeeper):
    """The coordinator ends a session by deleting the server's /live node, but not a node a
    restarted server wrote with its new address; a live server's registration writes its node
    again (a wrong departure heals)."""
    from tally.meta.zookeeper import ZooKeeperStore
    from tally.server.membership import EphemeralRegistration, ZooKeeperLiveness, live_path

    chroot = zookeeper_chroot(zookeeper)
    server_store = ZooKeeperStore(chroot, timeout=60)
    coordinator_store = ZooKeeperStore(chroot, timeout=60)
    liveness = ZooKeeperLiveness(coordinator_store)
    registration = EphemeralRegistration(server_store, live_path("ts-1"),
                                         {"address": "grpc://127.0.0.1:1"}, interval=0.1)
    try:
        wait_until(lambda: liveness.live() == {"ts-1": "grpc://127.0.0.1:1"}, "ts-1 live")
        assert not liveness.end_session("ts-1", "grpc://127.0.0.1:2")
        assert liveness.live() == {"ts-1": "grpc://127.0.0.1:1"}
        registration.close()  # the process is gone: nothing writes the node again
        registration = EphemeralRegistration(server_store, live_path("ts-1"),
                                             {"address": "grpc://127.0.0.1:1"}, interval=3600)
        assert liveness.end_session("ts-1", "grpc://127.0.0.1:1")
        assert "ts-1" not in liveness.live()
        assert coordinator_store.get(live_path("ts-1")) is None
    finally:
        registration.close()
        liveness.close()
        coordinator_store.close()
        server_store.close()

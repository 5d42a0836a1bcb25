"""Noticing a tablet server whose process is gone, without waiting out its session.

A session timeout must outlast the pauses of a busy machine, so on its own it makes every
failover wait seconds for a process that died at once (kill -9, a crash, the OOM killer, a clean
stop). A process that is gone leaves a sign that a slow one never does: its host refuses
connections to its port (nothing listens there, the kernel answers a connect with a reset). A
live server that is busy, paused (SIGSTOP, a long GC) or swapping keeps its listening socket,
and the kernel completes connects on it without the process running: a refused connect never
comes from a live server.

So the coordinator connects (TCP only, nothing sent) to every live server that missed a
heartbeat, and ends the session of one that refuses, as if it had timed out. Anything else (the
connect succeeds, times out, the host is unreachable, its name does not resolve) changes
nothing and the session timeout decides, as before: a partition or a dead host is not a refusal.
Ending a session early is safe even if it were wrong: liveness only picks leaders, a deposed
leader is fenced by its leader epoch whatever deposed it, and a live server's next heartbeat
(or its ZooKeeper registration) makes it live again.
"""

from __future__ import annotations

import errno
import logging
import socket
import threading
import time
from typing import Callable
from urllib.parse import urlsplit

from tally.server.settings import HEARTBEAT_INTERVAL

log = logging.getLogger(__name__)

PROBE_INTERVAL = 0.25        # seconds between looks for servers that missed a heartbeat
CONNECT_TIMEOUT = 0.5        # a probe that cannot tell within this long tells nothing
# A heartbeat this late makes a server a suspect (only a probe decides): a heartbeat and a half
SUSPECT_AFTER = 1.5 * HEARTBEAT_INTERVAL


def refuses_connections(address: str, timeout: float = CONNECT_TIMEOUT) -> bool:
    """True only when the host of `address` ('grpc://host:port', 'grpc+tls://host:port')
    refuses a TCP connection to its port: nothing listens there. False when the connect
    succeeds or fails any other way (a timeout, an unreachable host, a name that does not
    resolve): those do not say that the process is gone."""
    parts = urlsplit(address if "://" in address else "grpc://" + address)
    if parts.hostname is None or parts.port is None:
        return False
    try:
        with socket.create_connection((parts.hostname, parts.port), timeout=timeout):
            return False
    except ConnectionRefusedError:
        return True
    except OSError as e:
        return e.errno == errno.ECONNREFUSED


class DepartureProbe:
    """Probes the live servers that missed a heartbeat and ends the sessions of those whose
    port refuses connections; `departed(server_id)` is called after each one (the coordinator
    runs its elections at once)."""

    def __init__(self, liveness, departed: Callable[[str], None],
                 suspect_after: float = SUSPECT_AFTER, interval: float = PROBE_INTERVAL,
                 probe: Callable[[str], bool] = refuses_connections,
                 clock: Callable[[], float] = time.monotonic, start: bool = True) -> None:
        """`clock`: when heartbeats were heard and how late they are; `start`: run the
        probing thread (without it, `check()` is called by hand)."""
        self._liveness = liveness
        self._departed = departed
        self._suspect_after = suspect_after
        self._interval = interval
        self._probe = probe
        self._clock = clock
        self._heard: dict[str, float] = {}
        self._started = clock()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="departure probe", daemon=True)
        if start:
            self._thread.start()

    def heard(self, server_id: str) -> None:
        """A heartbeat arrived from `server_id`."""
        with self._lock:
            self._heard[server_id] = self._clock()

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            try:
                self.check()
            except Exception:  # the probe must outlive anything; the timeout still decides
                log.exception("departure probe failed (retried)")

    def check(self) -> list[str]:
        """One pass; the servers whose sessions it ended."""
        now = self._clock()
        with self._lock:
            heard = dict(self._heard)
        ended = []
        for server_id, address in self._liveness.live().items():
            if now - heard.get(server_id, self._started) < self._suspect_after:
                continue
            if not self._probe(address):
                continue
            if self._liveness.end_session(server_id, address):
                log.warning("tablet server %s at %s refuses connections (its process is gone): "
                            "its session ends now, not after its timeout", server_id, address)
                ended.append(server_id)
                self._departed(server_id)
        return ended

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)

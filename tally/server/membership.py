"""Which tablet servers are alive, seen from the coordinator, and how a tablet server says so.

Two sources of liveness, one interface:

- With ZooKeeper, each tablet server keeps an *ephemeral* node `/live/<server>` holding its
  address; ZooKeeper deletes it when the server's session dies, and the coordinator watches the
  children of `/live`, so it notices joins and departures without any traffic of its own.
- Without ZooKeeper (embedded store), tablet servers send a heartbeat action to the coordinator
  every second, and a server silent for `session_timeout` seconds is considered gone: the same
  session semantics, kept in the coordinator's memory.

In both modes tablet servers also heartbeat the coordinator, which answers with the table ids
they host that no longer exist, so a drop that happened while a server was down is cleaned up.
"""

from __future__ import annotations

import logging
import threading
import time

from tally.errors import AlreadyExistsError, TallyError
from tally.meta import MetadataStore, join_path, node_name, text_of

log = logging.getLogger(__name__)

LIVE = "/live"
COORDINATOR = "/coordinator"


class HeartbeatLiveness:
    """Liveness from heartbeats: a server is live while it heartbeats within the timeout."""

    def __init__(self, session_timeout: float = 6.0) -> None:
        self.session_timeout = session_timeout
        self._seen: dict[str, tuple[str, float]] = {}
        self._lock = threading.Lock()

    def heartbeat(self, server_id: str, address: str) -> None:
        with self._lock:
            self._seen[server_id] = (address, time.monotonic())

    def live(self) -> dict[str, str]:
        now = time.monotonic()
        with self._lock:
            return {sid: addr for sid, (addr, at) in self._seen.items()
                    if now - at <= self.session_timeout}

    def end_session(self, server_id: str, address: str) -> bool:
        """End a server's session before its timeout (its process is gone), unless it has
        heartbeated from another address since; whether it was live and now is not."""
        with self._lock:
            seen = self._seen.get(server_id)
            if seen is None or seen[0] != address:
                return False
            del self._seen[server_id]
        return True

    def close(self) -> None:
        pass


class ZooKeeperLiveness:
    """Liveness from ZooKeeper's ephemeral nodes under /live, kept current by a child watch."""

    def __init__(self, store: MetadataStore) -> None:
        self._store = store
        self._live: dict[str, str] = {}
        self._lock = threading.Lock()
        store.watch_children(LIVE, self._changed)

    def _changed(self, children: list[str]) -> None:
        live = {}
        for child in children:
            try:
                node = self._store.get(join_path(LIVE, child))
            except TallyError as e:
                # ZooKeeper went away mid-read: keep what we knew; the server's next heartbeat
                # re-reads the children once ZooKeeper is back.
                log.warning("cannot read %s: %s", join_path(LIVE, child), e)
                return
            if node is not None:
                live[text_of(child)] = node.value["address"]
        with self._lock:
            joined = set(live) - set(self._live)
            left = set(self._live) - set(live)
            self._live = live
        if joined or left:
            log.info("tablet servers joined %s left %s", sorted(joined), sorted(left))

    def heartbeat(self, server_id: str, address: str) -> None:
        """Heartbeats carry no liveness here (ZooKeeper does), but a heartbeat from a server
        not known live at that address re-reads /live: a watch event missed or failed during
        a ZooKeeper outage must not leave a registered server not live for good."""
        with self._lock:
            known = self._live.get(server_id)
        if known != address:
            self._changed(self._store.children(LIVE))

    def live(self) -> dict[str, str]:
        with self._lock:
            return dict(self._live)

    def end_session(self, server_id: str, address: str) -> bool:
        """Delete a server's /live node before ZooKeeper expires its session (its process is
        gone), unless the node names another address by now (a restarted server's); a live
        server's registration would create it again within its interval."""
        path = live_path(server_id)
        node = self._store.get(path)
        if node is None or node.value.get("address") != address:
            return False
        try:
            deleted = self._store.delete(path, version=node.version)
        except TallyError as e:
            log.warning("cannot end the session of %s: %s", server_id, e)
            return False
        if deleted:
            self._changed(self._store.children(LIVE))
        return bool(deleted)

    def close(self) -> None:
        pass


class EphemeralRegistration:
    """Keeps an ephemeral node (with our address) alive in ZooKeeper, re-creating it after a
    session expiry; used for `/live/<server>` and for `/coordinator`."""

    def __init__(self, store: MetadataStore, path: str, value: dict,
                 interval: float = 0.5) -> None:
        self._store = store
        self._path = path
        self._value = value
        self._interval = interval
        self._stop = threading.Event()
        self._ensure(replace=True)
        self._thread = threading.Thread(target=self._run, name=f"register {path}", daemon=True)
        self._thread.start()

    def _ensure(self, replace: bool = False) -> None:
        node = self._store.get(self._path)
        if node is not None and node.value == self._value and not replace:
            return
        if node is not None:
            # A node left by our own previous incarnation (killed before its session expired)
            # or with a stale address: ours now.
            self._store.delete(self._path)
        try:
            self._store.create(self._path, self._value, ephemeral=True)
        except AlreadyExistsError:
            pass

    def _run(self) -> None:
        # The thread must outlive any failure: if it died, the server would stay unregistered
        # (not live) for good after the next ZooKeeper outage.
        while not self._stop.wait(self._interval):
            try:
                self._ensure()
            except TallyError as e:
                log.warning("cannot keep %s registered: %s", self._path, e)
            except Exception:
                log.exception("cannot keep %s registered", self._path)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        try:
            self._store.delete(self._path)
        except TallyError:
            pass


def live_path(server_id: str) -> str:
    return join_path(LIVE.strip("/"), node_name(server_id))

"""ZooKeeper outages and lost sessions are transient for the metadata store and for a tablet
server's registration, never fatal.

Seen in a CI run under load: a tablet server's ZooKeeper session expired across an outage,
kazoo's retry gave up after its deadline with its own RetryFailedError, and that exception
killed the thread keeping the server registered under /live. The server then stayed "not
live" for good and every job writing its buckets failed. A private ZooKeeper, since stopping
the session one would disturb other tests.
"""

from __future__ import annotations

import shutil

import pytest
from kazoo.client import KazooClient
from kazoo.handlers.threading import KazooTimeoutError
from kazoo.exceptions import ConnectionLoss

from tally.errors import UnavailableError
from tally.meta.zookeeper import ZooKeeperStore
from tally.server.membership import EphemeralRegistration, ZooKeeperLiveness, live_path
from tests.waiting import wait_until
from tests.zookeeper_server import running_zookeeper

pytestmark = pytest.mark.skipif(shutil.which("java") is None,
                                reason="ZooKeeper needs Java (make test installs it)")


@pytest.fixture(scope="module")
def zookeeper(tmp_path_factory):
    with running_zookeeper(str(tmp_path_factory.mktemp("zookeeper-outage"))) as server:
        yield server


def test_a_retry_past_its_deadline_is_unavailable_not_a_kazoo_error(zookeeper):
    """kazoo's retry, as the store configures it, ends an operation that keeps losing its
    connection with RetryFailedError; callers (and the client's retry) see UnavailableError."""
    store = ZooKeeperStore(f"{zookeeper.hosts}/outage-a", timeout=60, retry_deadline=0.5)
    losses = []

    def always_lost():
        losses.append(1)
        raise ConnectionLoss()

    try:
        with pytest.raises(UnavailableError, match="ZooKeeper unavailable"):
            store._call(always_lost)
        assert len(losses) > 1  # retried before giving up
    finally:
        store.close()


def test_a_server_whose_session_expired_registers_again_and_is_seen_live(zookeeper):
    """ZooKeeper stopped past the store's retry deadline, then the server's session expired
    (ZooKeeper's own way to expire a session from outside: a second client opens it with its
    id and password and closes it). The ephemeral node goes with the session; the
    registration re-creates it in a new session, and the coordinator's view follows."""
    server_store = ZooKeeperStore(f"{zookeeper.hosts}/outage-b", timeout=60,
                                  retry_deadline=0.5, session_timeout=2.0)
    coordinator_store = ZooKeeperStore(f"{zookeeper.hosts}/outage-b", timeout=60,
                                       retry_deadline=0.5, session_timeout=2.0)
    liveness = ZooKeeperLiveness(coordinator_store)
    registration = EphemeralRegistration(server_store, live_path("ts-1"),
                                         {"address": "grpc://here"}, interval=0.1)
    try:
        wait_until(lambda: liveness.live() == {"ts-1": "grpc://here"}, "ts-1 seen live")
        zookeeper.stop()
        zookeeper.start()
        expire_session(zookeeper, server_store)
        assert wait_until(lambda: _value(coordinator_store, live_path("ts-1")),
                          "the registration re-created in a new session") \
            == {"address": "grpc://here"}
        liveness.heartbeat("ts-1", "grpc://here")  # what the server's next heartbeat does
        wait_until(lambda: liveness.live() == {"ts-1": "grpc://here"}, "ts-1 seen live again")
    finally:
        registration.close()
        liveness.close()
        coordinator_store.close()
        server_store.close()


def expire_session(zookeeper, store) -> None:
    session_id, password = wait_until(lambda: store.kazoo.client_id, "the store reconnected")
    intruder = KazooClient(hosts=zookeeper.hosts, client_id=(session_id, password))
    try:
        intruder.start(timeout=60)
    except KazooTimeoutError:
        # on a loaded machine the 2 s session may expire before the intruder opens it, and
        # ZooKeeper never reopens an expired session: the expiry wanted happened anyway
        pass
    finally:
        intruder.stop()
        intruder.close()
    wait_until(lambda: (store.kazoo.client_id or (session_id,))[0] != session_id,
               "the store's session replaced", every=0.1)


def _value(store, path):
    try:
        node = store.get(path)
    except UnavailableError:
        return None
    return None if node is None else node.value

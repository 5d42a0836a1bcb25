"""Shared fixtures: one real ZooKeeper per test run, and the choice of metadata store.

`zookeeper` starts Debian's ZooKeeper once per session (lazily: runs that never ask for it never
start java). `metadata_store` is parametrized over "embedded" and "zookeeper" and yields the
`zookeeper=` argument for servers and LocalCluster: None for the embedded store, else a connect
string with a fresh chroot so tests never see each other's nodes.
"""

from __future__ import annotations

import uuid

import pytest

from tests.zookeeper_server import ZooKeeperServer, running_zookeeper

METADATA_STORES = ["embedded", "zookeeper"]


@pytest.fixture(scope="session")
def zookeeper(tmp_path_factory):
    """A running ZooKeeperServer (`.hosts`, `.stop()`, `.start()`, `.restart()`)."""
    with running_zookeeper(str(tmp_path_factory.mktemp("zookeeper"))) as server:
        yield server


def zookeeper_chroot(server: ZooKeeperServer) -> str:
    """A connect string with a chroot no other test uses."""
    return f"{server.hosts}/tally-test-{uuid.uuid4().hex[:12]}"


@pytest.fixture(params=METADATA_STORES)
def metadata_store(request):
    """None (embedded store) or a ZooKeeper connect string with a fresh chroot."""
    if request.param == "embedded":
        return None
    return zookeeper_chroot(request.getfixturevalue("zookeeper"))

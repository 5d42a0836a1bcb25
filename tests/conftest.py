"""Shared fixtures: one real ZooKeeper per test run, and the choice of metadata store.

`zookeeper` starts Debian's ZooKeeper once per run (lazily: runs that never ask for it never
start java). Under pytest-xdist the controller starts it before the workers and hands them its
address, so the workers share it too. `metadata_store` is parametrized over "embedded" and
"zookeeper" and yields the `zookeeper=` argument for servers and LocalCluster: None for the
embedded store, else a connect string with a fresh chroot so tests never see each other's nodes.
"""

from __future__ import annotations

import os
import pathlib
import shutil
import tempfile
import uuid

import pytest

from tests.zookeeper_server import ZooKeeperServer, running_zookeeper

SHARED_ZOOKEEPER = "TALLY_TEST_ZOOKEEPER"   # host:port of the run's ZooKeeper, for xdist workers

METADATA_STORES = ["embedded", "zookeeper"]


class SharedZooKeeper:
    """The ZooKeeper an xdist controller started: only its address (tests that stop and start
    a ZooKeeper run a private one)."""

    def __init__(self, hosts: str) -> None:
        self.hosts = hosts


@pytest.fixture(scope="session")
def zookeeper(tmp_path_factory):
    """A running ZooKeeper (`.hosts`): the run's shared one under xdist, else one started here."""
    if os.environ.get(SHARED_ZOOKEEPER):
        yield SharedZooKeeper(os.environ[SHARED_ZOOKEEPER])
        return
    with running_zookeeper(str(tmp_path_factory.mktemp("zookeeper"))) as server:
        yield server


def pytest_configure(config):
    """The controller of an xdist run starts the run's one ZooKeeper before its workers start
    (they inherit its address through the environment)."""
    if hasattr(config, "workerinput") or not getattr(config.option, "numprocesses", None) \
            or os.environ.get(SHARED_ZOOKEEPER):
        return
    data_dir = tempfile.mkdtemp(prefix="tally-test-zookeeper-")
    server = ZooKeeperServer(data_dir)
    server.start()
    config.tally_zookeeper = server
    os.environ[SHARED_ZOOKEEPER] = server.hosts


def pytest_unconfigure(config):
    server = getattr(config, "tally_zookeeper", None)
    if server is not None:
        server.stop()
        os.environ.pop(SHARED_ZOOKEEPER, None)
        shutil.rmtree(server.data_dir, ignore_errors=True)


def zookeeper_chroot(server: ZooKeeperServer) -> str:
    """A connect string with a chroot no other test uses."""
    return f"{server.hosts}/tally-test-{uuid.uuid4().hex[:12]}"


@pytest.fixture(params=METADATA_STORES)
def metadata_store(request):
    """None (embedded store) or a ZooKeeper connect string with a fresh chroot."""
    if request.param == "embedded":
        return None
    return zookeeper_chroot(request.getfixturevalue("zookeeper"))


SPARK_TESTS = pathlib.Path(__file__).parent / "spark"


def pytest_collection_modifyitems(config, items):
    """Under pytest-xdist (`--dist loadgroup`), every Spark test goes to one worker: they share
    that worker's one SparkSession and one Spark test cluster, and two JVMs of Spark jobs at
    once would only slow each other down on 2 cores. They come first, so the longest group
    starts at once while the other workers share the rest."""
    spark = [item for item in items if SPARK_TESTS in pathlib.Path(str(item.fspath)).parents]
    for item in spark:
        item.add_marker(pytest.mark.xdist_group("spark"))
    ids = {id(item) for item in spark}
    items[:] = spark + [item for item in items if id(item) not in ids]

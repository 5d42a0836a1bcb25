"""Cluster fixtures: one LocalCluster per test module and metadata store.

`cluster` is module-scoped and parametrized over the two metadata stores, so every module's
tests run against both, starting just two clusters per module (a cluster starts in about a
second; tests use fresh table names instead of fresh clusters). `secured_cluster` is the same
with credentials: it writes its own auth file, with a cluster credential and a token per role.
"""

from __future__ import annotations

import contextlib
import itertools

import pytest

from tally.server import LocalCluster
from tests.conftest import METADATA_STORES, zookeeper_chroot

_names = itertools.count()


@pytest.fixture(scope="module", params=METADATA_STORES)
def cluster(request, tmp_path_factory):
    zk = None
    if request.param == "zookeeper":
        zk = zookeeper_chroot(request.getfixturevalue("zookeeper"))
    data_dir = tmp_path_factory.mktemp(f"cluster-{request.param}")
    # A small memory budget: the buckets of every test share it, so row buffers keep being
    # flushed to RocksDB by other buckets' writes while tests write, read, undo and truncate.
    with LocalCluster(str(data_dir), tablet_servers=2, zookeeper=zk,
                      max_batch_bytes=6 << 20, memory_budget="1mb") as c:
        c.store_kind = request.param
        yield c


@pytest.fixture(scope="module", params=METADATA_STORES)
def secured_cluster(request, tmp_path_factory):
    zk = None
    if request.param == "zookeeper":
        zk = zookeeper_chroot(request.getfixturevalue("zookeeper"))
    data_dir = tmp_path_factory.mktemp(f"secured-{request.param}")
    with LocalCluster(str(data_dir), tablet_servers=2, zookeeper=zk, authenticate=True) as c:
        c.store_kind = request.param
        yield c


@pytest.fixture
def conn(cluster):
    from tally import client

    with client.connect(cluster.url, retry_timeout=60) as c:
        yield c


@pytest.fixture
def table_name():
    """A table name no other test of the run uses."""
    return f"default.t{next(_names)}"


@contextlib.contextmanager
def private_cluster(tmp_path_factory, database: str):
    """A module's own 2-server cluster (embedded metadata, a 1 MB memory budget, so row
    buffers keep flushing) and a connection with `database` created: (cluster, connection)."""
    from tally import client

    with LocalCluster(str(tmp_path_factory.mktemp(database)), tablet_servers=2,
                      memory_budget="1mb") as c, \
            client.connect(c.url, retry_timeout=60) as conn:
        conn.admin.create_database(database, ignore_if_exists=True)
        yield c, conn

"""Lake fixtures: one LocalCluster with a lake root per test module (the embedded metadata
store, one tablet server); tests drive tiering rounds themselves or start tiering processes."""

from __future__ import annotations

import itertools

import pytest

from tally.server import LocalCluster

_names = itertools.count()


@pytest.fixture(scope="module")
def lake_cluster(tmp_path_factory):
    root = tmp_path_factory.mktemp("lake-cluster")
    with LocalCluster(str(root / "cluster"), tablet_servers=1,
                      datalake_dir=str(root / "lake"), tier_timeout=3.0) as cluster:
        cluster.lake_root = str(root / "lake")
        yield cluster


@pytest.fixture
def lake_conn(lake_cluster):
    from tally import client

    with client.connect(lake_cluster.url, retry_timeout=60) as conn:
        yield conn


@pytest.fixture
def lake_table_name():
    """A table name no other lake test of the run uses."""
    return f"default.lake{next(_names)}"

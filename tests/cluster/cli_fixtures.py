"""Fixtures of modules that run `tally` commands against their own module-scoped `cluster`:
import them into the module (`from tests.cluster.cli_fixtures import conn, url`)."""

from __future__ import annotations

import pytest

from tally import client


@pytest.fixture(scope="module")
def conn(cluster):
    with client.connect(cluster.url, retry_timeout=60) as c:
        yield c


@pytest.fixture(autouse=True)
def url(cluster, monkeypatch):
    """Every command finds the cluster through $TALLY_URL (the tests of --url give it)."""
    monkeypatch.setenv("TALLY_URL", cluster.url)
    monkeypatch.delenv("TALLY_TOKEN", raising=False)
    monkeypatch.delenv("TALLY_TOKEN_FILE", raising=False)
    return cluster.url

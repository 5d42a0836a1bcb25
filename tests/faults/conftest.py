"""One fault cluster per test module: 3 tablet-server processes at replication factor 3 (min
in-sync replicas 2), tablet server 2 in its own network namespace, a lock clock the owners'
takeovers move. Every namespace, veth pair, iptables rule and process is removed when the
module ends, also after a failure, and the module then checks that nothing is left."""

from __future__ import annotations

import pytest

from tally.bench import fault_network
from tally.server.clock import SkewedClock


@pytest.fixture(scope="module")
def faults(tmp_path_factory):
    from tally.bench.fault_cluster import FaultCluster

    reason = fault_network.available()
    if reason:
        pytest.skip(reason)
    root = tmp_path_factory.mktemp("faults")
    clock_file = str(root / "lock-clock")
    cluster = FaultCluster(str(root / "cluster"), session_timeout=3.0,
                           lock_clock_file=clock_file)
    namespace = cluster.net.namespace
    try:
        cluster.start()
        cluster.clock = SkewedClock(clock_file)
        yield cluster
    finally:
        cluster.close()
        assert namespace not in fault_network.leftovers(), \
            f"network namespace {namespace} was left behind"

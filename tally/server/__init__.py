"""Tally servers: the coordinator, tablet servers, their Flight service and LocalCluster.

`tally.LocalCluster(data_dir, tablet_servers=2, zookeeper=None)` starts a real cluster of
processes; `tally serve` (tally.server.process) runs one server. The wire they speak with
clients is tally.wire, below both; importing this package stays cheap.
"""

from __future__ import annotations

__all__ = ["LocalCluster"]


def __getattr__(name: str):
    if name == "LocalCluster":
        from tally.server.local_cluster import LocalCluster

        return LocalCluster
    raise AttributeError(f"module 'tally.server' has no attribute {name!r}")

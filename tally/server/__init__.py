"""Tally servers: the coordinator, tablet servers, their Flight transport and LocalCluster.

`server.LocalCluster(data_dir, tablet_servers=2, zookeeper=None)` starts a real cluster of
processes; `tally serve` (server/process.py) runs one server. Clients import only the small
shared modules (bucketing, routing, protocol, channel); importing this package stays cheap.
"""

from __future__ import annotations

__all__ = ["LocalCluster"]


def __getattr__(name: str):
    if name == "LocalCluster":
        from tally.server.local_cluster import LocalCluster

        return LocalCluster
    raise AttributeError(f"module 'server' has no attribute {name!r}")

"""A tablet server's address changes only by that server: heartbeats and hijacks.

A heartbeat needs the cluster credential, so a client (of any role) or a rogue without it cannot
move a server or make a phantom one live. Even the cluster credential cannot move a live server
while its current address still answers as that server, and a heartbeat that fails changes
nothing, liveness included. A server restarted on another port still moves: its old address no
longer answers.
"""

from __future__ import annotations

import pytest

from tally import client
from tally.errors import InvalidInputError, PermissionDeniedError
from tally.wire.channel import FlightChannel

ROGUE = "grpc://127.0.0.1:9"  # nothing listens there


def servers(conn) -> dict:
    return {s["server_id"]: (s["address"], s["live"]) for s in conn.admin.list_servers()}


def heartbeat(address: str, secret: str | None, body: dict):
    channel = FlightChannel(address, secret)
    try:
        return channel.action("heartbeat", body)
    finally:
        channel.close()


def test_a_heartbeat_cannot_hijack_a_live_server(secured_cluster):
    cluster = secured_cluster
    real = cluster.tablet_servers[0].info["server_id"]
    with client.connect(cluster.url, token=cluster.tokens["admin"]) as conn:
        before = servers(conn)
        for role in ("read", "write", "admin"):
            with pytest.raises(PermissionDeniedError, match="requires role cluster"):
                heartbeat(cluster.url, cluster.tokens[role], {"server_id": real, "address": ROGUE})
        with pytest.raises(PermissionDeniedError, match=f"tablet server {real} is live at"):
            heartbeat(cluster.url, cluster.cluster_token, {"server_id": real, "address": ROGUE})
        assert servers(conn) == before
        # Fresh clients are routed to the real servers, and their writes and reads reach them.
        name = _table(conn)
        real_addresses = {h.address for h in cluster.tablet_servers}
        for i in range(5):
            with client.connect(cluster.url, token=cluster.tokens["write"]) as fresh:
                assert {r.address for r in _routes(fresh, name)} <= real_addresses
                with fresh.table(name).upsert_writer() as w:
                    w.upsert([{"k": k, "v": 1} for k in range(20)])
        assert conn.table(name).lookup({"k": 3})["v"] == 5


def test_a_failed_heartbeat_changes_nothing(secured_cluster):
    cluster = secured_cluster
    with client.connect(cluster.url, token=cluster.tokens["read"]) as conn:
        before = servers(conn)
        with pytest.raises(InvalidInputError, match="table_ids"):
            heartbeat(cluster.url, cluster.cluster_token,
                      {"server_id": "ts-phantom", "address": ROGUE, "table_ids": ["1"]})
        with pytest.raises(PermissionDeniedError):
            heartbeat(cluster.url, cluster.tokens["admin"],
                      {"server_id": "ts-phantom", "address": ROGUE})
        assert servers(conn) == before and "ts-phantom" not in servers(conn)


def test_a_restarted_server_moves_to_its_new_address(secured_cluster):
    cluster = secured_cluster
    sid = cluster.tablet_servers[1].info["server_id"]
    cluster.restart_tablet_server(1)  # waits until the coordinator lists it at its new address
    new = cluster.tablet_servers[1].address
    with client.connect(cluster.url, token=cluster.tokens["read"]) as conn:
        assert servers(conn)[sid] == (new, True)


_tables = iter(range(10**6))


def _table(conn) -> str:
    import pyarrow as pa

    from merge_engine import Schema, TableDescriptor

    name = f"default.identity{next(_tables)}"
    schema = (Schema.builder().column("k", pa.int64()).agg_column("v", pa.int64(), "sum")
              .primary_key("k").build())
    conn.admin.create_table(name, TableDescriptor(schema, bucket_count=4, properties={
        "table.merge-engine": "aggregation"}))
    return name


def _routes(conn, name: str):
    meta = conn.table_meta(name, refresh=True)
    return [meta.route(p, b) for p, b in meta.all_buckets()]

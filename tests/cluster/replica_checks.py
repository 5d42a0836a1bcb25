"""Checks the replication tests share: who leads, whether every copy is in sync, and whether
the copies of a bucket hold the same rows and changelog (asked of each server)."""

from __future__ import annotations

from tally.wire.channel import FlightChannel
from tests.waiting import wait_until


def restart_stopped_servers(cluster) -> None:
    """Leave every tablet server running: resume a paused one, start a killed one (what each
    test of a shared cluster owes the next)."""
    import os
    import signal

    for i, handle in enumerate(cluster.tablet_servers):
        if handle.proc is not None and handle.running:
            try:
                os.kill(handle.proc.pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
        if not handle.running:
            cluster.start_tablet_server(i)


def leader_index(cluster, server_id: str) -> int:
    """The LocalCluster index of the tablet server `server_id`."""
    for i, handle in enumerate(cluster.tablet_servers):
        if handle.info.get("server_id") == server_id:
            return i
    raise AssertionError(f"no tablet server {server_id} in the cluster")


def wait_fully_in_sync(conn, name: str, cluster=None) -> dict:
    """Until every bucket of `name` has a leader and all its copies in sync; with `cluster`,
    also until every copy is on a running server of it (a server just killed still counts as
    in sync until its session expires, and a wiped one's old identity until it is replaced)."""
    def done():
        running = set() if cluster is None else \
            {h.info.get("server_id") for h in cluster.tablet_servers if h.running}
        replicas = conn.admin.bucket_replicas(name)
        ok = all(r["leader"] is not None and sorted(r["isr"]) == sorted(r["replicas"])
                 and (cluster is None or set(r["replicas"]) <= running)
                 for r in replicas.values())
        return replicas if ok else None

    return wait_until(done, f"every bucket of {name} fully in sync")


def copies_of(cluster, table_id: int, partition_id: int, bucket: int,
              conn=None, name: str | None = None) -> list[str]:
    """The addresses of the servers holding a copy of the bucket (by the coordinator)."""
    from tally import connect

    owner = conn or connect(cluster.url)
    try:
        table = name or next(m for m in owner._meta if owner._meta[m].table_id == table_id)
        partition = None
        r = owner.admin.bucket_replicas(table)[(partition, bucket)]
    finally:
        if conn is None:
            owner.close()
    return [cluster.tablet_servers[leader_index(cluster, s)].address for s in r["replicas"]]


def digest(cluster, address: str, table_id: int, partition_id: int, bucket: int) -> dict:
    channel = FlightChannel(address, cluster.cluster_token, timeout=60, tls=cluster.tls)
    try:
        return channel.action("replica_digest", {"table_id": table_id,
                                                 "partition_id": partition_id,
                                                 "bucket": bucket})
    finally:
        channel.close()


def replica_rows_equal(cluster, conn, name: str, bucket: int, addresses: list[str],
                       partition_id: int = 0) -> list[dict]:
    """Every copy reaches the same log end, then holds the same rows and (copies whose logs
    start at the same offset) the same changelog, and its rows equal the replay of its
    changelog."""
    table_id = conn.table_meta(name).table_id

    def same():
        found = [digest(cluster, a, table_id, partition_id, bucket) for a in addresses]
        ends = {d["log_end"] for d in found}
        return found if len(ends) == 1 else None

    found = wait_until(same, f"every copy of bucket {bucket} of {name} at one log end")
    first = found[0]
    for d in found[1:]:
        assert d["rows"] == first["rows"], (first, d)
        # a copy rebuilt from a remote snapshot keeps the log that snapshot had: it may start
        # later than the others' (the changelog digest covers [log start, log end))
        if d["log_start"] == first["log_start"]:
            assert d["changelog"] == first["changelog"], (first, d)
    for d in found:
        assert d["replay_equal"] in (True, None), d
    return found

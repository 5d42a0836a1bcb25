"""A leader killed with kill -9 is replaced without waiting out its session: the coordinator
finds its port refusing connections. The session here is an hour, so only that can have moved
the leadership; a later write is acknowledged by the new leader and no acknowledged write is
lost. A paused leader (SIGSTOP) still accepts connects, so this never deposes one: the unit
tests of the probe show it, and the zombie-leader test shows the epoch fences one that is.

Embedded metadata (its liveness is the session timeout alone); three servers, three copies. The
coordinator's election grace after its start (a session and a second: an hour here) ends once
every known server was heard, or no election could happen in this test at all.
"""

from __future__ import annotations

import pyarrow as pa
import pytest

import tally
from tally.server import LocalCluster
from tests.cluster.replica_checks import leader_index, wait_fully_in_sync

HOUR = 3600.0


@pytest.fixture(scope="module")
def trio(tmp_path_factory):
    data_dir = tmp_path_factory.mktemp("departures")
    with LocalCluster(str(data_dir), tablet_servers=3, session_timeout=HOUR) as cluster:
        yield cluster


def write(conn, name: str, keys, amount: int) -> None:
    with conn.table(name).upsert_writer() as w:
        w.upsert(pa.table({"k": pa.array(keys, pa.int64()),
                           "total": pa.array([amount] * len(keys), pa.int64())}))
        w.flush()


def totals(conn, name: str) -> dict:
    return {row["k"]: row["total"] for row in conn.table(name).to_arrow().to_pylist()}


def test_a_killed_leader_is_replaced_long_before_its_session_ends(trio):
    with tally.connect(trio.url, retry_timeout=300) as conn:
        schema = (tally.Schema.builder().column("k", pa.int64())
                  .agg_column("total", pa.int64(), tally.AggFunction.SUM)
                  .primary_key("k").build())
        name = "default.departed"
        conn.admin.create_table(name, tally.TableDescriptor(
            schema, bucket_count=2, properties={"table.merge-engine": "aggregation"}))
        keys = list(range(40))
        write(conn, name, keys, 1)
        wait_fully_in_sync(conn, name)
        before = conn.admin.bucket_replicas(name)[(None, 0)]
        victim = leader_index(trio, before["leader"])
        trio.kill_tablet_server(victim)

        write(conn, name, keys, 10)  # waits for the election, lands on the new leaders

        after = conn.admin.bucket_replicas(name)[(None, 0)]
        assert after["leader"] != before["leader"]
        assert after["leader"] in before["isr"]
        assert after["leader_epoch"] > before["leader_epoch"]
        assert before["leader"] not in after["isr"]
        live = {s["server_id"]: s["live"] for s in conn.admin.list_servers()}
        assert live[before["leader"]] is False
        assert totals(conn, name) == {k: 11 for k in keys}

        trio.start_tablet_server(victim)  # back under the same identity, as a follower
        wait_fully_in_sync(conn, name)
        write(conn, name, keys, 100)
        assert totals(conn, name) == {k: 111 for k in keys}

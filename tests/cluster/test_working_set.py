"""The working set of one large legal write, measured on a real tablet server process.

One request of the ingest benchmark's rows (tally.bench.workload: 1.45 million rows over
100,000 keys, about 58 MB as Arrow), just under the server's default 64 MiB request limit, is
sent straight to the tablet server of its bucket. The growth of the server's peak resident
memory (VmHWM, reset before the write) must stay within 4x the request: it was 6x before large
writes were merged a slice of keys at a time (3x since).
The rows must land exactly as the same rows written through the client's small requests.
"""

from __future__ import annotations

import pyarrow as pa
import pytest

import tally
from tally import client
from tally.bench.workload import Workload, table_descriptor
from tally.server import LocalCluster
from tally.server.settings import DEFAULT_MAX_BATCH_BYTES
from tally.wire.channel import FlightChannel
from tests.cluster.test_request_limits import PeakGrowth

ROWS, KEYS = 1_450_000, 100_000


@pytest.fixture(scope="module")
def big_cluster(tmp_path_factory):
    with LocalCluster(str(tmp_path_factory.mktemp("working-set")), tablet_servers=1) as c:
        yield c


def test_one_large_write_grows_the_server_by_at_most_4x_its_size(big_cluster):
    rows = pa.Table.from_batches([Workload(rows=ROWS, keys=KEYS, batch=ROWS).make_batch(0)])
    assert 50 << 20 < rows.nbytes < DEFAULT_MAX_BATCH_BYTES
    d = table_descriptor()
    with client.connect(big_cluster.url, retry_timeout=60) as conn:
        for name in ("default.big", "default.small"):
            conn.admin.create_table(name, tally.TableDescriptor(
                d.schema, bucket_count=1, properties=d.properties))
        route = conn.table_meta("default.big", refresh=True).route(None, 0)
        channel = FlightChannel(route.address)
        channel.put({"op": "put", **route.header()}, rows.slice(0, 10))  # opens the bucket
        pid = big_cluster.tablet_servers[0].info["pid"]
        with PeakGrowth(pid) as peak:
            channel.put({"op": "put", **route.header()}, rows.slice(10))
        channel.close()
        assert peak.growth <= 4 * rows.nbytes, \
            f"peak growth {peak.growth:,} bytes = {peak.growth / rows.nbytes:.1f}x the request"
        with conn.table("default.small").upsert_writer() as writer:
            writer.upsert(rows)
        big = conn.table("default.big").to_arrow()
        assert big.num_rows == KEYS
        assert big.equals(conn.table("default.small").to_arrow())

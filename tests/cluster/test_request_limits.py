"""Limits before allocation, against real server processes on both metadata stores.

- A compression bomb (512 MiB of zeros in a few kilobytes of zstd) sent as a write, as Flight
  record batches, or as a lookup key is refused with a typed error while the tablet server's
  resident memory grows by less than 100 MB (its peak, VmHWM, read from /proc after resetting
  it), and the server goes on serving.
- JSON nested 100,000 deep is refused typed wherever a request carries JSON.
- Names are matched whole (a trailing newline is no name) and held to one byte limit that both
  stores honour: the same verdict on either store for any owner id or partition name.
- A lock's ttl must be a number of seconds within [0.1, 86400]; anything else, NaN and the
  infinity `1e999` parses to included, is refused naming the ttl, and no lock is left behind.
"""

from __future__ import annotations

import json
import math
import urllib.parse

import numpy as np
import pyarrow as pa
import pyarrow.flight as flight
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from locks.request import MAX_LOCK_TTL, MIN_LOCK_TTL
from merge_engine import Schema, TableDescriptor
from tally.errors import InvalidInputError
from tally.meta.store import MAX_NODE_NAME_BYTES
from tally.wire.messages import PUT_SCHEMA, dumps

BOMB_BYTES = 512 << 20
MAX_GROWTH = 100 << 20


def make_table(conn, name, partitioned=False):
    builder = Schema.builder().column("k", pa.int64())
    if partitioned:
        builder.column("p", pa.string())
    builder.agg_column("a", pa.int64(), "sum").agg_column("tags", pa.string(), "string_agg")
    schema = builder.primary_key(*(["k", "p"] if partitioned else ["k"]))
    if partitioned:
        schema = schema.partition_key("p")
    conn.admin.create_table(name, TableDescriptor(schema.build(), bucket_count=1, properties={
        "table.merge-engine": "aggregation"}))
    return conn.table(name)


def bomb_table() -> pa.Table:
    """One row whose string cell is BOMB_BYTES zeros (calloc'd pages that are only ever read,
    so making and compressing it costs this process no memory)."""
    offsets = pa.py_buffer(np.array([0, BOMB_BYTES], dtype=np.int32))
    cell = pa.StringArray.from_buffers(1, offsets, pa.py_buffer(np.zeros(BOMB_BYTES, np.uint8)))
    return pa.table({"k": pa.array([1], pa.int64()), "tags": cell})


def bomb_stream() -> bytes:
    """bomb_table as a zstd-compressed IPC stream."""
    table = bomb_table()
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema,
                           options=pa.ipc.IpcWriteOptions(compression="zstd")) as writer:
        writer.write_table(table)
    data = sink.getvalue().to_pybytes()
    assert len(data) < 1 << 20
    return data


@pytest.fixture(scope="module")
def bomb() -> bytes:
    return bomb_stream()


def memory(pid: int, field: str) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field):
                return int(line.split()[1]) * 1024
    raise AssertionError(f"no {field} for process {pid}")


class PeakGrowth:
    """The growth of a process's peak resident memory over a block (VmHWM reset first)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid

    def __enter__(self):
        with open(f"/proc/{self.pid}/clear_refs", "w") as f:
            f.write("5")  # resets VmHWM to the current VmRSS
        self.before = memory(self.pid, "VmRSS:")
        return self

    def __exit__(self, *exc) -> None:
        self.growth = memory(self.pid, "VmHWM:") - self.before


def typed(call) -> tuple[str, str]:
    """(error class, message) of the Tally error a raw Flight call failed with."""
    errors = []
    try:
        call()
    except (flight.FlightError, pa.ArrowException) as e:
        errors.append(e)
    typed_errors = [e for e in errors if getattr(e, "extra_info", None)]
    assert typed_errors, f"expected a typed Tally error, got {errors}"
    doc = json.loads(typed_errors[0].extra_info)
    return doc["error"], doc["message"]


def route_of(conn, table):
    meta = conn.table_meta(table.name, refresh=True)
    return meta.route(None, 0)


def server_pid(cluster, address: str) -> int:
    return next(h.info["pid"] for h in cluster.tablet_servers if h.address == address)


def assert_serving(table, key: int) -> None:
    with table.upsert_writer() as w:
        w.upsert([{"k": key, "a": 1, "tags": "ok"}])
    assert table.lookup({"k": key}) == {"k": key, "a": 1, "tags": "ok"}


def put_raw_stream(client, header: dict, data: bytes) -> None:
    writer, reader = client.do_put(flight.FlightDescriptor.for_command(dumps(header)), PUT_SCHEMA)
    try:
        writer.write_metadata(pa.py_buffer(data))
        writer.done_writing()
        reader.read()
    finally:
        writer.close()


def put_with_command(client, command: bytes) -> None:
    writer, reader = client.do_put(flight.FlightDescriptor.for_command(command), PUT_SCHEMA)
    try:
        writer.done_writing()
        reader.read()
    finally:
        writer.close()


def put_flight_batches(client, header: dict, data: bytes) -> None:
    """The bomb as ordinary zstd Flight record batches (what pyarrow decodes before a
    handler could look at them)."""
    table = bomb_table()
    options = flight.FlightCallOptions(
        write_options=pa.ipc.IpcWriteOptions(compression="zstd"))
    writer, reader = client.do_put(flight.FlightDescriptor.for_command(dumps(header)),
                                   table.schema, options)
    try:
        writer.write_table(table)
        writer.done_writing()
        reader.read()
    finally:
        writer.close()


@pytest.mark.parametrize("send", [put_raw_stream, put_flight_batches])
def test_a_compressed_write_bomb_is_refused_before_it_is_decoded(cluster, conn, table_name,
                                                                 bomb, send):
    table = make_table(conn, table_name)
    assert_serving(table, 1)
    route = route_of(conn, table)
    client = flight.FlightClient(route.address)
    header = {"op": "put", **route.header()}
    with PeakGrowth(server_pid(cluster, route.address)) as peak:
        error, message = typed(lambda: send(client, header, bomb))
    assert error == "InvalidInputError", message
    assert "limit" in message or "empty Flight schema" in message
    assert peak.growth < MAX_GROWTH, f"the server grew by {peak.growth:,} bytes"
    client.close()
    assert table.lookup({"k": 1}) == {"k": 1, "a": 1, "tags": "ok"}
    assert_serving(table, 2)


def test_a_compressed_lookup_bomb_is_refused_before_it_is_decoded(cluster, conn, table_name,
                                                                  bomb):
    table = make_table(conn, table_name)
    assert_serving(table, 1)
    route = route_of(conn, table)
    client = flight.FlightClient(route.address)
    body = dumps(route.header()) + b"\n" + bomb
    with PeakGrowth(server_pid(cluster, route.address)) as peak:
        error, message = typed(lambda: list(client.do_action(flight.Action("lookup", body))))
    assert error == "InvalidInputError" and "once decoded" in message, message
    assert peak.growth < MAX_GROWTH, f"the server grew by {peak.growth:,} bytes"
    client.close()
    assert_serving(table, 2)


def test_json_nested_100000_deep_is_refused_typed_everywhere(cluster, conn, table_name):
    table = make_table(conn, table_name)
    route = route_of(conn, table)
    deep = b"[" * 100_000 + b"]" * 100_000
    coordinator = flight.FlightClient(cluster.url)
    tablet = flight.FlightClient(route.address)
    calls = [
        lambda: list(coordinator.do_action(flight.Action("create_database", deep))),
        lambda: list(tablet.do_action(flight.Action("lookup", deep + b"\n"))),
        lambda: tablet.do_get(flight.Ticket(deep)).read_all(),
        lambda: put_with_command(tablet, deep),
    ]
    for call in calls:
        error, message = typed(call)
        assert error == "InvalidInputError" and "levels deep" in message, message
    with pytest.raises(InvalidInputError, match="levels deep"):
        conn.admin.create_table(f"{table_name}x", '{"schema": ' + "[" * 50_000 + "]" * 50_000 + "}")
    coordinator.close()
    tablet.close()
    assert_serving(table, 1)


def test_json_of_over_4_mib_is_refused_typed_before_it_is_parsed(cluster, conn, table_name):
    from tally.wire.messages import MAX_REQUEST_JSON_BYTES

    table = make_table(conn, table_name)
    route = route_of(conn, table)
    big = b'{"name":"' + b"x" * MAX_REQUEST_JSON_BYTES + b'"}'
    coordinator = flight.FlightClient(cluster.url)
    tablet = flight.FlightClient(route.address)
    calls = [
        lambda: list(coordinator.do_action(flight.Action("create_database", big))),
        lambda: list(tablet.do_action(flight.Action("lookup", big + b"\n"))),
        lambda: tablet.do_get(flight.Ticket(big)).read_all(),
        lambda: put_with_command(tablet, big),
    ]
    for call in calls:
        error, message = typed(call)
        assert error == "InvalidInputError" and "limit" in message, message
    coordinator.close()
    tablet.close()
    assert "x" * 100 not in "".join(conn.admin.list_databases())
    assert_serving(table, 1)


@pytest.mark.parametrize("name", ["db\n", "db\n\n", "\ndb", "db ", "d" * 129])
def test_database_and_table_names_are_matched_whole(conn, name):
    with pytest.raises(InvalidInputError, match="invalid database name"):
        conn.admin.create_database(name)
    with pytest.raises(InvalidInputError, match="invalid table name"):
        conn.admin.create_table(f"default.{name}", TableDescriptor(
            Schema.builder().column("k", pa.int64()).primary_key("k").build()))
    assert name not in conn.admin.list_databases()


def quoted_bytes(text: str) -> int:
    return len("n-" + urllib.parse.quote(text, safe=""))


names = st.one_of(
    st.text(min_size=1, max_size=300),
    st.integers(MAX_NODE_NAME_BYTES - 6, MAX_NODE_NAME_BYTES + 2).map(lambda n: "o" * n),
    st.integers(80, 90).map(lambda n: "é" * (n // 2)),
)


@pytest.fixture(scope="module")
def name_table(cluster):
    from tally import client

    with client.connect(cluster.url, retry_timeout=60) as c:
        make_table(c, "default.names", partitioned=True)
        yield c


@settings(max_examples=40, deadline=None, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(owner=names)
def test_owner_ids_have_one_limit_on_both_stores(name_table, owner):
    conn = name_table
    fits = quoted_bytes(owner) <= MAX_NODE_NAME_BYTES
    if fits:
        lease = conn.locks.acquire("default.names", owner, ["a"], ttl=30)
        assert lease.owner_id == owner
        assert conn.locks.release(lease)
    else:
        with pytest.raises(InvalidInputError, match="lock owner id .* is too long"):
            conn.locks.acquire("default.names", owner, ["a"], ttl=30)
    assert conn.locks.describe("default.names") == []


@settings(max_examples=25, deadline=None, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(partition=names.filter(lambda s: "$" not in s))  # one partition-key column
def test_partition_names_have_one_limit_on_both_stores(name_table, partition):
    conn = name_table
    fits = quoted_bytes(partition) <= MAX_NODE_NAME_BYTES
    before = conn.admin.list_partitions("default.names")
    if fits:
        assert conn.admin.create_partition("default.names", partition) == partition
        assert partition in conn.admin.list_partitions("default.names")
        conn.admin.drop_partition("default.names", partition)
    else:
        with pytest.raises(InvalidInputError, match="partition name .* is too long"):
            conn.admin.create_partition("default.names", partition)
        assert conn.admin.list_partitions("default.names") == before


ttls = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.floats(min_value=MIN_LOCK_TTL / 2, max_value=MAX_LOCK_TTL * 2),
    st.integers(-10, 200_000),
    st.sampled_from([MIN_LOCK_TTL, MAX_LOCK_TTL, 1e300, 1e999, -math.inf, math.nan]),
)


@settings(max_examples=60, deadline=None, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ttl=ttls)
def test_a_lock_ttl_is_a_finite_number_within_its_range(name_table, ttl):
    conn = name_table
    if MIN_LOCK_TTL <= ttl <= MAX_LOCK_TTL:
        lease = conn.locks.acquire("default.names", "ttl-owner", ["a"], ttl=ttl)
        assert lease.ttl == float(ttl)
        assert conn.locks.release(lease)
    else:
        with pytest.raises(InvalidInputError, match="ttl="):
            conn.locks.acquire("default.names", "ttl-owner", ["a"], ttl=ttl)
    assert conn.locks.describe("default.names", include_expired=True) == []


@settings(max_examples=100, deadline=None)
@given(columns=st.lists(st.text(min_size=1, max_size=40), min_size=1, max_size=30),
       table=st.text(alphabet="abc_.", min_size=3, max_size=60))
def test_a_derived_owner_id_always_fits_and_is_stable(columns, table):
    from sink.owner import streaming_owner_id

    owner = streaming_owner_id(None, "0f4c2d5e-6a7b-4c8d-9e0f-1a2b3c4d5e6f", table, columns)
    assert quoted_bytes(owner) <= MAX_NODE_NAME_BYTES
    assert owner == streaming_owner_id(None, "0f4c2d5e-6a7b-4c8d-9e0f-1a2b3c4d5e6f", table,
                                       list(columns))
    if quoted_bytes(f"spark-query:0f4c2d5e-6a7b-4c8d-9e0f-1a2b3c4d5e6f/{table}/"
                    f"{','.join(columns)}") <= MAX_NODE_NAME_BYTES:
        assert owner.endswith("/" + ",".join(columns))

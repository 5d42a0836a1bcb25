"""Arrow's compact encodings as bombs: a request of a few megabytes at most whose columns decode to
gigabytes, sent to a real tablet server with raw Flight calls (as a hostile client would, past
the Tally client), must be refused typed before the server decodes it, leave nothing applied,
and grow the server by under 100 MB; all of them at once too."""

from __future__ import annotations

import threading

import numpy as np
import pyarrow as pa
import pyarrow.flight as flight
import pytest
from merge_engine import Schema, TableDescriptor

from tally.wire.lookup_answer import LOOKUP_VERSION
from tally.wire.messages import dumps, table_to_ipc
from tally.wire.point_keys import VERSION_FIELD
from tests.cluster.test_request_limits import (MAX_GROWTH, PeakGrowth, assert_serving, make_table,
                                               put_raw_stream, route_of, server_pid, typed)

ROWS = 6_000_000       # under the test cluster's write limit (6 MiB, so 6 Mi rows)
WIDE = 4 << 20         # one dictionary value, list child or string view target
FEW = 60_000           # rows of the bombs whose rows cost a byte or more on the wire
FIRST_KEY = 1000       # the bombs' keys: none of them may be readable afterwards


def rows(n: int, **columns: pa.Array) -> pa.Table:
    """A write of `n` rows to make_table's (k, a, tags), the bomb in `columns`: every column
    there, so that nothing but the encoding can refuse it."""
    plain = {"k": pa.array(np.arange(FIRST_KEY, FIRST_KEY + n, dtype=np.int64)),
             "a": pa.array(np.ones(n, np.int64)), "tags": pa.array([""] * n)}
    return pa.table({**plain, **columns})


def one_wide_string(n: int) -> pa.DictionaryArray:
    return pa.DictionaryArray.from_arrays(pa.array(np.zeros(n, np.int8)), pa.array(["x" * WIDE]))


def run_end_key() -> pa.Table:
    """One run of ROWS copies of each column: a few hundred bytes for millions of rows."""
    def run(value, type_):
        return pa.RunEndEncodedArray.from_arrays(pa.array([ROWS], pa.int32()),
                                                 pa.array([value], type_))
    return pa.table({"k": run(FIRST_KEY, pa.int64()), "a": run(1, pa.int64()),
                     "tags": run("x" * 1000, pa.string())})


def dictionary_tags() -> pa.Table:
    """A WIDE string repeated in FEW rows through one-byte indices."""
    return rows(FEW, tags=one_wide_string(FEW))


def list_view_tags() -> pa.Table:
    """FEW list views, each over the same WIDE child."""
    return rows(FEW, tags=pa.ListViewArray.from_arrays(
        pa.array(np.zeros(FEW, np.int32)), pa.array(np.full(FEW, WIDE, np.int32)),
        pa.array(np.zeros(WIDE, np.int8))))


def string_view_tags() -> pa.Table:
    """FEW string views, each naming all of one WIDE data buffer."""
    views = np.zeros((FEW, 4), np.int32)
    views[:, 0] = WIDE  # length; prefix, buffer index and offset stay 0
    return rows(FEW, tags=pa.Array.from_buffers(
        pa.string_view(), FEW, [None, pa.py_buffer(views.tobytes()), pa.py_buffer(b"x" * WIDE)]))


def nested_dictionary() -> pa.Table:
    """The dictionary bomb inside a struct of a list of lists."""
    lists = pa.ListArray.from_arrays(pa.array([0, FEW], pa.int32()), one_wide_string(FEW))
    outer = pa.ListArray.from_arrays(pa.array([0, 1], pa.int32()), lists)
    return rows(1, tags=pa.StructArray.from_arrays([outer], ["deep"]))


def map_of_dictionary() -> pa.Table:
    """A map whose FEW items are all the dictionary's one WIDE string."""
    return rows(1, tags=pa.MapArray.from_arrays(pa.array([0, FEW], pa.int32()),
                                                pa.array(np.zeros(FEW, np.int8)),
                                                one_wide_string(FEW)))


def fixed_size_list_of_dictionary() -> pa.Table:
    """One fixed-size list of FEW copies of the WIDE string."""
    return rows(1, tags=pa.FixedSizeListArray.from_arrays(one_wide_string(FEW), FEW))


def list_of_nulls() -> pa.Table:
    """A list whose child is ROWS nulls: no buffers at all, ROWS values once cast."""
    return rows(1, tags=pa.ListArray.from_arrays(pa.array([0, ROWS], pa.int32()),
                                                 pa.nulls(ROWS)))


BOMBS = {
    "run-end": (run_end_key, "run-end"),
    "dictionary": (dictionary_tags, "dictionary-encoded string"),
    "list view": (list_view_tags, "list view"),
    "string view": (string_view_tags, "string view"),
    "nested dictionary": (nested_dictionary, "decodes to"),
    "map of dictionary": (map_of_dictionary, "decodes to"),
    "fixed-size list of dictionary": (fixed_size_list_of_dictionary, "decodes to"),
    "list of nulls": (list_of_nulls, "decodes to"),
}


@pytest.fixture(scope="module")
def bombs() -> dict[str, bytes]:
    """Each bomb as the IPC stream a write carries (built once: the big ones cost seconds)."""
    streams = {name: table_to_ipc(make()) for name, (make, _) in BOMBS.items()}
    assert all(len(s) < 8 << 20 for s in streams.values()), {k: len(v) for k, v in
                                                             streams.items()}
    return streams


@pytest.fixture
def served(conn, table_name, cluster):
    table = make_table(conn, table_name)
    assert_serving(table, 1)
    route = route_of(conn, table)
    client = flight.FlightClient(route.address)
    yield table, route, client, server_pid(cluster, route.address)
    client.close()


def assert_nothing_applied(table) -> None:
    assert table.lookup({"k": 1}) == {"k": 1, "a": 1, "tags": "ok"}
    assert table.lookup({"k": FIRST_KEY}) is None
    assert table.lookup({"k": FIRST_KEY + FEW - 1}) is None
    assert_serving(table, 2)


@pytest.mark.parametrize("name", list(BOMBS))
def test_an_encoding_bomb_write_is_refused_before_it_is_decoded(served, bombs, name):
    table, route, client, pid = served
    header = {"op": "put", **route.header()}
    with PeakGrowth(pid) as peak:
        error, message = typed(lambda: put_raw_stream(client, header, bombs[name]))
    assert peak.growth < MAX_GROWTH, f"{name}: the server grew by {peak.growth:,} bytes"
    assert error == "InvalidInputError", message
    assert BOMBS[name][1] in message and "column '" in message, message
    assert_nothing_applied(table)


def test_every_encoding_bomb_at_once_is_refused(served, bombs):
    table, route, _, pid = served
    header = {"op": "put", **route.header()}
    outcomes: dict[str, tuple[str, str]] = {}

    def send(name: str) -> None:
        client = flight.FlightClient(route.address)
        try:
            outcomes[name] = typed(lambda: put_raw_stream(client, header, bombs[name]))
        finally:
            client.close()

    threads = [threading.Thread(target=send, args=(name,)) for name in BOMBS]
    with PeakGrowth(pid) as peak:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert {name: (error, BOMBS[name][1] in message) for name, (error, message)
            in outcomes.items()} == {name: ("InvalidInputError", True) for name in BOMBS}, outcomes
    assert peak.growth < MAX_GROWTH, f"the server grew by {peak.growth:,} bytes"
    assert_nothing_applied(table)


def string_keyed(conn, name):
    schema = Schema.builder().column("k", pa.string()).column("v", pa.int64()) \
        .primary_key("k").build()
    conn.admin.create_table(name, TableDescriptor(schema, bucket_count=1))
    table = conn.table(name)
    with table.upsert_writer() as w:
        w.upsert([{"k": "a", "v": 1}])
    return table


LOOKUP_WIDE = 256 << 10  # a framed request holds at most a megabyte


def lookup_bombs() -> dict[str, tuple[str, pa.Table, str]]:
    """(action, keys, what the refusal names) of each key bomb."""
    rows = 4096
    word = pa.array(["k" * LOOKUP_WIDE])
    views = np.zeros((rows, 4), np.int32)
    views[:, 0] = LOOKUP_WIDE
    return {
        "run-end": ("lookup", pa.table({"k": pa.RunEndEncodedArray.from_arrays(
            pa.array([1], pa.int32()), pa.array(["a"]))}), "run-end"),
        "dictionary": ("lookup_many", pa.table({"k": pa.DictionaryArray.from_arrays(
            pa.array(np.zeros(rows, np.int8)), word)}), "dictionary-encoded string"),
        "string view": ("lookup_many", pa.table({"k": pa.Array.from_buffers(
            pa.string_view(), rows, [None, pa.py_buffer(views.tobytes()),
                                     pa.py_buffer(b"k" * LOOKUP_WIDE)])}), "string view"),
    }


@pytest.mark.parametrize("name", ["run-end", "dictionary", "string view"])
def test_an_encoding_bomb_lookup_is_refused_before_it_is_decoded(cluster, conn, table_name,
                                                                 name):
    table = string_keyed(conn, table_name)
    route = route_of(conn, table)
    action, payload, named = lookup_bombs()[name]
    body = dumps({**route.header(), VERSION_FIELD: LOOKUP_VERSION}) + b"\n" + \
        table_to_ipc(payload)
    client = flight.FlightClient(route.address)
    with PeakGrowth(server_pid(cluster, route.address)) as peak:
        error, message = typed(lambda: list(client.do_action(flight.Action(action, body))))
    client.close()
    assert peak.growth < MAX_GROWTH, f"{name}: the server grew by {peak.growth:,} bytes"
    assert error == "InvalidInputError" and named in message, message
    assert table.lookup({"k": "a"}) == {"k": "a", "v": 1}


def test_the_client_writes_compact_encodings_decoded(conn, table_name):
    """A dictionary or a string view handed to the Tally client is still written: the client
    sends the table's own types, never the encodings a server refuses (run-end encoded input
    it refuses itself, as it always has)."""
    table = make_table(conn, table_name)
    tags = pa.array(["x", "y"])
    with table.upsert_writer() as w:
        w.upsert(pa.table({"k": pa.array([1, 2], pa.int64()), "a": [1, 1],
                           "tags": tags.dictionary_encode()}))
        w.upsert(pa.table({"k": pa.array([3, 4], pa.int64()), "a": [1, 1],
                           "tags": tags.cast(pa.string_view())}))
    assert [table.lookup({"k": k}) for k in (1, 3)] == \
        [{"k": 1, "a": 1, "tags": "x"}, {"k": 3, "a": 1, "tags": "x"}]

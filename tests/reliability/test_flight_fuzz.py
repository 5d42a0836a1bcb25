"""Fuzzing the Flight API: malformed requests never crash a server, are refused with a typed
Tally error, and apply nothing.

One cluster (per metadata store) holds the fuzz table (tests/cluster/reference_workload.py: 2
partitions x 4 buckets over both tablet servers, some rows), a live column lock of `fuzz-owner` on
`label` with one committed epoch. Hypothesis draws requests from
tests/reliability/flight_requests.py and data_requests.py (DoAction, DoPut, DoGet and the binary
lookup, each broken on purpose) and sends them with a raw pyarrow.flight client to the coordinator
or a tablet server. After each:

- the call failed with a FlightError carrying a `tally.errors` class name (as
  tally.wire.messages encodes errors), and not the "internal server error" that stands for an
  unexpected exception on the server (a bug);
- every server still answers `ping`;
- nothing changed: databases, tables, partitions and assignments, servers, locks, commits,
  retention floors, every bucket's log start and end offsets, and every row of the table.

`TALLY_FUZZ_EXAMPLES` sets the number of examples per metadata store (default 1000, so 2000 in
a run); `TALLY_FUZZ_RANDOM=1` draws new examples instead of the fixed, derandomized sequence.
"""

from __future__ import annotations

import json
import os

import pyarrow as pa
import pyarrow.flight as flight
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from tally.errors import TallyError, error_class
from tally.wire.messages import PUT_SCHEMA, put_pieces
from tests.cluster import reference_workload
from tests.reliability.data_requests import get_requests, lookup_requests, put_requests
from tests.reliability.flight_requests import (Bucket, Context, Request, action_requests,
                                               bucket_keys)

# 300 examples per store in the default run; TALLY_SLOW_TESTS=1 (or TALLY_FUZZ_EXAMPLES) for more.
EXAMPLES = int(os.environ.get("TALLY_FUZZ_EXAMPLES",
                              "1000" if os.environ.get("TALLY_SLOW_TESTS") == "1" else "300"))
TABLE, OWNER = "default.fuzz", "fuzz-owner"


@pytest.fixture(scope="module")
def fuzz_conn(cluster):
    from tally import client

    with client.connect(cluster.url, retry_timeout=60) as connection:
        yield connection


@pytest.fixture(scope="module")
def fuzz_context(cluster, fuzz_conn) -> Context:
    conn = fuzz_conn
    conn.admin.create_table(TABLE, reference_workload.descriptor(buckets=4))
    writer = conn.table(TABLE).upsert_writer()
    writer.upsert(reference_workload.batches(seed=1, count=1, rows=200)[0])
    writer.flush()
    meta = conn.table_meta(TABLE, refresh=True)
    buckets = []
    for partition, bucket in meta.all_buckets():
        route = meta.route(partition, bucket)
        buckets.append(Bucket(partition, route.partition_id, bucket, route.address,
                              bucket_keys(meta.routing, bucket)))
    act = conn.coordinator_action
    lease = act("lock_acquire", {"table": TABLE, "owner_id": OWNER, "columns": ["label"],
                                 "ttl": 3600})
    ends = act("list_offsets", {"name": TABLE})
    act("commit", {"lease": lease, "epoch": 1, "offsets": [[p, b, e] for p, b, _, e in ends]})
    return Context(
        coordinator=cluster.url, tablets=[h.address for h in cluster.tablet_servers],
        table=TABLE, table_id=meta.table_id, buckets=buckets, lease=lease, owner=OWNER,
        descriptor_json=reference_workload.descriptor(buckets=2).to_json(),
        view=act("lock_view", {"table_id": meta.table_id}))


def snapshot(conn, ctx: Context) -> dict:
    """Everything a request could change, read through the coordinator and a scan."""
    act = conn.coordinator_action
    databases = act("list_databases")
    locks = act("lock_describe", {"table": ctx.table, "include_expired": True})
    return {
        "tables": {db: act("list_tables", {"database": db}) for db in databases},
        "table": act("table_info", {"name": ctx.table}),
        "servers": act("list_servers"),
        "locks": [{k: v for k, v in lock.items() if k != "expires_in"} for lock in locks],
        "view": act("lock_view", {"table_id": ctx.table_id}),
        "last commit": act("last_commit", {"table": ctx.table, "owner_id": ctx.owner}),
        "retention floor": act("retention_floor", {"table_id": ctx.table_id}),
        "consumers": act("consumer_positions", {"name": ctx.table}),
        "offsets": act("list_offsets", {"name": ctx.table}),
        "rows": conn.table(ctx.table).to_arrow().to_pylist(),
    }


def send(client: flight.FlightClient, request: Request) -> Exception | None:
    """Make the raw call; the error it raised (the most informative one), or None."""
    options = flight.FlightCallOptions(timeout=30)
    errors: list[Exception] = []
    try:
        if request.call == "action":
            list(client.do_action(flight.Action(request.name, request.body), options))
        elif request.call == "get":
            client.do_get(flight.Ticket(request.body), options).read_all()
        else:
            descriptor = flight.FlightDescriptor.for_command(request.body)
            writer, reader = client.do_put(descriptor, PUT_SCHEMA, options)
            try:
                for piece in put_pieces(request.rows):
                    writer.write_metadata(piece)
                writer.done_writing()
                reader.read()
            except (flight.FlightError, pa.ArrowException) as e:
                errors.append(e)
            finally:
                try:
                    writer.close()
                except (flight.FlightError, pa.ArrowException) as e:
                    errors.append(e)
    except (flight.FlightError, pa.ArrowException) as e:
        errors.append(e)
    typed = [e for e in errors if getattr(e, "extra_info", None)]
    return (typed or errors or [None])[0]


def tally_error(error: Exception) -> tuple[str | None, str]:
    """(error class name, message) as the server encoded them, or (None, the raw text)."""
    try:
        doc = json.loads(error.extra_info)
        return doc["error"], doc["message"]
    except (AttributeError, TypeError, ValueError, KeyError):
        return None, str(error)[:500]


def test_malformed_requests_are_refused_typed_and_change_nothing(cluster, fuzz_conn,
                                                                 fuzz_context):
    ctx, conn = fuzz_context, fuzz_conn
    clients = {a: flight.FlightClient(a) for a in [ctx.coordinator] + ctx.tablets}
    baseline = snapshot(conn, ctx)
    seen: dict[str, int] = {}
    first_change: list[str] = []

    @settings(max_examples=EXAMPLES, deadline=None, database=None,
              derandomize=not os.environ.get("TALLY_FUZZ_RANDOM"),
              phases=[Phase.generate, Phase.shrink],
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                     HealthCheck.filter_too_much])
    @given(st.one_of(action_requests(ctx), put_requests(ctx), get_requests(ctx),
                     lookup_requests(ctx)))
    def refused(request: Request) -> None:
        error = send(clients[request.address], request)
        for address, client in clients.items():
            result = list(client.do_action(flight.Action("ping", b"{}")))
            assert json.loads(result[0].body.to_pybytes()) == {"ok": True}, address
        after = snapshot(conn, ctx)
        changed = {k: (baseline[k], after[k]) for k in baseline if after[k] != baseline[k]}
        if changed and not first_change:  # the state stays changed: later examples fail too
            first_change.append(f"{request} ({'accepted' if error is None else error}) "
                                f"changed {changed}")
        assert not changed, f"a malformed request changed the cluster; the first was " \
                            f"{first_change[0]}"
        assert error is not None, f"a malformed request was accepted: {request}"
        name, message = tally_error(error)
        assert name is not None and error_class(name) is not TallyError, \
            f"untyped refusal {message!r} of {request}"
        assert not message.startswith("internal server error"), \
            f"the server failed unexpectedly ({message}) on {request}"
        seen[name] = seen.get(name, 0) + 1

    try:
        refused()
    finally:
        for client in clients.values():
            client.close()
    assert cluster.coordinator.running
    assert all(h.running for h in cluster.tablet_servers)
    print(f"refusals by error class: {dict(sorted(seen.items()))}")

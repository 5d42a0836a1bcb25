"""Fuzzing authorization: calls by principals their role does not admit change nothing.

An authenticated cluster (per metadata store) holds the fuzz table with rows, a live column lock
and a commit. Hypothesis draws a call from the role table, a principal the table refuses it to
(no credential, an unknown one, or a client role below the call's), and a request for it:
well-formed (a real table, bucket, lease and rows, so the call would act if admitted), broken
(tests/reliability/flight_requests.py's breakages) or garbage. Each must be refused with
AuthenticationError or PermissionDeniedError, whatever its body, and afterwards the catalog,
servers, locks, commits, retention floors, offsets and rows are as before.

`TALLY_FUZZ_EXAMPLES` scales it as for the malformed-request fuzz (a fifth as many examples).
"""

from __future__ import annotations

import os

import pyarrow as pa
import pyarrow.flight as flight
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from tally.errors import AuthenticationError, PermissionDeniedError
from tally.server.access import CLIENT_ROLES, REQUIRED_ROLE, allows
from tally.wire.messages import bearer, frame, remote_error
from tests.cluster import reference_workload
from tests.reliability.flight_requests import (COORDINATOR_ACTIONS, TABLET_ACTIONS, Bucket,
                                               Context, Request, action_fields, broken_body,
                                               bucket_keys, dumps, not_a_json_object)
from tests.reliability.test_flight_fuzz import send, snapshot

EXAMPLES = max(50, int(os.environ.get("TALLY_FUZZ_EXAMPLES", "1000")) // 5)
TABLE, OWNER = "default.authfuzz", "authfuzz-owner"
UNKNOWN = "an-unknown-credential-of-some-length"


@pytest.fixture(scope="module")
def setup(secured_cluster):
    """(cluster-credential connection for snapshots, Context) on the secured cluster."""
    from tally import client

    cluster = secured_cluster
    with client.connect(cluster.url, token=cluster.cluster_token, retry_timeout=60) as conn:
        conn.admin.create_table(TABLE, reference_workload.descriptor(buckets=4))
        with conn.table(TABLE).upsert_writer() as writer:
            writer.upsert(reference_workload.batches(seed=2, count=1, rows=200)[0])
        meta = conn.table_meta(TABLE, refresh=True)
        buckets = [Bucket(p, meta.route(p, b).partition_id, b, meta.route(p, b).address,
                          bucket_keys(meta.routing, b)) for p, b in meta.all_buckets()]
        act = conn.coordinator_action
        lease = act("lock_acquire", {"table": TABLE, "owner_id": OWNER, "columns": ["label"],
                                     "ttl": 3600})
        ends = act("list_offsets", {"name": TABLE})
        act("commit", {"lease": lease, "epoch": 1,
                       "offsets": [[p, b, e] for p, b, _, e in ends]})
        ctx = Context(
            coordinator=cluster.url, tablets=[h.address for h in cluster.tablet_servers],
            table=TABLE, table_id=meta.table_id, buckets=buckets, lease=lease, owner=OWNER,
            descriptor_json=reference_workload.descriptor(buckets=2).to_json(),
            view=act("lock_view", {"table_id": meta.table_id}))
        yield conn, ctx


def refused_principals(required: str) -> list[str | None]:
    """Secrets (by role name, resolved later) of principals the table refuses `required` to."""
    # client roles drawn three times as often: their refusal is the role check's, the others'
    # the credential check's
    return [None, UNKNOWN] + 3 * [r for r in CLIENT_ROLES if not allows(r, required)]


@st.composite
def unauthorized(draw, ctx: Context) -> tuple[str | None, Request]:
    name = draw(st.sampled_from(sorted(REQUIRED_ROLE)))
    principal = draw(st.sampled_from(refused_principals(REQUIRED_ROLE[name])))
    b = draw(st.sampled_from(ctx.buckets))
    if name.startswith(("do_put:", "do_get:")):
        call, op = name.split(":")
        keys = draw(st.lists(st.sampled_from(b.keys), min_size=1, max_size=4, unique=True))
        rows = pa.table({"k": pa.array(keys, pa.int64()),
                         "region": pa.array([b.partition] * len(keys), pa.string()),
                         "total": pa.array([7] * len(keys), pa.int64())})
        header = ctx.header(b, op)
        if draw(st.booleans()):
            header["lease"] = {"owner_id": ctx.owner, "token": ctx.lease["token"],
                               "secret": ctx.lease["secret"]}
        return principal, Request(b.address, "put" if call == "do_put" else "get", "",
                                  dumps(header), rows if call == "do_put" else None, [name])
    if name == "lookup":
        key = pa.table({"k": pa.array(b.keys[:1], pa.int64()),
                        "region": pa.array([b.partition], pa.string())})
        return principal, Request(b.address, "action", name, frame(ctx.header(b, "lookup"), key),
                                  None, [name])
    role = "tablet" if name in TABLET_ACTIONS else "coordinator"
    address = b.address if role == "tablet" else ctx.coordinator
    if name not in COORDINATOR_ACTIONS + TABLET_ACTIONS:  # actions without a body
        return principal, Request(address, "action", name, b"{}", None, [name])
    fields = action_fields(ctx, role, name)
    kind = draw(st.sampled_from(["well-formed", "well-formed", "broken", "garbage"]))
    if kind == "garbage":
        body = draw(not_a_json_object)
    elif kind == "broken":
        body = dumps(draw(broken_body(fields))[0])
    else:
        body = dumps({n: v for n, (_, v, _) in fields.items()})
    return principal, Request(address, "action", name, body, None, [name, kind])


def test_unauthorized_calls_are_refused_and_change_nothing(secured_cluster, setup):
    conn, ctx = setup
    secrets = {None: None, UNKNOWN: UNKNOWN, **secured_cluster.tokens}
    clients = {}
    baseline = snapshot(conn, ctx)
    seen: dict[str, int] = {}

    @settings(max_examples=EXAMPLES, deadline=None, database=None,
              derandomize=not os.environ.get("TALLY_FUZZ_RANDOM"),
              phases=[Phase.generate, Phase.shrink],
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(unauthorized(ctx))
    def refused(drawn) -> None:
        principal, request = drawn
        key = (request.address, principal)
        if key not in clients:
            clients[key] = _Client(request.address, secrets[principal])
        error = send(clients[key], request)
        error = None if error is None else remote_error(error, request.address)
        assert isinstance(error, (AuthenticationError, PermissionDeniedError)), \
            f"{principal!r}: {request} was not refused for its principal: {error!r}"
        after = snapshot(conn, ctx)
        changed = {k: (baseline[k], after[k]) for k in baseline if after[k] != baseline[k]}
        assert not changed, f"{principal!r}: {request} changed {changed}"
        seen[type(error).__name__] = seen.get(type(error).__name__, 0) + 1

    try:
        refused()
    finally:
        for client in clients.values():
            client.close()
    print(f"refusals: {seen}")


class _Client:
    """A FlightClient that sends one principal's credential with every call (the shape of
    client `send` expects: do_action, do_get, do_put with call options)."""

    def __init__(self, address: str, secret: str | None) -> None:
        self._client = flight.FlightClient(address)
        self._headers = bearer(secret)

    def _options(self, options):
        return flight.FlightCallOptions(headers=self._headers, timeout=30)

    def do_action(self, action, options=None):
        return self._client.do_action(action, self._options(options))

    def do_get(self, ticket, options=None):
        return self._client.do_get(ticket, self._options(options))

    def do_put(self, descriptor, schema, options=None):
        return self._client.do_put(descriptor, schema, self._options(options))

    def close(self) -> None:
        self._client.close()

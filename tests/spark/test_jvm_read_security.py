"""The JVM reader's part endpoint guards as Flight does, on a mutual-TLS cluster with credentials
and a CA made here: a read token with the CA and a client certificate reads; no token, an
unknown token, an altered or forged ticket, a ticket of another server, plaintext, a client
trusting another CA, and a client without a certificate are refused, each before a row is sent,
and a refusal reaches Spark as one line naming the error, the table and the bucket.
"""

from __future__ import annotations

import base64
import json
import ssl
import types
import urllib.error
import urllib.request
import uuid

import pyarrow as pa
import pytest

import sink
import tally
from sink.jvm_reader import jvm_jar
from tally.wire.tls import TlsFiles
from tests.cluster.test_tls import Authority


@pytest.fixture(scope="module")
def secure(tmp_path_factory, spark):
    if jvm_jar() is None:
        pytest.skip("the JVM reader's jar is not built (scripts/setup.sh needs javac)")
    from tally.server import LocalCluster

    directory = tmp_path_factory.mktemp("jvm-pki")
    authority, rogue = Authority(directory, "cluster"), Authority(directory, "rogue")
    cert, key = authority.issue("server")
    client_cert, client_key = authority.issue("reader")
    tls = TlsFiles(ca=authority.ca_file, cert=cert, key=key, verify_clients=True)
    with LocalCluster(str(directory / "cluster"), tablet_servers=2, authenticate=True,
                      tls=tls) as cluster:
        mine = TlsFiles(ca=authority.ca_file, cert=client_cert, key=client_key)
        with tally.connect(cluster.url, token=cluster.tokens["admin"], tls=mine) as conn:
            schema = (tally.Schema.builder().column("k", pa.int64())
                      .agg_column("v", pa.int64(), tally.AggFunction.SUM).primary_key("k")
                      .build())
            name = f"jvmsec.t_{uuid.uuid4().hex[:8]}"
            conn.admin.create_database("jvmsec", ignore_if_exists=True)
            conn.admin.create_table(name, tally.TableDescriptor(
                schema, bucket_count=4, properties={"table.merge-engine": "aggregation"}))
            with conn.table(name).upsert_writer() as writer:
                writer.upsert(pa.table({"k": pa.array(range(100), pa.int64()),
                                        "v": pa.array(range(100), pa.int64())}))
        options = {"url": cluster.url, "table": name, "token": cluster.tokens["read"],
                   "tls.ca": authority.ca_file, "tls.cert": client_cert,
                   "tls.key": client_key}
        yield types.SimpleNamespace(cluster=cluster, options=options, rogue=rogue,
                                    authority=authority, client=(client_cert, client_key))


def planned(secure) -> list[dict]:
    """The parts of a real plan: [{"url", "ticket", "bucket"}, ...]."""
    from sink.batch_reader import ReadOptions, read_schema
    from sink.jvm_reader import _plan

    plan = _plan(ReadOptions.parse(secure.options), read_schema(secure.options))
    return [part for run in plan["partitions"] for part in run]


def context(secure, ca=None, client=True) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=ca or secure.authority.ca_file)
    if client:
        ctx.load_cert_chain(*secure.client)
    return ctx


def post(url: str, ticket: str, token: str | None, ctx) -> tuple[int, dict | bytes]:
    request = urllib.request.Request(url, data=ticket.encode(), method="POST")
    if token is not None:
        request.add_header("authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, context=ctx, timeout=60) as answer:
            return answer.status, answer.read()
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_a_read_token_reads_over_mutual_tls(spark, secure):
    df = sink.read_table(spark, secure.options)
    assert sorted(tuple(r) for r in df.collect()) == [(k, k) for k in range(100)]
    part = planned(secure)[0]
    assert part["url"].startswith("https://")
    status, body = post(part["url"], part["ticket"], secure.options["token"], context(secure))
    assert status == 200
    assert pa.ipc.open_stream(body).read_all().num_rows > 0


@pytest.mark.parametrize("token, status, error", [
    (None, 401, "AuthenticationError"),
    ("not-a-token-of-this-cluster", 401, "AuthenticationError"),
])
def test_a_missing_or_unknown_token_is_refused(secure, token, status, error):
    part = planned(secure)[0]
    assert post(part["url"], part["ticket"], token, context(secure)) == \
        (status, {"error": error, "message": "no credential given" if token is None
                  else "unknown credential"})


def test_an_altered_or_forged_ticket_is_refused(secure):
    """A ticket's request changed to another bucket or table (its signature kept), a ticket
    signed by nobody, and a ticket another server signed: each refused, nothing read."""
    parts = planned(secure)
    token, ctx = secure.options["token"], context(secure)
    part = parts[0]
    body, mac = part["ticket"].split(".")
    request = json.loads(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)))
    for change in ({"bucket": (request["scan"]["bucket"] + 1) % 4},
                   {"table_id": request["scan"]["table_id"] + 1}, {"columns": ["k"]}):
        altered = {**request, "scan": {**request["scan"], **change}}
        forged = base64.urlsafe_b64encode(
            json.dumps(altered, separators=(",", ":"), sort_keys=True).encode()).decode()
        status, answer = post(part["url"], f"{forged.rstrip('=')}.{mac}", token, ctx)
        assert (status, answer["error"]) == (403, "PermissionDeniedError"), change
        assert "not signed by this tablet server" in answer["message"]
    assert post(part["url"], "bm9uZQ.bm9uZQ", token, ctx)[0] == 403
    elsewhere = next(p for p in parts if p["url"] != part["url"])
    status, answer = post(elsewhere["url"], part["ticket"], token, ctx)
    assert (status, answer["error"]) == (403, "PermissionDeniedError")


def test_tls_is_required(secure):
    """Plaintext to the endpoint, a client trusting another CA, and one without a client
    certificate (mutual TLS) never get an answer."""
    part = planned(secure)[0]
    token = secure.options["token"]
    with pytest.raises((urllib.error.URLError, ConnectionError, OSError)):
        post(part["url"].replace("https://", "http://"), part["ticket"], token, None)
    with pytest.raises(urllib.error.URLError, match="CERTIFICATE_VERIFY_FAILED"):
        post(part["url"], part["ticket"], token, context(secure, ca=secure.rogue.ca_file))
    with pytest.raises((urllib.error.URLError, ConnectionError, OSError)):
        post(part["url"], part["ticket"], token, context(secure, client=False))


def test_a_refusal_reaches_spark_as_one_line(spark, secure):
    """The JVM side's own requests: an unknown token is refused by the endpoint, named with
    the table and the bucket; a TLS read given a plaintext endpoint never sends its token."""
    parts = planned(secure)
    reader = (spark.read.format("tally-jvm").schema("k bigint, v bigint")
              .option("table", secure.options["table"]).option("tls", "true")
              .option("tls.ca", secure.authority.ca_file)
              .option("tls.cert", secure.client[0]).option("tls.key", secure.client[1]))
    bad = reader.option("token", "not-a-token-of-this-cluster") \
        .option("parts", json.dumps([parts])).load()
    with pytest.raises(Exception) as refused:
        bad.collect()
    line = next(line for line in str(refused.value).splitlines()
                if "TallyReadException" in line)
    assert f"AuthenticationError: unknown credential (reading {secure.options['table']} " \
        "bucket" in line
    plain = [{**p, "url": p["url"].replace("https://", "http://")} for p in parts]
    downgraded = reader.option("token", secure.options["token"]) \
        .option("parts", json.dumps([plain])).load()
    with pytest.raises(Exception, match="a TLS read needs an https endpoint"):
        downgraded.collect()


def test_a_principal_without_read_is_refused(tmp_path):
    """Every client role includes read, so no real auth file holds such a principal: the
    endpoint is started here on its own with credentials whose one client has no role, to show
    the request is authorized by the role table (as do_get:scan) before the ticket is read."""
    from tally.server.credentials import Credentials
    from tally.server.metrics import ServerMetrics
    from tally.server.tablet.part_reads import PartReads

    tablets = types.SimpleNamespace(actions={}, metrics=ServerMetrics())
    endpoint = PartReads(tablets, "127.0.0.1", 0,
                         Credentials("c" * 20, {"nobody": ("t" * 20, "none")}))
    try:
        ticket = endpoint.tickets.sign({"scan": {"op": "scan"}, "cast": None})
        status, answer = post(endpoint.url, ticket, "t" * 20, None)
        assert (status, answer["error"]) == (403, "PermissionDeniedError")
        assert "may not call 'do_get:scan'" in answer["message"]
        assert "read_tickets" in tablets.actions
    finally:
        endpoint.close()


def test_only_a_post_of_a_ticket_is_served(secure):
    part = planned(secure)[0]
    token, ctx = secure.options["token"], context(secure)
    status, answer = post(part["url"].replace("/part", "/other"), part["ticket"], token, ctx)
    assert (status, answer["error"]) == (400, "InvalidInputError")
    request = urllib.request.Request(part["url"], method="GET",
                                     headers={"authorization": f"Bearer {token}"})
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, context=ctx, timeout=60)
    assert refused.value.code == 400
    assert "POST /part" in json.loads(refused.value.read())["message"]

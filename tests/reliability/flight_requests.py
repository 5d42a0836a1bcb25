"""Malformed Flight requests for the fuzz test: hypothesis strategies and a raw sender.

Every request drawn here must be refused: it starts from a well-formed request (a real table,
bucket, owner and lease, so the server's checks run deep) and then breaks at least one thing the
protocol requires. Breakages are chosen so that each one alone makes the request invalid, in any
combination: a required field dropped or of another JSON type, a value outside its domain
(unknown operation, bucket out of range, malformed name), rows for another bucket or partition,
null or missing keys, unknown columns, uncastable column types, a batch over the server's size
limit, garbage bytes, unknown action names, a request sent to a server that does not host the
bucket. Valid-but-harmless requests (a read of an unknown id, a no-op delete) are never drawn,
so "refused with a typed error" can be asserted for every example.

`Context` holds the facts of the cluster the strategies build on; `Request` is one raw call
(sent by tests/reliability/test_flight_fuzz.py with a plain pyarrow.flight client).
"""

from __future__ import annotations

import dataclasses
import json
import re

import numpy as np
import pyarrow as pa
from hypothesis import strategies as st

from tally.wire.bucket_hash import bucket_ids

NAME_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_\-]{0,127}")
MERGE_MODES = {"AGGREGATE", "MERGE_STATE", "OVERWRITE"}
OVERSIZE = 7 << 20          # above the cluster's 6 MiB --max-batch-bytes
NO_BODY_ACTIONS = ["ping", "list_databases", "list_servers", "server_id", "enforce_retention"]


@dataclasses.dataclass
class Bucket:
    partition: str | None
    partition_id: int
    bucket: int
    address: str                  # the tablet server hosting it
    keys: list[int]               # values of `k` that hash to this bucket


@dataclasses.dataclass
class Context:
    coordinator: str
    tablets: list[str]
    table: str                    # the partitioned workload table (tests/cluster/workload.py)
    table_id: int
    buckets: list[Bucket]
    lease: dict                   # a live lease of `owner` on the table's `label` column
    owner: str
    descriptor_json: str          # a valid descriptor, for create_table bases
    view: dict                    # the table's lock view as the coordinator pushes it

    def header(self, b: Bucket, op: str) -> dict:
        return {"op": op, "table_id": self.table_id, "partition_id": b.partition_id,
                "bucket": b.bucket}


class Request:
    """One raw call. A plain class with a short repr: hypothesis prints failing examples, and
    an oversized body must not flood the report."""

    def __init__(self, address: str, call: str, name: str, body: bytes, rows: pa.Table | None,
                 why: list[str]) -> None:
        self.address = address
        self.call = call          # "action", "put" or "get"
        self.name = name          # the action type ("" for put/get)
        self.body = body          # action body, DoPut descriptor command, or DoGet ticket
        self.rows = rows
        self.why = why

    def _repr_pretty_(self, printer, cycle) -> None:
        printer.text(repr(self))

    def __repr__(self) -> str:
        body = self.body if len(self.body) <= 300 else self.body[:300] + b"..."
        rows = "" if self.rows is None else f", rows={self.rows.schema.names} x{self.rows.num_rows}"
        return f"Request({self.call} {self.name!r} to {self.address}, why={self.why}, " \
               f"body={body!r}{rows})"


def bucket_keys(routing, bucket: int, count: int = 8) -> list[int]:
    """`count` values of k whose rows land in `bucket` (the client's bucket function)."""
    candidates = pa.table({"k": pa.array(range(5000), pa.int64())})
    hits = np.flatnonzero(bucket_ids(candidates, list(routing.bucket_key),
                                     routing.bucket_count) == bucket)
    return hits[:count].tolist()


# --- values -------------------------------------------------------------------------------------

scalars = st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70),
                    st.floats(allow_nan=True), st.text(max_size=12))
json_values = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=6), inner, max_size=3)),
    max_leaves=6)
texts = st.text(max_size=30)
lists = st.lists(json_values, min_size=1, max_size=3)
dicts = st.dictionaries(st.text(max_size=6), json_values, max_size=3)

# A value of every JSON type except the one a field must have (never coercible: "1", 1.0 and
# true are not integers, 1 is not a string).
WRONG_TYPE = {
    "int": st.one_of(texts, st.floats(), st.booleans(), lists, dicts, st.none()),
    "str": st.one_of(st.integers(), st.floats(), st.booleans(), lists, dicts, st.none()),
    "list": st.one_of(texts, st.integers(), st.floats(), st.booleans(), dicts, st.none()),
    "obj": st.one_of(texts, st.integers(), st.floats(), st.booleans(), lists, st.none()),
    "number": st.one_of(texts, st.booleans(), lists, dicts, st.none()),
}
bad_names = texts.filter(lambda s: not NAME_RE.fullmatch(s))
bad_table_names = st.one_of(bad_names, st.builds(lambda a, b: f"{a}.{b}", bad_names, texts),
                            texts.filter(lambda s: s.count(".") != 1))
BAD_DESCRIPTORS = ["{not json", "[]", '{"schema": 3}', '{"schema": {"columns": []}}', "",
                   '{"schema": {"columns": [{"name": "a", "type": "int64"}]}}']

# Field kinds: the JSON type a field must have, and values of the right type that are invalid.
DOMAIN = {
    "name": bad_names,
    "table": bad_table_names,
    "descriptor": st.sampled_from(BAD_DESCRIPTORS),
    "columns": st.one_of(st.lists(st.one_of(st.integers(), st.none(), lists), min_size=1,
                                  max_size=3), st.just([]), st.just(["k"])),
    "buckets": st.lists(st.one_of(texts, st.integers(), st.lists(texts, max_size=3)),
                        min_size=1, max_size=3),
    "bucket_ids": st.one_of(st.just([]), st.lists(st.one_of(
        texts, st.integers(max_value=-1), st.floats(), st.booleans(), st.none(), lists),
        min_size=1, max_size=3)),
    "table_ids": st.lists(st.one_of(texts, st.floats(), st.none(), dicts), min_size=1,
                          max_size=3),
    "problems": st.lists(st.one_of(st.integers(), st.floats(), st.none(), dicts), min_size=1,
                         max_size=3),
    "count": st.one_of(st.integers(max_value=-1), st.integers(min_value=2**63)),
    "seconds": st.floats(max_value=-0.001, allow_infinity=False),
}
JSON_TYPE = {"name": "str", "table": "str", "descriptor": "str", "str": "str", "int": "int",
             "columns": "list", "buckets": "list", "bucket_ids": "list", "table_ids": "list",
             "lease": "obj", "view": "obj", "offsets": "list", "problems": "list", "count": "int",
             "seconds": "number"}


def action_fields(ctx: Context, role: str, name: str) -> dict[str, tuple[str, object, bool]]:
    """{field: (kind, well-formed value, required)} of an action's JSON body. Unrequired
    fields are only ever given a wrong type, never dropped."""
    b = ctx.buckets[0]
    table, lease = ("table", ctx.table, True), ("lease", ctx.lease, True)
    specs = {
        ("coordinator", "create_database"): {"name": ("name", "fuzz_db", True)},
        ("coordinator", "drop_database"): {"name": ("name", "default", True)},
        ("coordinator", "create_table"): {"name": ("table", "default.fuzz_new", True),
                                          "descriptor": ("descriptor", ctx.descriptor_json, True)},
        ("coordinator", "drop_table"): {"name": table},
        ("coordinator", "list_tables"): {"database": ("name", "default", True)},
        ("coordinator", "table_info"): {"name": table},
        ("coordinator", "create_partition"): {"name": table, "partition": ("str", "apac", True),
                                              "table_id": ("int", ctx.table_id, False)},
        ("coordinator", "drop_partition"): {"name": table, "partition": ("str", "eu", True)},
        ("coordinator", "list_partitions"): {"name": table},
        ("coordinator", "list_offsets"): {"name": table,
                                          "table_id": ("int", ctx.table_id, False)},
        ("coordinator", "bucket_info"): {"table_id": ("int", ctx.table_id, True),
                                         "partition_id": ("int", b.partition_id, True),
                                         "bucket": ("int", 0, True)},
        ("coordinator", "heartbeat"): {"server_id": ("str", "ts-fuzz", True),
                                       "address": ("str", "grpc://127.0.0.1:9", True),
                                       "table_ids": ("table_ids", [], False),
                                       "problems": ("problems", [], False)},
        ("coordinator", "truncate_log"): {"name": table, "partition": ("str", "eu", False),
                                          "bucket": ("int", 0, True),
                                          "before": ("int", 1, True)},
        ("coordinator", "lock_acquire"): {"table": table, "owner_id": ("str", "fuzz-2", True),
                                          "columns": ("columns", ["total"], True)},
        ("coordinator", "lock_renew"): {"lease": lease},
        ("coordinator", "lock_release"): {"lease": lease},
        ("coordinator", "register_attempt"): {"lease": lease, "bucket": ("int", 0, True)},
        ("coordinator", "register_attempts"): {"lease": lease,
                                               "buckets": ("bucket_ids", [0], True)},
        ("coordinator", "lock_describe"): {"table": table},
        ("coordinator", "lock_view"): {"table_id": ("int", ctx.table_id, True)},
        ("coordinator", "commit"): {"lease": lease, "epoch": ("int", 1, True),
                                    "offsets": ("offsets", [], True)},
        ("coordinator", "last_commit"): {"table": table, "owner_id": ("str", ctx.owner, True)},
        ("coordinator", "epoch_baseline"): {"lease": lease, "epoch": ("int", 1, True)},
        ("coordinator", "epoch_begin"): {"lease": lease, "epoch": ("int", 1, True),
                                         "buckets": ("bucket_ids", [0], True)},
        ("coordinator", "retention_floor"): {"table_id": ("int", ctx.table_id, True)},
        ("coordinator", "lock_take_over"): {"table": table, "owner_id": ("str", "fuzz-3", True),
                                            "columns": ("columns", ["total"], True)},
        ("coordinator", "lock_discard"): {"table": table, "owner_id": ("str", "fuzz-4", True)},
        ("coordinator", "undo_baselines"): {"lease": lease},
        ("coordinator", "undo_report"): {"name": table, "table_id": ("int", ctx.table_id, False),
                                         "keys_restored": ("count", 1, True),
                                         "keys_deleted": ("count", 0, True),
                                         "records_scanned": ("count", 1, True),
                                         "seconds": ("seconds", 0.5, True)},
        ("coordinator", "consumer_commit"): {"name": table, "consumer": ("str", "fuzz-c", True),
                                             "positions": ("offsets", [[b.partition, b.bucket, 0]],
                                                           True)},
        ("coordinator", "consumer_positions"): {"name": table},
        ("coordinator", "consumer_remove"): {"name": table, "consumer": ("str", ctx.owner, True)},
        ("coordinator", "consumer_floor"): {"table_id": ("int", ctx.table_id, True)},
        ("tablet", "offsets"): {"table_id": ("int", ctx.table_id, True),
                                "buckets": ("buckets", [[b.partition_id, b.bucket]], True)},
        ("tablet", "drop_tablets"): {"table_id": ("int", ctx.table_id, True)},
        ("tablet", "install_lock_view"): {"view": ("view", ctx.view, True)},
        ("tablet", "truncate_bucket_log"): {"table_id": ("int", ctx.table_id, True),
                                     "partition_id": ("int", b.partition_id, True),
                                     "bucket": ("int", b.bucket, True),
                                     "before": ("int", 1, True)},
    }
    return specs[(role, name)]


COORDINATOR_ACTIONS = ["create_database", "drop_database", "create_table", "drop_table",
                       "list_tables", "table_info", "create_partition", "drop_partition",
                       "list_partitions", "list_offsets", "bucket_info", "heartbeat",
                       "truncate_log", "lock_acquire", "lock_renew", "lock_release",
                       "register_attempt", "register_attempts",
                       "lock_describe", "lock_view", "commit", "last_commit", "epoch_baseline",
                       "epoch_begin",
                       "retention_floor", "lock_take_over", "lock_discard", "undo_baselines",
                       "undo_report",
                       "consumer_commit", "consumer_positions", "consumer_remove",
                       "consumer_floor"]
TABLET_ACTIONS = ["offsets", "drop_tablets", "install_lock_view", "truncate_bucket_log"]
KNOWN = set(COORDINATOR_ACTIONS) | set(TABLET_ACTIONS) | set(NO_BODY_ACTIONS) | {"lookup"}


def dumps(value) -> bytes:
    return json.dumps(value).encode()


garbage = st.one_of(st.binary(min_size=1, max_size=64),
                    st.sampled_from([b"{", b'{"a":', b"\xff\xfe", b"[1,", b"nul", b"{}}"]))
non_object_json = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), texts,
                            st.lists(json_values, max_size=3)).map(dumps)
not_a_json_object = st.one_of(garbage, non_object_json)


# --- actions ------------------------------------------------------------------------------------


@st.composite
def broken_body(draw, fields: dict[str, tuple[str, object, bool]]) -> tuple[dict, list[str]]:
    """A body of well-formed `fields` with 1-2 of them dropped or given a wrong value."""
    body = {name: value for name, (_, value, _) in fields.items()}
    breakable = [n for n, (kind, _, required) in fields.items()]
    names = draw(st.lists(st.sampled_from(breakable), min_size=1, max_size=2, unique=True))
    why = []
    for name in names:
        kind, _, required = fields[name]
        ways = ["wrong type"] + (["drop"] if required else []) + \
            (["bad value"] if kind in DOMAIN else [])
        way = draw(st.sampled_from(ways))
        if way == "drop":
            del body[name]
        elif way == "wrong type":
            body[name] = draw(WRONG_TYPE[JSON_TYPE[kind]])
        else:
            body[name] = draw(DOMAIN[kind])
        why.append(f"{name}: {way}")
    return body, why


@st.composite
def action_requests(draw, ctx: Context) -> Request:
    """A DoAction that must be refused: unknown name, unparsable body, or a broken body."""
    role = draw(st.sampled_from(["coordinator", "tablet"]))
    address = ctx.coordinator if role == "coordinator" else draw(st.sampled_from(ctx.tablets))
    known = COORDINATOR_ACTIONS if role == "coordinator" else TABLET_ACTIONS
    kind = draw(st.sampled_from(["unknown action", "no-body action", "garbage body",
                                 "broken body", "broken body", "broken body", "oversized"]))
    if kind == "unknown action":
        name = draw(st.one_of(texts, st.sampled_from(known).map(str.upper)).filter(
            lambda s: s not in KNOWN))
        body = draw(st.one_of(st.just(b"{}"), not_a_json_object, dicts.map(dumps)))
        return Request(address, "action", name, body, None, [kind])
    if kind == "no-body action":
        name = draw(st.sampled_from(NO_BODY_ACTIONS))
        body = draw(not_a_json_object)
        return Request(address, "action", name, body, None, [kind])
    name = draw(st.sampled_from(known))
    if kind == "garbage body":
        return Request(address, "action", name, draw(not_a_json_object), None, [kind])
    fields = action_fields(ctx, role, name)
    if kind == "oversized":  # a 1-8 MB value in a field: the refusal must still arrive typed
        field = draw(st.sampled_from(sorted(n for n, f in fields.items() if f[0] != "str")))
        body = {n: v for n, (_, v, _) in fields.items()}
        body[field] = "\u00e9" * draw(st.integers(1 << 19, 4 << 20))
        return Request(address, "action", name, dumps(body), None, [f"{field}: oversized"])
    body, why = draw(broken_body(fields))
    return Request(address, "action", name, dumps(body), None, why)

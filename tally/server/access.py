"""Who may make which call: the one table of required roles, and the check against it.

Every call a Tally server answers is named here: each DoAction by its name, each DoPut and DoGet
by its op (`do_put:put`, `do_get:scan`, ...). A server refuses to start with an action that has
no row (so a new action cannot be served before someone decided who may call it), and the
access test walks this table over every principal.

Roles are ordered for clients, `read` < `write` < `admin`: each includes the ones before it.
`cluster` is the servers' own credential: it may make every call, and it is the only one
that may make the internal ones (lock views, heartbeats, bucket facts, a tablet server's drop
and truncate), which a client never needs and which would let a client bypass the checks the
public actions make.
"""

from __future__ import annotations

from locks import ownership
from tally.errors import PermissionDeniedError

READ, WRITE, ADMIN, CLUSTER = "read", "write", "admin", "cluster"
CLIENT_ROLES = (READ, WRITE, ADMIN)
_RANK = {READ: 1, WRITE: 2, ADMIN: 3}

# call -> the role it requires (see the module docstring for how roles include each other)
REQUIRED_ROLE: dict[str, str] = {
    # every server
    "ping": READ,
    # the coordinator: catalog
    "list_databases": READ,
    "list_tables": READ,
    "table_info": READ,
    "list_partitions": READ,
    "list_offsets": READ,
    "list_servers": READ,
    "bucket_replicas": READ,
    "create_partition": WRITE,  # a write to a new partition value creates it (dynamic)
    "create_database": ADMIN,
    "drop_database": ADMIN,
    "create_table": ADMIN,
    "add_column": ADMIN,
    "drop_table": ADMIN,
    "drop_partition": ADMIN,
    # rollups are tables: made, dropped and built by whoever may create tables
    "create_rollup": ADMIN,
    "drop_rollup": ADMIN,
    "rollup_ready": ADMIN,
    "rollup_reset": ADMIN,
    "list_rollups": READ,
    "rollup_epochs_in_flight": READ,
    "truncate_log": ADMIN,
    "move_leader": ADMIN,
    "restore_bucket": ADMIN,  # rebuilds a bucket whose copies are all gone from remote snapshots
    "bucket_snapshots": READ,
    # the coordinator: locks, commits, baselines
    "lock_describe": READ,
    "last_commit": READ,
    "lock_acquire": WRITE,
    "lock_renew": WRITE,
    "lock_release": WRITE,
    "lock_take_over": WRITE,
    "undo_baselines": WRITE,
    "register_attempt": WRITE,
    "register_attempts": WRITE,
    "commit": WRITE,
    "commit_together": WRITE,
    "epoch_baseline": WRITE,
    "epoch_begin": WRITE,
    "epoch_abort": WRITE,
    "lock_discard": ADMIN,  # keeps another owner's uncommitted writes for good
    "lock_reassign": ADMIN,  # hands an owner id to another principal
    "undo_report": WRITE,  # what an undo did, for the metrics: who may undo may report it
    # the coordinator: changelog consumers
    "consumer_positions": READ,
    # a consumer is a reader: registering its position changes no data, only what retention
    # keeps (bounded by table.log.retention.consumer-ms), so a read-only token may stream
    "consumer_commit": READ,
    # lets retention drop what that consumer has not read: its own principal's or an admin's
    # (the owner table below)
    "consumer_remove": READ,
    # the coordinator: the lake
    "lake_status": READ,
    "lake_stable_offsets": READ,
    "lake_setup": READ,  # the lake directory, deltalake and the tiering processes heard from
    "set_table_options": ADMIN,
    # a tiering process decides what the lake shows and holds retention for it: operators'
    "tier_heartbeat": ADMIN,
    "tier_report": ADMIN,
    # the coordinator: asked by tablet servers only
    "heartbeat": CLUSTER,
    "bucket_info": CLUSTER,
    "lock_view": CLUSTER,
    "retention_floor": CLUSTER,
    "consumer_floor": CLUSTER,
    "server_buckets": CLUSTER,
    "alter_isr": CLUSTER,  # only a bucket's current leader may change its in-sync set
    "snapshot_register": CLUSTER,  # only a bucket's current leader may register its uploads
    # tablet servers: rows
    "lookup": READ,
    "lookup_many": READ,
    "do_get:scan": READ,
    "do_get:prefix_lookup": READ,  # the rows under a key prefix, a range of one bucket
    "read_tickets": READ,  # signs part tickets for HTTP reads, each a do_get:scan again
    "do_get:changelog": READ,
    "do_put:put": WRITE,
    "do_put:delete": WRITE,
    "do_put:undo": WRITE,  # a refused flush takes back its own applied parts
    "assign_ids": WRITE,  # a dictionary's insert-if-absent: new keys get ids (a write)
    # tablet servers: asked by the coordinator only
    "offsets": CLUSTER,
    "drop_tablets": CLUSTER,
    "install_lock_view": CLUSTER,
    "truncate_bucket_log": CLUSTER,
    "enforce_retention": CLUSTER,
    "expire_rows": CLUSTER,
    "reopen_tablets": CLUSTER,
    "resign_leadership": CLUSTER,  # the coordinator moves a bucket's leadership away
    "server_id": CLUSTER,
    "upload_snapshots": CLUSTER,
    "restore_bucket_copy": CLUSTER,
    # tablet servers: asked by the coordinator and by other tablet servers (followers)
    "replicas_changed": CLUSTER,
    "replica_fetch": CLUSTER,
    "replica_epoch_end": CLUSTER,
    "replica_digest": CLUSTER,
}


class Principal:
    """Who a call comes from: a name for messages and logs, a role, the id owner ids and
    consumer names are claimed under (the auth file's client name; None for the servers), and
    the auth file's grants of owner-id and consumer-name patterns (`locks.ownership`)."""

    __slots__ = ("name", "role", "id", "grants")

    def __init__(self, name: str, role: str, id: str | None = None,
                 grants: ownership.Grants = ownership.NO_GRANTS) -> None:
        self.name = name
        self.role = role
        self.id = id
        self.grants = grants

    def __repr__(self) -> str:
        return f"Principal({self.name!r}, {self.role!r})"


# Without credentials a server trusts every caller that can reach it: the loopback default.
TRUSTED = Principal("anyone (no credentials configured)", CLUSTER)


def allows(role: str, required: str) -> bool:
    """Whether a principal of `role` may make a call that requires `required`."""
    if role == CLUSTER:
        return True
    if required == CLUSTER:
        return False
    return _RANK.get(role, 0) >= _RANK[required]


def authorize(principal: Principal, call: str) -> None:
    """Raise PermissionDeniedError unless `principal` may make `call` (unknown calls are
    refused too: what has no row in the table is served to nobody)."""
    required = REQUIRED_ROLE.get(call)
    if required is None:
        raise PermissionDeniedError(f"call {call!r} has no required role: refused to everyone")
    if not allows(principal.role, required):
        raise PermissionDeniedError(
            f"{principal.name} (role {principal.role}) may not call {call!r}: it requires "
            f"role {required}; nothing was changed")


def unlisted(calls) -> list[str]:
    """The calls among `calls` that have no required role (a server refuses to serve them)."""
    return sorted(c for c in calls if c not in REQUIRED_ROLE)


def role_table_markdown() -> str:
    """The role table as the security page prints it (a test keeps the two equal)."""
    principals = list(CLIENT_ROLES) + [CLUSTER]
    lines = ["| call | requires | " + " | ".join(principals) + " |",
             "| --- | --- | " + " | ".join("---" for _ in principals) + " |"]
    for call, required in REQUIRED_ROLE.items():
        marks = " | ".join("yes" if allows(p, required) else "no" for p in principals)
        lines.append(f"| `{call}` | {required} | {marks} |")
    return "\n".join(lines)


def owner_table_markdown() -> str:
    """Who may do what to whose lock and consumer position (the ownership rules joined with the
    role table), as the security page prints it (a test keeps the two equal)."""
    # the rows for writes under a lease are DoPuts: their role is a put's
    return ownership.table_markdown(
        allows, lambda call: REQUIRED_ROLE.get(call) or REQUIRED_ROLE["do_put:put"])

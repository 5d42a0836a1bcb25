"""The `tally` commands that ask a running cluster: `servers`, `buckets`, `locks` and
`restore`.

Each command connects with the client when it runs, so `tally --help` loads none of it.
"""

from __future__ import annotations

import argparse

from tally.cli.connect_args import add_connection_arguments, open_connection
from tally.cli.output import FORMATS, emit, header_for
from tally.errors import InvalidOptionError


def cmd_servers(args: argparse.Namespace) -> int:
    """Print the tablet servers a coordinator knows: liveness, address, and for a live server
    that reports problems (a bucket whose disk is full, ...) UNHEALTHY and each problem; and
    the bucket copies on each server that are out of their in-sync set."""
    with open_connection(args) as conn:
        servers = conn.admin.list_servers()
    rows = [(s["server_id"], "DOWN" if not s["live"] else "live" if s["healthy"] else
             "UNHEALTHY", s["address"] or "", "; ".join(s["problems"]),
             "; ".join(s.get("out_of_sync", []))) for s in servers]
    if not rows and args.format == "table":
        print("no tablet servers")
        return 0
    emit(header_for(("SERVER", "STATE", "ADDRESS", "PROBLEMS", "OUT OF SYNC"), args.format),
         rows, args.format)
    return 0


def cmd_buckets(args: argparse.Namespace) -> int:
    """Print who holds each bucket of a table: leader, replicas, in-sync replicas, epoch; a
    bucket with copies out of sync is marked, one without a live in-sync copy is OFFLINE."""
    with open_connection(args) as conn:
        replicas = conn.admin.bucket_replicas(args.table)
    rows = []
    for (partition, bucket), r in sorted(replicas.items(), key=lambda kv: (kv[0][0] or "",
                                                                           kv[0][1])):
        state = "OFFLINE" if r["leader"] is None else \
            "ok" if len(r["isr"]) == len(r["replicas"]) else "UNDER-REPLICATED"
        rows.append((partition or "", bucket, r["leader"] or "", ",".join(r["replicas"]),
                     ",".join(r["isr"]), r["leader_epoch"], state))
    emit(header_for(("PARTITION", "BUCKET", "LEADER", "REPLICAS", "IN SYNC", "EPOCH", "STATE"),
                    args.format), rows, args.format)
    return 0


def cmd_restore(args: argparse.Namespace) -> int:
    """Restore a bucket whose every copy is gone from the remote directory; print what was
    restored and what was lost (exit status 0 either way: the loss is reported, not an
    error of the command)."""
    with open_connection(args) as conn:
        answer = conn.admin.restore_bucket(args.table, args.bucket, partition=args.partition,
                                           server=args.server)
    print(answer["message"])
    return 0


def cmd_move_leader(args: argparse.Namespace) -> int:
    """Hand a bucket's leadership to a live in-sync replica (default: the preferred one)."""
    with open_connection(args) as conn:
        moved = conn.admin.move_leader(args.table, args.bucket, partition=args.partition,
                                       to=args.to)
    print(f"bucket {args.bucket} of {args.table} is led by {moved['leader']} under epoch "
          f"{moved['leader_epoch']}")
    return 0


def cmd_locks(args: argparse.Namespace) -> int:
    """Print the column locks of one table, or of every table; or discard an expired one."""
    with open_connection(args) as conn:
        if args.discard:
            if not args.table:
                raise InvalidOptionError("--discard OWNER needs the table: tally locks TABLE "
                                         "--discard OWNER")
            found = conn.locks.discard(args.table, args.discard)
            print(f"discarded the expired lock of '{args.discard}' on {args.table}; its writes "
                  "since its last commit stay as they are" if found else
                  f"no lock of '{args.discard}' on {args.table}")
            return 0
        if args.reassign or args.to:
            if not (args.table and args.reassign and args.to):
                raise InvalidOptionError("--reassign OWNER needs the table and --to CLIENT: "
                                         "tally locks TABLE --reassign OWNER --to CLIENT")
            done = conn.locks.reassign(args.table, args.reassign, args.to)
            print(f"owner id '{args.reassign}' on {args.table} now belongs to client "
                  f"'{args.to}' (before: {done['before'] or 'nobody'})")
            return 0
        if args.table:
            tables = [args.table]
        else:
            tables = [f"{db}.{t}" for db in conn.admin.list_databases()
                      for t in conn.admin.list_tables(db)]
        rows = []
        for table in tables:
            # Expired locks are shown too: until recovered they keep their columns closed.
            for lock in conn.locks.describe(table, include_expired=True):
                offsets = " ".join(f"{p + '/' if p else ''}{b}:{o}"
                                   for p, b, o in lock["initial_offsets"])
                state = "EXPIRED (unrecovered)" if lock["expired"] else \
                    f"{lock['expires_in']:.1f}s"
                rows.append((table, lock["owner_id"], ",".join(lock["columns"]), state,
                             lock["token"], offsets))
    if not rows and args.format == "table":
        print("no column locks")
        return 0
    emit(header_for(("TABLE", "OWNER", "COLUMNS", "EXPIRES IN", "TOKEN", "INITIAL OFFSETS"),
                 args.format), rows, args.format)
    return 0


def add_commands(commands, common: argparse.ArgumentParser) -> None:
    """Add the cluster commands to `tally`'s subparsers (`common`: the shared --verbose)."""
    servers = commands.add_parser("servers", parents=[common],
                                  help="list a cluster's tablet servers")
    servers.add_argument("--format", choices=FORMATS, default="table")
    add_connection_arguments(servers)
    servers.set_defaults(func=cmd_servers)

    buckets = commands.add_parser("buckets", parents=[common],
                                  help="show each bucket's leader, replicas, in-sync replicas "
                                       "and leader epoch")
    buckets.add_argument("table", help="'<database>.<table>'")
    buckets.add_argument("--format", choices=FORMATS, default="table")
    add_connection_arguments(buckets)
    buckets.set_defaults(func=cmd_buckets)

    restore = commands.add_parser("restore", parents=[common],
                                  help="rebuild a bucket whose every copy is gone from its "
                                       "remote snapshot and log segments (admin)")
    restore.add_argument("table", help="'<database>.<table>'")
    restore.add_argument("--bucket", type=int, required=True)
    restore.add_argument("--partition", help="the partition (partitioned tables)")
    restore.add_argument("--server", metavar="ID",
                         help="the live tablet server to restore it on (default: the least "
                              "loaded)")
    add_connection_arguments(restore)
    restore.set_defaults(func=cmd_restore)

    move = commands.add_parser("move-leader", parents=[common],
                               help="hand a bucket's leadership to a live in-sync replica")
    move.add_argument("table", help="'<database>.<table>'")
    move.add_argument("--bucket", type=int, required=True)
    move.add_argument("--partition", help="the partition (partitioned tables)")
    move.add_argument("--to", metavar="SERVER",
                      help="the server to lead (default: the bucket's first replica)")
    add_connection_arguments(move)
    move.set_defaults(func=cmd_move_leader)

    locks = commands.add_parser("locks", parents=[common],
                                help="show column locks: owner, columns, expiry, "
                                     "token, initial offsets (expired ones keep their "
                                     "columns closed until recovered or discarded)")
    locks.add_argument("table", nargs="?", help="'<database>.<table>' (default: every table)")
    locks.add_argument("--discard", metavar="OWNER",
                       help="drop OWNER's expired lock without undoing its uncommitted writes")
    locks.add_argument("--reassign", metavar="OWNER",
                       help="(admin) make owner id OWNER belong to the client named by --to")
    locks.add_argument("--to", metavar="CLIENT", help="the auth file client --reassign names")
    locks.add_argument("--format", choices=FORMATS, default="table")
    add_connection_arguments(locks)
    locks.set_defaults(func=cmd_locks)

"""The `tally` commands that ask a running cluster: `servers` and `locks`.

Each command connects with the client when it runs, so `tally --help` loads none of it.
"""

from __future__ import annotations

import argparse

from tally.cli.tls_source import add_tls_arguments, tls_files
from tally.cli.token_source import add_token_arguments, client_token
from tally.errors import InvalidOptionError


def cmd_servers(args: argparse.Namespace) -> int:
    """Print the tablet servers a coordinator knows: liveness, address, and for a live server
    that reports problems (a bucket whose disk is full, ...) UNHEALTHY and each problem."""
    from tally import client

    with client.connect(args.url, token=client_token(args), tls=tls_files(args)) as conn:
        for s in conn.admin.list_servers():
            state = "DOWN" if not s["live"] else "live" if s["healthy"] else "UNHEALTHY"
            print(f"{s['server_id']:<16}{state:<11}{s['address'] or ''}")
            for problem in s["problems"]:
                print(f"    {problem}")
    return 0


def cmd_locks(args: argparse.Namespace) -> int:
    """Print the column locks of one table, or of every table; or discard an expired one."""
    from tally import client

    with client.connect(args.url, token=client_token(args), tls=tls_files(args)) as conn:
        if args.discard:
            if not args.table:
                raise InvalidOptionError("--discard OWNER needs the table: tally locks TABLE "
                                         "--discard OWNER")
            found = conn.locks.discard(args.table, args.discard)
            print(f"discarded the expired lock of '{args.discard}' on {args.table}; its writes "
                  "since its last commit stay as they are" if found else
                  f"no lock of '{args.discard}' on {args.table}")
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
                             str(lock["token"]), offsets))
        if not rows:
            print("no column locks")
            return 0
        header = ("TABLE", "OWNER", "COLUMNS", "EXPIRES IN", "TOKEN", "INITIAL OFFSETS")
        widths = [max(len(r[i]) for r in rows + [header]) for i in range(len(header))]
        for r in [header] + rows:
            print("  ".join(v.ljust(w) for v, w in zip(r, widths)).rstrip())
    return 0


def add_commands(commands) -> None:
    """Add the cluster commands to `tally`'s subparsers."""
    servers = commands.add_parser("servers", help="list a cluster's tablet servers")
    servers.add_argument("--url", required=True, help="the coordinator's URL")
    add_token_arguments(servers)
    add_tls_arguments(servers)
    servers.set_defaults(func=cmd_servers)

    locks = commands.add_parser("locks", help="show column locks: owner, columns, expiry, "
                                               "token, initial offsets (expired ones keep their "
                                               "columns closed until recovered or discarded)")
    locks.add_argument("table", nargs="?", help="'<database>.<table>' (default: every table)")
    locks.add_argument("--url", required=True, help="the coordinator's URL")
    locks.add_argument("--discard", metavar="OWNER",
                       help="drop OWNER's expired lock without undoing its uncommitted writes")
    add_token_arguments(locks)
    add_tls_arguments(locks)
    locks.set_defaults(func=cmd_locks)

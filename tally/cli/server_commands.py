"""The server commands of `tally`: `serve`, `local-cluster` and `servers`.

Kept free of heavy imports (pyarrow, kazoo) so `tally --help` stays instant; each command
imports what it runs.
"""

from __future__ import annotations

import argparse
import os

from tally.server.settings import DEFAULT_MAX_BATCH_BYTES, DEFAULT_MEMORY_BUDGET
from tally.errors import InvalidOptionError
from tally.sizes import parse_size

ROLES = ("all", "coordinator", "tablet")


def _memory_budget(value: str) -> int:
    try:
        return parse_size("--memory-budget", value)
    except InvalidOptionError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def add_serve_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    parser.add_argument("--data-dir", required=True, help="where this server keeps its data")
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=0, help="port to bind (default: a free one)")
    parser.add_argument("--zookeeper", metavar="HOST:PORT[/CHROOT]",
                        help="keep metadata in ZooKeeper (default: embedded in the data dir)")
    parser.add_argument("--role", choices=ROLES, default="all",
                        help="all (default: coordinator + one tablet server), coordinator, tablet")
    parser.add_argument("--coordinator", metavar="URL",
                        help="the coordinator of a tablet server (not needed with --zookeeper)")
    parser.add_argument("--auth-token", default=os.environ.get("TALLY_AUTH_TOKEN"),
                        help="reject requests without this bearer token "
                             "(default: $TALLY_AUTH_TOKEN)")
    parser.add_argument("--max-batch-bytes", type=int, default=DEFAULT_MAX_BATCH_BYTES,
                        help="largest write request a tablet server accepts (default 64 MiB)")
    parser.add_argument("--memory-budget", default=DEFAULT_MEMORY_BUDGET, metavar="SIZE",
                        type=_memory_budget,
                        help="write memory shared by all buckets of a tablet server: half caps "
                             "their row buffers, half their RocksDB memtables, e.g. 512mb "
                             f"(default {DEFAULT_MEMORY_BUDGET})")
    parser.add_argument("--log-level", default="INFO")
    parser.add_argument("--lock-clock-file", metavar="PATH", help=argparse.SUPPRESS)  # tests
    return parser


def cmd_serve(args: argparse.Namespace) -> int:
    from tally.server.process import serve

    return serve(args)


def cmd_local_cluster(args: argparse.Namespace) -> int:
    """Run a LocalCluster in the foreground until Ctrl-C (a multi-process cluster on one box)."""
    import signal
    import threading

    from tally.server.local_cluster import LocalCluster

    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    with LocalCluster(args.data_dir, tablet_servers=args.tablet_servers,
                      zookeeper=args.zookeeper, auth_token=args.auth_token) as cluster:
        print(f"coordinator: {cluster.url}", flush=True)
        for handle in cluster.tablet_servers:
            print(f"tablet server {handle.info['server_id']}: {handle.address}", flush=True)
        print("Ctrl-C stops the cluster", flush=True)
        stop.wait()
    return 0


def cmd_servers(args: argparse.Namespace) -> int:
    """Print the tablet servers a coordinator knows, with their liveness."""
    from tally import client

    with client.connect(args.url, token=args.auth_token) as conn:
        for s in conn.admin.list_servers():
            print(f"{s['server_id']:<16}{'live' if s['live'] else 'DOWN':<6}{s['address'] or ''}")
    return 0


def cmd_locks(args: argparse.Namespace) -> int:
    """Print the column locks of one table, or of every table; or discard an expired one."""
    from tally import client

    with client.connect(args.url, token=args.auth_token) as conn:
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
    """Add the server commands to `tally`'s subparsers."""
    serve = commands.add_parser("serve", help="run a Tally server (coordinator and/or tablets)")
    add_serve_arguments(serve).set_defaults(func=cmd_serve)

    local = commands.add_parser("local-cluster",
                                help="run a coordinator and N tablet servers as local processes")
    local.add_argument("--data-dir", required=True)
    local.add_argument("--tablet-servers", type=int, default=2)
    local.add_argument("--zookeeper", metavar="HOST:PORT[/CHROOT]")
    local.add_argument("--auth-token", default=os.environ.get("TALLY_AUTH_TOKEN"))
    local.set_defaults(func=cmd_local_cluster)

    servers = commands.add_parser("servers", help="list a cluster's tablet servers")
    servers.add_argument("--url", required=True, help="the coordinator's URL")
    servers.add_argument("--auth-token", default=os.environ.get("TALLY_AUTH_TOKEN"))
    servers.set_defaults(func=cmd_servers)

    locks = commands.add_parser("locks", help="show column locks: owner, columns, expiry, "
                                               "token, initial offsets (expired ones keep their "
                                               "columns closed until recovered or discarded)")
    locks.add_argument("table", nargs="?", help="'<database>.<table>' (default: every table)")
    locks.add_argument("--url", required=True, help="the coordinator's URL")
    locks.add_argument("--discard", metavar="OWNER",
                       help="drop OWNER's expired lock without undoing its uncommitted writes")
    locks.add_argument("--auth-token", default=os.environ.get("TALLY_AUTH_TOKEN"))
    locks.set_defaults(func=cmd_locks)
